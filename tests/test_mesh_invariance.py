"""The same compressed model on one device and on a mesh of four, in float32.

In a subprocess with four virtual CPU devices (the device count is fixed before JAX starts),
:mod:`tests.mesh_invariance_worker` compresses a model the grouped tests do not use (discovered
GELU MLPs in ``nnx.Sequential``) one MLP at a time and grouped on one device, and with a mesh over
the four. A capture
split over the devices, or a sharded solve or refinement that computes something else than one
device does, shows as a difference far above rounding: the decoupling's sweeps and the
refinement's Adam steps amplify any change of rounding in their inputs (a capture split over the
devices gave 1.8e-2 for ``bsd`` and 6.8e-3 for refined ``prune``).
"""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
CASES = ("prune:1", "prune:0", "bsd:0", "auto:1")


@pytest.mark.slow  # a subprocess with 4 virtual devices compressing 4 MLPs 8 times: about a minute
def test_a_mesh_of_four_gives_the_one_device_model_in_float32(tmp_path):
    out = tmp_path / "out.npz"
    env = dict(os.environ, PYTHONPATH=str(HERE.parent), CASES=",".join(CASES))
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4".strip()
    run = subprocess.run([sys.executable, str(HERE / "mesh_invariance_worker.py"), str(out)], env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    result = np.load(out)
    assert int(result["devices"]) == 4
    for case in CASES:
        seq, one, mesh = (result[f"{case.replace(':', '-')}-{where}"] for where in ("seq", "one", "mesh"))
        assert one.dtype == np.float32
        for other, what in ((one, "grouped on one device"), (seq, "one MLP at a time")):
            rel = np.linalg.norm(mesh - other) / np.linalg.norm(other)
            assert rel <= 1e-5, (case, what, rel)
