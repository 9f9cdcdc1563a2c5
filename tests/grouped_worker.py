"""One process of the grouped-compression tests' multi-device runs (started by ``tests/test_grouped.py``).

``python tests/grouped_worker.py OUT [PROCESS_ID NUM_PROCESSES PORT]``: compresses the toy model of
``tests/grouped_toy.py`` with a mesh over every device (``XLA_FLAGS`` set by the caller gives
the devices), under ``jax.distributed`` when a process id is given, and writes the compressed
MLPs' outputs on the probe tokens to ``OUT`` (``.npz``). ``STATE_DIR`` in the environment: the
run's state directory.
"""

import os
import sys

import jax

jax.config.update("jax_enable_x64", True)
if len(sys.argv) > 2:
    process_id, count, port = (int(a) for a in sys.argv[2:5])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=count, process_id=process_id,
                               initialization_timeout=60)

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grouped_toy as toy  # noqa: E402

mesh = jax.sharding.Mesh(np.asarray(jax.devices()), ("blocks",))
method = os.environ.get("METHOD", "bsd")
model, report = toy.run(method, mesh=mesh, state_dir=os.environ.get("STATE_DIR") or None)
np.savez(sys.argv[1], outputs=toy.outputs(model), devices=len(jax.devices()), processes=jax.process_count(),
         group_devices=(report.mlps[0].group or {}).get("devices", 0))
print("done", jax.process_index(), report.mlps[0].group, flush=True)
