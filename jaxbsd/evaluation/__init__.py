"""Evaluation, by what is measured: :mod:`~jaxbsd.evaluation.accuracy` (image classifiers),
:mod:`~jaxbsd.evaluation.perplexity` (language models, in bits per character) and
:mod:`~jaxbsd.evaluation.fidelity` (a compressed sentence encoder against its original).

Evaluation imports models and data, never training or compression; models import none of it.
"""

from jaxbsd.evaluation.accuracy import evaluate, predict
from jaxbsd.evaluation.fidelity import embed_eval_set, fidelity
from jaxbsd.evaluation.perplexity import evaluate_lm, lm_windows_loss, ngram_bpc

__all__ = ["predict", "evaluate", "evaluate_lm", "lm_windows_loss", "ngram_bpc", "embed_eval_set", "fidelity"]
