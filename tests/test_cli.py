"""The ``jaxbsd`` command's user errors: one line ``jaxbsd <command>: error: <message>`` on
stderr, exit status 2, no traceback, and nothing written.

Every case fails before any training or compilation: argument values are checked by argparse
and the validation step, files before anything is written. The flags that bound the work
(``--train-epochs 1``, ``--epochs 1``, ...) keep a regression that does not fail from running
for minutes.
"""

import dataclasses
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from jaxbsd import cli
from jaxbsd.checkpoint import save_checkpoint
from jaxbsd.cli.args import one_line
from jaxbsd.models import build_model, config_for_dataset

#: Tests and parametrized cases run in the slow step only (tests/conftest.py marks them): this file's
#: costliest programs, moved to keep the default run's time; cheaper cases of the same claims stay.
SLOW_CASES = {
    "test_console_command[library]",
}


REPO = pathlib.Path(__file__).resolve().parents[1]
# Cheap settings for the cases that get past the argument checks.
COMPRESS = ["compress", "--no-progress", "--train-epochs", "1", "--finetune-epochs", "0", "--max-iter", "1"]
TRAIN = ["train", "--no-progress", "--epochs", "1"]


def run_error(argv, capsys, command):
    """Run ``main(argv)``; assert a one-line user error of ``command``; return the line."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"jaxbsd {command}: error: "), lines[0]
    return lines[0]


def snapshot(root: pathlib.Path) -> dict[str, bytes | None]:
    """Every file (bytes) and directory (None) under ``root``, by relative path."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def tiny_model():
    # The digits input and classes at the tiny ViT's width and depth: fewer parameter shapes to initialise.
    config = dataclasses.replace(config_for_dataset("vit", "digits"), dim=16, depth=2, num_heads=2, mlp_dim=32)
    return build_model("vit", config, seed=0)


@pytest.fixture
def corrupt_file(tmp_path):
    """Random bytes where a checkpoint (a directory) is expected."""
    path = tmp_path / "corrupt"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    return path


@pytest.fixture
def corrupt_checkpoint(tmp_path, tiny_model):
    """A real checkpoint with every file cut to half its length."""
    path = save_checkpoint(tmp_path / "damaged", tiny_model)
    files = [p for p in pathlib.Path(path).rglob("*") if p.is_file() and p.stat().st_size > 1]
    assert files
    for p in files:
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    return path


@pytest.fixture
def earlier_out(tmp_path):
    """An --out with files in it (the bad-value cases fail before they read any of it)."""
    out = tmp_path / "earlier"
    (out / "state").mkdir(parents=True)
    (out / "state" / "steps.json").write_text('{"steps": []}')
    (out / "compression.json").write_text('{"from": "an earlier run"}')
    return out


@pytest.fixture
def other_run(tmp_path, tiny_model):
    """An --out holding the state of a different compression run (another run id)."""
    out = tmp_path / "other-run"
    save_checkpoint(out / "state" / "model", tiny_model, {"run_id": "0" * 16, "steps": []})
    (out / "compression.json").write_text('{"from": "the other run"}')
    return out


# --- bad values: argparse types, mutually exclusive flags, the validation step ---------------

@pytest.mark.parametrize("argv, expect", [
    (["--rank", "-3"], "--rank"),
    (["--rank", "abc"], "--rank"),
    (["--rank", "4", "--reduction", "0.5"], "not allowed with"),
    (["--reduction", "1.5"], "--reduction"),
    (["--train-epochs", "0"], "--train-epochs"),
    (["--train-lr", "-1"], "--train-lr"),
    (["--lr", "-1"], "--lr"),
    (["--lr", "nan"], "--lr"),
    (["--samples", "0"], "--samples"),
    (["--val-fraction", "1"], "--val-fraction"),
    (["--seed", "-1"], "--seed"),
    (["--degree", "3", "--dof", "2"], "dof"),  # only the basis knows dof >= degree + 1
    (["--dataset", "nonexist"], "nonexist"),
    (["--model", "resnet"], "resnet"),
])
def test_compress_bad_value(argv, expect, capsys, earlier_out):
    before = snapshot(earlier_out)
    line = run_error([*COMPRESS, "--out", str(earlier_out), *argv], capsys, "compress")
    assert expect in line
    assert snapshot(earlier_out) == before


@pytest.mark.parametrize("argv, expect", [
    (["--dataset", "digits", "--epochs", "0"], "epochs"),
    (["--dataset", "digits", "--lr", "-1"], "lr"),
    (["--dataset", "digits", "--limit", "0"], "--limit"),
    (["--dataset", "nonexist"], "nonexist"),
    (["--dataset", "digits", "--batch-size", "x"], "--batch-size"),
])
def test_train_bad_value(argv, expect, capsys):
    assert expect in run_error([*TRAIN, "--model", "vit", *argv], capsys, "train")


def test_missing_required_flag(capsys):
    assert "--model" in run_error([*TRAIN, "--dataset", "digits"], capsys, "train")


def test_unknown_flag(capsys):
    assert "--bogus" in run_error([*COMPRESS, "--bogus"], capsys, "compress")


# --- missing or corrupt files, missing data -----------------------------------------------

@pytest.mark.parametrize("command", ["compress", "train"])
def test_missing_checkpoint(command, tmp_path, capsys):
    missing = tmp_path / "nothing"
    argv = ([*COMPRESS, "--checkpoint", str(missing), "--out", str(tmp_path / "out")] if command == "compress"
            else [*TRAIN, "--model", "deit", "--dataset", "digits", "--teacher", str(missing)])
    line = run_error(argv, capsys, command)
    assert str(missing) in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("which", ["corrupt_file", "corrupt_checkpoint"])
def test_corrupt_checkpoint(which, request, tmp_path, capsys, other_run):
    path = request.getfixturevalue(which)
    before = snapshot(other_run)
    line = run_error([*COMPRESS, "--checkpoint", str(path), "--out", str(other_run)], capsys, "compress")
    assert str(path) in line
    assert "allow_pickle" not in line and "unsafe" not in line
    assert snapshot(other_run) == before


def test_corrupt_teacher(corrupt_checkpoint, tmp_path, capsys):
    out = tmp_path / "trained"
    line = run_error([*TRAIN, "--model", "deit", "--dataset", "digits", "--teacher", str(corrupt_checkpoint),
                      "--out", str(out)], capsys, "train")
    assert str(corrupt_checkpoint) in line
    assert not out.exists()


@pytest.mark.parametrize("command", ["compress", "train"])
@pytest.mark.parametrize("dataset", ["usps", "mnist"])
def test_missing_data_root(command, dataset, tmp_path, capsys):
    root = tmp_path / "nowhere"
    argv = [*COMPRESS, "--out", str(tmp_path / "out")] if command == "compress" else [*TRAIN, "--model", "vit"]
    line = run_error([*argv, "--dataset", dataset, "--data-root", str(root)], capsys, command)
    assert str(root) in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["compress", "train"])
@pytest.mark.parametrize("dataset", ["usps", "mnist"])
def test_data_env_points_nowhere(command, dataset, tmp_path, capsys, monkeypatch):
    nowhere = tmp_path / "no-data-here"
    monkeypatch.setenv("JAXBSD_DATA", str(nowhere))
    argv = [*COMPRESS, "--out", str(tmp_path / "out")] if command == "compress" else [*TRAIN, "--model", "vit"]
    line = run_error([*argv, "--dataset", dataset], capsys, command)
    assert str(nowhere) in line
    assert not (tmp_path / "out").exists()


def test_digits_takes_no_data_root(tmp_path, capsys):
    line = run_error([*TRAIN, "--model", "vit", "--dataset", "digits", "--data-root", str(tmp_path)], capsys, "train")
    assert "digits" in line


# --- output paths --------------------------------------------------------------------------

def test_out_of_another_run_is_untouched(other_run, capsys):
    before = snapshot(other_run)
    line = run_error([*COMPRESS, "--out", str(other_run)], capsys, "compress")
    assert "different run" in line and str(other_run) in line
    assert snapshot(other_run) == before


def test_checkpoint_state_of_another_run(tmp_path, tiny_model, other_run, capsys):
    """A valid --checkpoint gets as far as the state check, which refuses the other run's state."""
    path = save_checkpoint(tmp_path / "trained", tiny_model)
    before = snapshot(other_run)
    line = run_error([*COMPRESS, "--checkpoint", str(path), "--out", str(other_run)], capsys, "compress")
    assert "different run" in line
    assert snapshot(other_run) == before


def test_checkpoint_for_other_images(tmp_path, capsys):
    path = save_checkpoint(tmp_path / "cifar-vit", build_model("vit", config_for_dataset("vit", "cifar10")))
    line = run_error([*COMPRESS, "--checkpoint", str(path), "--dataset", "digits", "--out", str(tmp_path / "out")],
                     capsys, "compress")
    assert "32x32x3" in line and "8x8x1" in line
    assert not (tmp_path / "out").exists()


def test_out_state_not_of_compress(tmp_path, tiny_model, capsys):
    out = tmp_path / "out"
    save_checkpoint(out / "state" / "model", tiny_model, {"dataset": "digits"})  # a trained model
    before = snapshot(out)
    line = run_error([*COMPRESS, "--out", str(out)], capsys, "compress")
    assert "--out" in line and "is not the state of a jaxbsd compression run" in line  # jaxbsd.compression.state
    assert snapshot(out) == before


@pytest.mark.parametrize("inside", ["compressed", "trained"])
def test_out_holding_a_non_checkpoint(inside, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / inside).write_text("my notes")
    before = snapshot(out)
    line = run_error([*COMPRESS, "--out", str(out)], capsys, "compress")
    assert str(out / inside) in line
    assert snapshot(out) == before


def test_out_is_a_file(tmp_path, capsys):
    out = tmp_path / "file"
    out.write_text("not a directory")
    assert str(out) in run_error([*COMPRESS, "--out", str(out)], capsys, "compress")
    assert out.read_text() == "not a directory"


def test_train_out_not_a_checkpoint(tmp_path, capsys):
    out = tmp_path / "notes.txt"
    out.write_text("my notes")
    line = run_error([*TRAIN, "--model", "vit", "--dataset", "digits", "--out", str(out)], capsys, "train")
    assert str(out) in line
    assert out.read_text() == "my notes"


def test_train_json_in_missing_directory(tmp_path, capsys):
    line = run_error([*TRAIN, "--model", "vit", "--dataset", "digits", "--json", str(tmp_path / "no" / "r.json")],
                     capsys, "train")
    assert "--json" in line


# --- --debug, bugs, interrupts -------------------------------------------------------------

@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback(where, corrupt_checkpoint, tmp_path, capsys):
    args = ["--checkpoint", str(corrupt_checkpoint), "--out", str(tmp_path / "out")]
    argv = ["--debug", *COMPRESS, *args] if where == "before" else [*COMPRESS, "--debug", *args]
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith("Traceback")
    assert err.splitlines()[-1].startswith("jaxbsd compress: error: ")


def test_internal_bug_keeps_its_traceback(tmp_path, monkeypatch):
    from jaxbsd import data

    def broken(*args, **kwargs):
        raise KeyError("a bug, not a user error")

    monkeypatch.setattr(data, "load_dataset", broken)
    with pytest.raises(KeyError, match="a bug"):
        cli.main([*COMPRESS, "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_interrupt_is_one_line(tmp_path, monkeypatch, capsys):
    from jaxbsd import data

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(data, "load_dataset", interrupted)
    with pytest.raises(SystemExit) as exc:
        cli.main([*TRAIN, "--model", "vit", "--dataset", "digits"])
    assert exc.value.code == 130
    assert capsys.readouterr().err == "jaxbsd train: interrupted\n"


@pytest.mark.parametrize("message, expect", [
    # numpy >= 2 on a file it takes for pickled data, as quoted by a checkpoint reader
    ("checkpoint /c is corrupt (expected a .npz file): This file contains pickled (object) data. If you trust "
     "the file you can load it unsafely using the `allow_pickle=` keyword argument or `pickle.load()`.",
     "checkpoint /c is corrupt (expected a .npz file): This file contains pickled (object) data."),
    # numpy < 2
    ("checkpoint /c is corrupt: Cannot load file containing pickled data when allow_pickle=False",
     "checkpoint /c is corrupt"),
    ("first line\n  second line\n", "first line; second line"),
])
def test_one_line(message, expect):
    assert one_line(message) == expect


# --- through the command line itself -------------------------------------------------------

@pytest.mark.parametrize("case", ["argparse", "library"])
def test_console_command(case, corrupt_file, tmp_path):
    """``python -m jaxbsd.cli`` (what the ``jaxbsd`` script runs) in a fresh interpreter."""
    out = tmp_path / "out"
    args = ["--rank", "-3"] if case == "argparse" else ["--checkpoint", str(corrupt_file)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "jaxbsd.cli", *COMPRESS, "--out", str(out), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("jaxbsd compress: error: "), proc.stderr
    assert "allow_pickle" not in proc.stderr
    assert not out.exists()
