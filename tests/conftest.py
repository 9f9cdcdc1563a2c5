"""Test configuration shared by the whole suite.

Solver tests run in float64 (the library itself computes in the dtype it is given), and
implicit rank promotion is an error so that broadcasting bugs cannot hide. The real data sets
are read from ``$JAXBSD_DATA``, by default the ``../shared/data`` beside the repository.
"""

import os
import pathlib

import jax
import pytest

# The real data sets: CI keeps ../shared beside the clone. A JAXBSD_DATA set outside wins.
SHARED_DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
os.environ.setdefault("JAXBSD_DATA", str(SHARED_DATA))

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture
def key():
    return jax.random.key(0)
