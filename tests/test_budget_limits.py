"""An impossible budget is refused with the largest reduction that can be met, before calibration too.

Oracle: the parameter count of the model with every listed MLP pruned to one hidden unit, counted
by hand (``m + 1`` for fc1, ``n + n`` for fc2: kernel and bias each).
"""

from __future__ import annotations

import math
import re

import jax
import pytest
from test_compress_model import PATHS, SPEC, Net, calibration

import jaxbsd as jb
from jaxbsd.compression import budget
from jaxbsd.models import count_params


def _limit() -> float:
    model = Net()
    P = count_params(model)
    mlp = sum(count_params(jb.compression.surgery.get_submodule(model, p)) for p in PATHS)
    smallest = len(PATHS) * ((8 + 1) + (8 + 8))  # dim 8, one hidden unit kept
    return (mlp - smallest) / P


def test_the_refusal_names_the_largest_reduction_and_that_one_is_met():
    limit = _limit()
    with pytest.raises(ValueError, match="reduction") as err:
        jb.compress_model(Net(), calibration(), mlps=PATHS, reduction=limit + 1e-3, method="prune", mlp_specs=SPEC,
                          refine=None, key=jax.random.key(0))
    message = str(err.value)
    said = float(re.search(r"largest reduction it can meet is ([0-9.]+)", message).group(1))
    assert said == math.floor(1e4 * limit) / 1e4
    assert not re.search(r"-\d", message)  # no negative counts
    _, report = jb.compress_model(Net(), calibration(), mlps=PATHS, reduction=said, method="prune", mlp_specs=SPEC,
                                  refine=None, key=jax.random.key(0))
    assert {r.rank for r in report.mlps} >= {1} and report.reduction >= said


def test_the_budget_is_priced_from_the_modules_alone():
    model = Net()
    sites = budget.priced_sites(model, PATHS, SPEC)
    prune = jb.get_method("prune")
    assert budget.largest_reduction(prune, sites, count_params(model)) == pytest.approx(_limit(), rel=1e-12)
    with pytest.raises(ValueError, match="mlp_specs"):
        budget.priced_sites(model, PATHS)  # a user MLP's spec is found on calibration tokens only
