"""``SLOW_CASES`` (tests/conftest.py): the named cases of a module are marked ``slow``, and an entry
that names no collected case is an error. Checked by collecting a small test module written here,
under the suite's own conftest (``-p conftest``), in a subprocess."""

import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
MODULE = '''
import pytest

SLOW_CASES = {{{entries}}}


@pytest.mark.parametrize("x", [1, 2])
def test_case(x):
    pass


def test_other():
    pass
'''


def _collect(tmp_path, entries: str, marks: str, node: str = "") -> subprocess.CompletedProcess:
    (tmp_path / "test_module.py").write_text(MODULE.format(entries=entries))
    env = dict(os.environ, PYTHONPATH=str(HERE), JAXBSD_TEST_COMPILATION_CACHE="0")
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "conftest", "-p", "no:xdist",
                           "-p", "no:cacheprovider", "-o", "addopts=", "-m", marks, "--rootdir", str(tmp_path),
                           str(tmp_path / "test_module.py") + node], env=env, capture_output=True, text=True, cwd=tmp_path)


@pytest.mark.slow  # two subprocesses that start JAX
def test_named_cases_are_slow_and_a_stale_entry_is_an_error(tmp_path):
    default = _collect(tmp_path, '"test_case[2]", "test_other"', "not slow")
    assert default.returncode == 0, default.stdout + default.stderr
    assert "test_case[1]" in default.stdout and "test_case[2]" not in default.stdout
    assert "test_other" not in default.stdout
    slow = _collect(tmp_path, '"test_case[2]", "test_other"', "slow")
    assert "test_case[2]" in slow.stdout and "test_other" in slow.stdout and "test_case[1]" not in slow.stdout
    stale = _collect(tmp_path, '"test_case[3]"', "not slow")
    assert stale.returncode != 0 and "SLOW_CASES names no collected test: ['test_case[3]']" in stale.stdout + stale.stderr
    # One case named by node id: its slow sibling was not collected, and that is no stale entry.
    one = _collect(tmp_path, '"test_case[2]"', "", node="::test_case[1]")
    assert one.returncode == 0 and "test_case[1]" in one.stdout, one.stdout + one.stderr
