"""The persistent compilation cache: ``jb.enable_compilation_cache`` and the ``jaxbsd`` command's default.

The oracle for "the cache works" is JAX's own monitoring events in a second process: every compile
request of the same program is a persistent-cache hit, none a miss, and the first process left the
programs on disk.
"""

import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest
from jax.experimental.compilation_cache import compilation_cache

import jaxbsd as jb
from jaxbsd import cli
from jaxbsd.compile_cache import DISABLE_ENV, compilation_cache_dir, default_compilation_cache_dir

ROOT = pathlib.Path(__file__).resolve().parents[1]
_SETTINGS = ("jax_compilation_cache_dir", "jax_enable_compilation_cache",
             "jax_persistent_cache_min_compile_time_secs", "jax_persistent_cache_min_entry_size_bytes")


@pytest.fixture
def fresh_jax_cache(tmp_path, monkeypatch):
    """No compilation cache set, ``$JAXBSD_CACHE`` in ``tmp_path``; the suite's own cache afterwards."""
    saved = {name: getattr(jax.config, name) for name in _SETTINGS}
    monkeypatch.setenv("JAXBSD_CACHE", str(tmp_path / "jaxbsd-cache"))
    monkeypatch.delenv(DISABLE_ENV, raising=False)
    jax.config.update("jax_compilation_cache_dir", None)
    compilation_cache.reset_cache()
    yield tmp_path
    for name, value in saved.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()


def test_enable_sets_the_config(fresh_jax_cache):
    assert compilation_cache_dir() is None
    directory = jb.enable_compilation_cache()
    assert directory == (fresh_jax_cache / "jaxbsd-cache" / "xla").resolve() == default_compilation_cache_dir().resolve()
    assert directory.is_dir()
    assert jax.config.jax_compilation_cache_dir == str(directory)
    assert jax.config.jax_enable_compilation_cache
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
    assert jax.config.jax_persistent_cache_min_entry_size_bytes < 0
    assert compilation_cache_dir() == directory


def test_enable_is_idempotent_and_moves(fresh_jax_cache):
    first = jb.enable_compilation_cache(fresh_jax_cache / "a")
    assert jb.enable_compilation_cache(fresh_jax_cache / "a") == first
    assert jax.config.jax_compilation_cache_dir == str(first)
    other = jb.enable_compilation_cache(str(fresh_jax_cache / "b"))
    assert other == (fresh_jax_cache / "b").resolve() != first
    assert jax.config.jax_compilation_cache_dir == str(other)


def test_a_file_is_refused(fresh_jax_cache):
    path = fresh_jax_cache / "a-file"
    path.write_text("not a directory")
    with pytest.raises(ValueError, match="path .*a-file.*not a directory"):
        jb.enable_compilation_cache(path)
    assert jax.config.jax_compilation_cache_dir is None
    assert path.read_text() == "not a directory"


def _cli_error_run(argv, capsys):
    """Run a ``jaxbsd`` command that stops at its argument checks (after the cache is set up)."""
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2
    return capsys.readouterr().err


MISSING = ["compress", "--checkpoint", "/nonexistent/checkpoint"]


def test_cli_turns_it_on(fresh_jax_cache, capsys):
    err = _cli_error_run(MISSING, capsys)
    assert "--checkpoint" in err
    assert compilation_cache_dir() == (fresh_jax_cache / "jaxbsd-cache" / "xla").resolve()


@pytest.mark.parametrize("where", ["before", "after"])
def test_cli_no_cache(where, fresh_jax_cache, capsys):
    argv = ["--no-cache", *MISSING] if where == "before" else [*MISSING, "--no-cache"]
    _cli_error_run(argv, capsys)
    assert compilation_cache_dir() is None
    assert not (fresh_jax_cache / "jaxbsd-cache").exists()


@pytest.mark.parametrize("value", ["0", "off"])
def test_cli_env_turns_it_off(value, fresh_jax_cache, capsys, monkeypatch):
    monkeypatch.setenv(DISABLE_ENV, value)
    _cli_error_run(MISSING, capsys)
    assert compilation_cache_dir() is None


def test_cli_keeps_a_jax_cache_dir_set_for_jax(fresh_jax_cache, capsys):
    jax.config.update("jax_compilation_cache_dir", str(fresh_jax_cache / "jax-own"))
    _cli_error_run(MISSING, capsys)
    assert compilation_cache_dir() == (fresh_jax_cache / "jax-own").resolve()


def test_cli_unusable_cache_is_a_warning(fresh_jax_cache, capsys, monkeypatch):
    blocker = fresh_jax_cache / "blocker"
    blocker.write_text("")
    monkeypatch.setenv("JAXBSD_CACHE", str(blocker))  # $JAXBSD_CACHE/xla cannot be made under a file
    err = _cli_error_run(MISSING, capsys)
    assert "warning: compilation cache off" in err
    assert "--checkpoint" in err  # the command went on to its own error
    assert compilation_cache_dir() is None


def test_every_command_documents_no_cache():
    parser = cli.build_parser()
    for name, sub in parser.subcommands.choices.items():
        assert "--no-cache" in sub.format_help(), name


# A small jitted program, compiled in a fresh process with the cache in argv[1]; prints JAX's
# persistent-cache counters and the programs compiled.
_PROGRAM = """
import collections, json, sys
import jax, jax.numpy as jnp
counts = collections.Counter()
jax.monitoring.register_event_listener(lambda event, **kw: counts.update([event]))
import jaxbsd as jb
jb.enable_compilation_cache(sys.argv[1])
f = jax.jit(lambda x, w: jnp.tanh(x @ w).sum(axis=0))
print(json.dumps({"out": float(f(jnp.ones((16, 8)), jnp.full((8, 4), 0.1)).sum()), "counts": counts}))
"""


def _second_process(cache: pathlib.Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", DISABLE_ENV)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", _PROGRAM, str(cache)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_second_process_hits_the_cache(tmp_path):
    cache = tmp_path / "xla"
    first = _second_process(cache)
    c1 = first["counts"]
    requests = c1["/jax/compilation_cache/compile_requests_use_cache"]
    assert requests >= 1
    assert c1.get("/jax/compilation_cache/cache_misses", 0) >= 1
    entries = [p for p in cache.rglob("*") if p.is_file()]
    assert len(entries) >= 1
    second = _second_process(cache)
    c2 = second["counts"]
    assert second["out"] == first["out"]
    assert c2["/jax/compilation_cache/compile_requests_use_cache"] == requests
    assert c2.get("/jax/compilation_cache/cache_hits", 0) == requests
    assert c2.get("/jax/compilation_cache/cache_misses", 0) == 0
    assert sorted(p.name for p in cache.rglob("*") if p.is_file()) == sorted(p.name for p in entries)
