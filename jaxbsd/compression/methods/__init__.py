"""Compression methods: one protocol (:class:`Method`), one unit per method.

``bsd`` (:class:`BSD`), ``svd``/``drone`` (:class:`SVD`, :class:`DRONE`), ``prune``
(:class:`Prune`) and ``auto`` (:class:`Auto`); a new method is one new module that subclasses
:class:`Method` and calls :func:`register`.
"""

from jaxbsd.compression.methods.base import (Built, Method, Pruning, RestartChoice, get_method, largest_rank,
                                             method_names, register)
from jaxbsd.compression.methods.bsd import BSD, DEFAULT_CONFIG, warm_init
from jaxbsd.compression.methods.lowrank import DRONE, SVD, LowRank
from jaxbsd.compression.methods.prune import Prune
from jaxbsd.compression.methods.auto import JUDGES, Auto

__all__ = ["Method", "Built", "Pruning", "RestartChoice", "get_method", "largest_rank", "method_names", "register", "BSD", "DEFAULT_CONFIG", "warm_init",
           "SVD", "DRONE", "LowRank", "Prune", "Auto", "JUDGES"]
