"""Test configuration shared by the whole suite.

Solver tests run in float64 (the library itself computes in the dtype it is given), and
implicit rank promotion is an error so that broadcasting bugs cannot hide.
"""

import jax
import pytest

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture
def key():
    return jax.random.key(0)
