"""Test helpers for BERT: a tiny random BERT written in the Hugging Face layout, and an independent
numpy implementation of BERT's forward pass and sentence-transformers' pooling that reads the
checkpoint's tensors by their Hugging Face names (float64, one sentence at a time, no padding).

Neither imports jaxbsd: they are the oracle the model file is checked against.
"""

from __future__ import annotations

import json
import math
import pathlib
import string

import numpy as np
from scipy.special import erf

WORDS = ["the", "weather", "is", "lovely", "today", "sunny", "outside", "he", "drove", "to", "stadium", "it", "so", "s"]


def tiny_vocab() -> dict[str, int]:
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *string.ascii_lowercase,
              *("##" + c for c in string.ascii_lowercase), *WORDS, ".", "!", "'"]
    return {t: i for i, t in enumerate(dict.fromkeys(tokens))}


def write_tokenizer(path: pathlib.Path) -> int:
    """A WordPiece tokenizer (BERT normaliser, pre-tokenizer, [CLS] … [SEP]) with a small vocabulary,
    saved as ``path/tokenizer.json``; returns the vocabulary size."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = tiny_vocab()
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tok.save(str(path / "tokenizer.json"))
    return len(vocab)


def write_tiny_bert(path, *, hidden_act="gelu", pooling="mean", normalize=True, hidden=16, layers=2, heads=2,
                    intermediate=32, seed=0, pooler=True, sentence_transformers=True) -> pathlib.Path:
    """A random BERT in the Hugging Face layout at ``path`` (config.json, model.safetensors,
    tokenizer.json and, by default, the sentence-transformers files)."""
    from safetensors.numpy import save_file

    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(path)
    config = {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": vocab, "hidden_size": hidden,
              "num_hidden_layers": layers, "num_attention_heads": heads, "intermediate_size": intermediate,
              "hidden_act": hidden_act, "max_position_embeddings": 40, "type_vocab_size": 2,
              "layer_norm_eps": 1e-12, "pad_token_id": 0, "position_embedding_type": "absolute"}
    (path / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(seed)

    def w(*shape, scale=0.3):
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    t = {"embeddings.word_embeddings.weight": w(vocab, hidden, scale=1.0),
         "embeddings.position_embeddings.weight": w(40, hidden),
         "embeddings.token_type_embeddings.weight": w(2, hidden),
         "embeddings.LayerNorm.weight": 1 + w(hidden, scale=0.1), "embeddings.LayerNorm.bias": w(hidden, scale=0.1)}
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            t[p + name + ".weight"], t[p + name + ".bias"] = w(hidden, hidden), w(hidden, scale=0.1)
        t[p + "intermediate.dense.weight"], t[p + "intermediate.dense.bias"] = w(intermediate, hidden), w(intermediate)
        t[p + "output.dense.weight"], t[p + "output.dense.bias"] = w(hidden, intermediate), w(hidden, scale=0.1)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[p + name + ".weight"], t[p + name + ".bias"] = 1 + w(hidden, scale=0.1), w(hidden, scale=0.1)
    if pooler:
        t["pooler.dense.weight"], t["pooler.dense.bias"] = w(hidden, hidden), w(hidden)
    save_file(t, str(path / "model.safetensors"))
    if sentence_transformers:
        modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        if normalize:
            modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                            "type": "sentence_transformers.models.Normalize"})
        (path / "modules.json").write_text(json.dumps(modules))
        (path / "1_Pooling").mkdir(exist_ok=True)
        modes = {"pooling_mode_cls_token": pooling == "cls", "pooling_mode_mean_tokens": pooling == "mean",
                 "pooling_mode_max_tokens": pooling == "max", "pooling_mode_mean_sqrt_len_tokens": False}
        (path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": hidden, **modes}))
    return path


# ----------------------------------------------------------------------------- the numpy reference


def _layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


ACTIVATIONS = {
    "gelu": lambda x: 0.5 * x * (1 + erf(x / math.sqrt(2))),
    "gelu_new": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "gelu_pytorch_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "relu": lambda x: np.maximum(x, 0),
}


class NumpyBert:
    """A plain BERT read from a Hugging Face directory by tensor names; its widths come from
    config.json and every tensor's shape is asserted against them."""

    def __init__(self, path):
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        path = pathlib.Path(path)
        self.config = json.loads((path / "config.json").read_text())
        raw = load_file(str(path / "model.safetensors"))
        self.t = {k.removeprefix("bert."): v.astype(np.float64) for k, v in raw.items()}
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        c = self.config
        d, h = c["hidden_size"], c["intermediate_size"]
        for i in range(c["num_hidden_layers"]):
            assert self.t[f"encoder.layer.{i}.intermediate.dense.weight"].shape == (h, d)
            assert self.t[f"encoder.layer.{i}.output.dense.weight"].shape == (d, h)
        self.pooling, self.normalize = "mean", False
        if (path / "modules.json").is_file():
            mods = json.loads((path / "modules.json").read_text())
            self.normalize = any(m["type"].endswith("Normalize") for m in mods)
            pool = json.loads((path / "1_Pooling" / "config.json").read_text())
            self.pooling = ("cls" if pool["pooling_mode_cls_token"] else "max" if pool["pooling_mode_max_tokens"]
                            else "mean")

    def hidden(self, ids, types=None):
        """``(T,) ids -> (T, d)`` hidden states of one unpadded sentence."""
        c, t = self.config, self.t
        eps, heads, act = c["layer_norm_eps"], c["num_attention_heads"], ACTIVATIONS[c["hidden_act"]]
        ids = np.asarray(ids)
        types = np.zeros_like(ids) if types is None else np.asarray(types)
        x = (t["embeddings.word_embeddings.weight"][ids] + t["embeddings.position_embeddings.weight"][: len(ids)]
             + t["embeddings.token_type_embeddings.weight"][types])
        x = _layer_norm(x, t["embeddings.LayerNorm.weight"], t["embeddings.LayerNorm.bias"], eps)
        T, d = x.shape
        hd = d // heads
        for i in range(c["num_hidden_layers"]):
            p = f"encoder.layer.{i}."

            def lin(name, y):
                return y @ t[p + name + ".weight"].T + t[p + name + ".bias"]

            q, k, v = (lin(f"attention.self.{n}", x).reshape(T, heads, hd) for n in ("query", "key", "value"))
            scores = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            att = np.einsum("hqk,khd->qhd", scores, v).reshape(T, d)
            x = _layer_norm(x + lin("attention.output.dense", att), t[p + "attention.output.LayerNorm.weight"],
                            t[p + "attention.output.LayerNorm.bias"], eps)
            mlp = lin("output.dense", act(lin("intermediate.dense", x)))
            x = _layer_norm(x + mlp, t[p + "output.LayerNorm.weight"], t[p + "output.LayerNorm.bias"], eps)
        return x

    def embed(self, text: str, max_len: int | None = None) -> np.ndarray:
        enc = self.tokenizer.encode(text)
        ids, types = enc.ids, enc.type_ids
        if max_len is not None and len(ids) > max_len:  # keep [CLS] … and the final [SEP]
            ids, types = ids[: max_len - 1] + ids[-1:], types[: max_len - 1] + types[-1:]
        h = self.hidden(ids, types)
        e = {"mean": h.mean(0), "cls": h[0], "max": h.max(0)}[self.pooling]
        return e / max(np.linalg.norm(e), 1e-12) if self.normalize else e

    def encode(self, texts, max_len=None) -> np.ndarray:
        return np.stack([self.embed(s, max_len) for s in texts])
