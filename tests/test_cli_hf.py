"""``jaxbsd compress-hf`` on a tiny BERT the test writes in the Hugging Face layout.

Oracles: the exported directory read by the independent numpy BERT (tests/bert_reference.py) must
give the compressed encoder's embeddings; the fidelity figures are recomputed here with numpy.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from bert_reference import WORDS, NumpyBert, write_tiny_bert

from jaxbsd.cli import main
from jaxbsd.cli.hf import DOMAIN_NOTE
from jaxbsd.models import bert as B


@pytest.fixture
def texts(tmp_path):
    rng = np.random.default_rng(0)
    paragraphs = [" ".join(rng.choice(WORDS, size=int(rng.integers(4, 12)))) + "." for _ in range(60)]
    path = tmp_path / "text.txt"
    path.write_text("\n\n".join(paragraphs) + "\n")
    return path, paragraphs


def _args(model, out, texts, *extra, calibrate=True, quiet=True):
    return ["compress-hf", str(model), "--reduction", "0.1", "--out", str(out),
            *(["--calibration-text", str(texts)] if calibrate else []), "--eval-text", str(texts), "--windows", "6",
            "--seq-len", "16", "--eval-texts", "20", "--refine-steps", "20", *(["--no-progress"] if quiet else []),
            *extra]


@pytest.mark.slow  # the CLI on a BERT directory end to end; its refusals stay in the default run, and the library
# path (prune, save_pretrained, reload) is tests/test_bert.py's
def test_prune_writes_a_smaller_bert_and_a_fidelity_report(tmp_path, texts, capsys):
    path, paragraphs = texts
    model = write_tiny_bert(tmp_path / "m")
    assert main(_args(model, tmp_path / "out", path)) == 0
    report = json.loads((tmp_path / "out" / "fidelity.json").read_text())
    assert report["reduction"] >= 0.1 and report["params_after"] < report["params_before"]
    exported = tmp_path / "out" / "model"
    width = json.loads((exported / "config.json").read_text())["intermediate_size"]
    assert width < 32
    # the plain numpy BERT reads the export and gives the reported fidelity against the original
    new, old = NumpyBert(exported).encode(paragraphs[:20]), NumpyBert(model).encode(paragraphs[:20])
    cos = np.mean(np.sum(new * old, 1) / (np.linalg.norm(new, axis=1) * np.linalg.norm(old, axis=1)))
    assert report["fidelity"]["mean_cosine"] == pytest.approx(cos, abs=1e-4)
    np.testing.assert_allclose(B.from_pretrained(exported).encode(paragraphs[:20]), new, atol=3e-5, rtol=1e-4)
    assert "of the model removed" in capsys.readouterr().out
    # the texts named, the figures explained, the kept units beside the report
    assert report["calibration"]["source"] == str(path) and report["calibration"]["texts"] == 60
    assert report["calibration"]["tokens"] == 6 * 16 and report["evaluation"]["texts"] == 20
    assert report["fidelity_reference"]["mean_cosine"] == 1.0 and "higher is better" in report["fidelity_about"][
        "mean_cosine"]
    mlp_params = 2 * (16 * 32 + 32 + 32 * 16 + 16)
    assert report["mlp_reduction"] == pytest.approx((report["params_before"] - report["params_after"]) / mlp_params)
    kept = json.loads((tmp_path / "out" / "kept_units.json").read_text())
    assert sorted(kept) == ["bert.layers.0.mlp", "bert.layers.1.mlp"] and all(len(v) == width for v in kept.values())
    assert all("kept" not in r for r in report["report"]["mlps"])


@pytest.mark.slow
def test_a_decoupling_is_written_with_save_compressed(tmp_path, texts, capsys, monkeypatch):
    import jaxbsd as jb

    path, paragraphs = texts
    model = write_tiny_bert(tmp_path / "m")
    # calibrated on the default text (the docs the package ships: no JAXBSD_DATA needed), with progress
    monkeypatch.delenv("JAXBSD_DATA", raising=False)
    assert main(_args(model, tmp_path / "out", path, "--method", "svd", calibrate=False, quiet=False)) == 0
    err = capsys.readouterr().err.splitlines()
    assert DOMAIN_NOTE in err and "--calibration-text" in DOMAIN_NOTE
    starts = [i for i, line in enumerate(err) if line.startswith("[") and line.endswith("...")]
    done = [i for i, line in enumerate(err) if line.startswith("[") and "output error" in line]
    assert len(starts) == len(done) == 2 and starts[0] < done[0]  # a line before the first MLP finishes
    report = json.loads((tmp_path / "out" / "fidelity.json").read_text())
    assert "save_compressed" in report["written"] and "LowRankMLP" in report["written"]["why_not_huggingface"]
    restored = jb.load_compressed(tmp_path / "out" / "compressed", B.from_pretrained(model))
    emb, ref = restored.encode(paragraphs[:20]), B.from_pretrained(model).encode(paragraphs[:20])
    assert float(jb.solver.metrics.mean_cosine(ref, emb)) == pytest.approx(report["fidelity"]["mean_cosine"], abs=1e-5)


@pytest.mark.parametrize("break_it,match", [
    ("missing", "no such file or directory"),
    ("t5", "model_type is 't5'"),
    ("bin", "only pytorch_model.bin"),
])
def test_bad_directories_are_one_line_errors_with_exit_status_2(tmp_path, texts, capsys, break_it, match):
    model = write_tiny_bert(tmp_path / "m")
    if break_it == "missing":
        model = tmp_path / "nothing"
    elif break_it == "t5":  # a family jaxbsd does not read
        c = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**c, "model_type": "t5"}))
    else:
        (model / "model.safetensors").rename(model / "pytorch_model.bin")
    with pytest.raises(SystemExit) as exit_:
        main(_args(model, tmp_path / "out", texts[0]))
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("jaxbsd compress-hf: error:") and match in err[0]
    assert not (tmp_path / "out").exists()


def test_a_reduction_of_zero_is_refused(tmp_path, texts, capsys):
    model = write_tiny_bert(tmp_path / "m")
    with pytest.raises(SystemExit) as exit_:
        main(["compress-hf", str(model), "--reduction", "0", "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2 and "--reduction" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", ["--reduction", "--mlp-reduction"])
def test_an_impossible_budget_is_refused_before_calibration_naming_the_largest(tmp_path, capsys, flag):
    from safetensors.numpy import load_file

    model = write_tiny_bert(tmp_path / "m")
    P = sum(a.size for name, a in load_file(str(model / "model.safetensors")).items() if "pooler" not in name)
    mlp, smallest = 16 * 32 + 32 + 32 * 16 + 16, 16 + 1 + 16 + 16  # one MLP; pruned to one unit
    limit = 2 * (mlp - smallest) / P
    short = tmp_path / "short.txt"
    short.write_text("too short to calibrate on\n")  # calibration would fail: the budget is checked first
    with pytest.raises(SystemExit) as exit_:
        main(["compress-hf", str(model), flag, "0.99", "--calibration-text", str(short), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and f"{flag} 0.99" in err[0]
    assert f"--reduction {int(1e4 * limit) / 1e4}" in err[0]
    assert f"--mlp-reduction {int(1e4 * limit * P / (2 * mlp)) / 1e4}" in err[0]
    assert "-1" not in err[0].replace("--", "")


def test_help_shows_no_markup(capsys):
    with pytest.raises(SystemExit):
        main(["compress-hf", "--help"])
    text = capsys.readouterr().out
    assert "``" not in text and ":func:" not in text and "--calibration-text" in text
