"""Evaluation, by what is measured: :mod:`~jaxbsd.evaluation.accuracy` (image classifiers),
:mod:`~jaxbsd.evaluation.perplexity` (language models, in bits per character),
:mod:`~jaxbsd.evaluation.causal_lm` (a compressed causal LM against its original: bits per token and
next-token agreement), :mod:`~jaxbsd.evaluation.fidelity` (a compressed sentence encoder against its
original) and :mod:`~jaxbsd.evaluation.classifier` (a compressed image classifier against its
original: top-1 agreement and KL divergence, without labels).

Evaluation imports models and data, never training or compression; models import none of it.
"""

from jaxbsd.evaluation.accuracy import evaluate, predict
from jaxbsd.evaluation.causal_lm import bits_per_token, next_token_agreement
from jaxbsd.evaluation.classifier import agreement, classifier_agreement, classifier_logits
from jaxbsd.evaluation.fidelity import embed_eval_set, fidelity
from jaxbsd.evaluation.perplexity import evaluate_lm, lm_windows_loss, ngram_bpc

__all__ = ["predict", "evaluate", "evaluate_lm", "lm_windows_loss", "ngram_bpc", "bits_per_token",
           "next_token_agreement", "embed_eval_set", "fidelity", "agreement", "classifier_agreement",
           "classifier_logits"]
