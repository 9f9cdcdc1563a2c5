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
from jaxbsd.models import bert as B


@pytest.fixture
def texts(tmp_path):
    rng = np.random.default_rng(0)
    paragraphs = [" ".join(rng.choice(WORDS, size=int(rng.integers(4, 12)))) + "." for _ in range(60)]
    path = tmp_path / "text.txt"
    path.write_text("\n\n".join(paragraphs) + "\n")
    return path, paragraphs


def _args(model, out, texts, *extra):
    return ["compress-hf", str(model), "--reduction", "0.1", "--out", str(out), "--calibration-text", str(texts),
            "--text", str(texts), "--windows", "6", "--seq-len", "16", "--eval-texts", "20", "--refine-steps", "20",
            "--no-progress", *extra]


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
    assert "parameters (reduction" in capsys.readouterr().out


@pytest.mark.slow
def test_a_decoupling_is_written_with_save_compressed(tmp_path, texts):
    import jaxbsd as jb

    path, paragraphs = texts
    model = write_tiny_bert(tmp_path / "m")
    assert main(_args(model, tmp_path / "out", path, "--method", "svd")) == 0
    report = json.loads((tmp_path / "out" / "fidelity.json").read_text())
    assert "save_compressed" in report["written"] and "LowRankMLP" in report["written"]["why_not_huggingface"]
    restored = jb.load_compressed(tmp_path / "out" / "compressed", B.from_pretrained(model))
    emb, ref = restored.encode(paragraphs[:20]), B.from_pretrained(model).encode(paragraphs[:20])
    assert float(jb.solver.metrics.mean_cosine(ref, emb)) == pytest.approx(report["fidelity"]["mean_cosine"], abs=1e-5)


@pytest.mark.parametrize("break_it,match", [
    ("missing", "no such file or directory"),
    ("mpnet", "model_type is 'mpnet'"),
    ("bin", "only pytorch_model.bin"),
])
def test_bad_directories_are_one_line_errors_with_exit_status_2(tmp_path, texts, capsys, break_it, match):
    model = write_tiny_bert(tmp_path / "m")
    if break_it == "missing":
        model = tmp_path / "nothing"
    elif break_it == "mpnet":  # a family the BERT command does not read
        c = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**c, "model_type": "mpnet"}))
    else:
        (model / "model.safetensors").rename(model / "pytorch_model.bin")
    with pytest.raises(SystemExit) as exit_:
        main(_args(model, tmp_path / "out", texts[0]))
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("jaxbsd compress-hf: error:") and match in err[0]
    assert not (tmp_path / "out").exists()
