"""jaxbsd's character language model (:class:`~jaxbsd.models.LM`) as a Hugging Face ``LlamaForCausalLM``.

The character LM is a Llama: pre-norm RMSNorm blocks, causal multi-head attention without biases and
with rotate-halves RoPE (``rope_base`` = ``rope_theta``), the gated MLP ``down(act(gate x) ⊙ up x)``
(``mlp_bias`` as Llama's), a final RMSNorm and a tied or bias-free head. The one difference in storage:
its attention keeps q, k and v in one fused ``qkv`` kernel ``(dim, 3·dim)`` (columns: q, then k, then v,
heads consecutive within each), which :func:`from_lm` splits into ``q_proj``, ``k_proj``, ``v_proj``
(``num_key_value_heads`` = ``num_heads``: multi-head attention). In use the LM refuses inputs longer than
its ``context``; the Llama config states that length as ``max_position_embeddings``.

:func:`save_lm_pretrained` writes the Hugging Face directory (through
:func:`~jaxbsd.models.llama.params.save_pretrained`, so a uniformly pruned LM exports too) and, given the
vocabulary's characters, a character-level ``tokenizer.json`` (:func:`char_tokenizer`).
"""

from __future__ import annotations

import os
import pathlib

from flax import nnx

from jaxbsd.models.causal_lm import hf_activation_name
from jaxbsd.models.lm.modeling import LM
from jaxbsd.models.llama.modeling import Llama, LlamaConfig
from jaxbsd.models.llama.params import save_pretrained

__all__ = ["from_lm", "char_tokenizer", "save_lm_pretrained"]


def from_lm(lm: LM) -> Llama:
    """The :class:`Llama` (``model_type`` ``"llama"``) computing what ``lm`` computes, with copies of its
    parameters; each ``blocks[i].mlp`` is a copy of the LM's (a pruned MLP stays pruned).

    Raises ``ValueError`` for a model that is not an :class:`~jaxbsd.models.LM`, or whose activation has
    no Hugging Face name.
    """
    if not isinstance(lm, LM):
        raise ValueError(f"lm must be a jaxbsd.models.LM, got {type(lm).__name__}")
    c = lm.config
    act = hf_activation_name(c.activation)
    if act is None:
        raise ValueError(f"lm: activation {c.activation!r} has no Hugging Face name")
    config = LlamaConfig(
        model_type="llama", vocab_size=c.vocab_size, hidden_size=c.dim,
        intermediate_size=int(getattr(lm.blocks[0].mlp, "hidden", c.mlp_dim)), num_hidden_layers=c.depth,
        num_attention_heads=c.num_heads, num_key_value_heads=c.num_heads, head_dim=c.head_dim, hidden_act=act,
        max_position_embeddings=c.context, rms_norm_eps=c.norm_eps, rope_theta=c.rope_base,
        tie_word_embeddings=c.tie_embeddings, mlp_bias=c.mlp_bias)
    model = Llama(config, rngs=nnx.Rngs(0))
    d = c.dim
    model.embed.embedding.set_value(lm.embed.embedding[...])
    model.norm.scale.set_value(lm.norm.scale[...])
    if not c.tie_embeddings:
        model.lm_head.kernel.set_value(lm.head.kernel[...])
    for ours, theirs in zip(model.blocks, lm.blocks):
        ours.attn_norm.scale.set_value(theirs.norm1.scale[...])
        ours.mlp_norm.scale.set_value(theirs.norm2.scale[...])
        qkv = theirs.attn.qkv.kernel[...]
        for i, proj in enumerate((ours.attn.q_proj, ours.attn.k_proj, ours.attn.v_proj)):
            proj.kernel.set_value(qkv[:, i * d:(i + 1) * d])
        ours.attn.o_proj.kernel.set_value(theirs.attn.proj.kernel[...])
        ours.mlp = nnx.clone(theirs.mlp)
    return model


def char_tokenizer(chars: str, unknown: str = "\ufffd"):
    """A ``tokenizers.Tokenizer`` giving id 0 to ``unknown`` (and every character not in ``chars``) and
    ``i + 1`` to ``chars[i]``: one token per character, decoded by concatenation (what
    :class:`jaxbsd.data.CharVocab` computes for ``chars = CharVocab.CHARS``)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    if not isinstance(chars, str) or len(set(chars)) != len(chars) or unknown in chars:
        raise ValueError("chars must be a str of distinct characters, without the unknown one")
    vocab = {unknown: 0, **{ch: i + 1 for i, ch in enumerate(chars)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=unknown))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return tokenizer


def save_lm_pretrained(lm: LM, path: str | os.PathLike, *, chars: str | None = None,
                       unknown: str = "\ufffd") -> pathlib.Path:
    """Write ``lm`` as a Hugging Face ``LlamaForCausalLM`` directory: ``config.json``, ``model.safetensors``
    and, where ``chars`` is given (the vocabulary's characters, id ``i + 1`` for ``chars[i]``), a
    character-level ``tokenizer.json``. Returns the directory.

    Raises ``ValueError`` as :func:`~jaxbsd.models.llama.params.save_pretrained` does for MLPs that are no
    longer of one standard width (pointing to :func:`jaxbsd.save_compressed`), and for bad ``chars``.
    """
    tokenizer = None if chars is None else char_tokenizer(chars, unknown)
    if chars is not None and len(chars) + 1 != lm.config.vocab_size:
        raise ValueError(f"chars: {len(chars)} characters and the unknown one make {len(chars) + 1} ids, the "
                         f"model has vocab_size {lm.config.vocab_size}")
    root = save_pretrained(from_lm(lm), path)
    if tokenizer is not None:
        tokenizer.save(str(root / "tokenizer.json"))
    return root
