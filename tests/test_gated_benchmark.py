"""The gated-MLP benchmark rows run end to end at tiny sizes (timings are not checked: the
machine is shared), and both paths compute the same sweep."""


import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import gated as bench  # not installed: the checkout is on sys.path (pyproject's pytest pythonpath)


@pytest.mark.slow  # a smoke test of the benchmark script's rows
def test_gated_rows_run_at_a_tiny_size():
    rows = bench.bench_gated(ds=(6,), hidden_factor=3, S=16, r=3, repeats=1)
    assert [r.name for r in rows] == ["gated sweep vs dense, d=6", "gated sweep memory vs dense, d=6"]
    time_row, mem_row = rows
    details = time_row.details
    assert details["H"] == 18 and details["dense_tensor_bytes"] == 3 * 16 * 6 * 6 * 4
    assert details["rel_diff_W1"] < 1e-3  # float32: same iterate from both operators
    assert details["rel_diff_sq_norm"] < 1e-5
    assert time_row.ours > 0 and time_row.reference > 0 and time_row.ratio > 0
    # the dense problem holds J three times: 3·S·d·d float32 at least, and the sweep reads two
    mem = details["memory"]
    assert mem["dense"]["resident"] >= details["dense_tensor_bytes"]
    assert mem["dense"]["argument"] >= 2 * details["dense_tensor_bytes"] // 3
    assert mem["gated"]["resident"] < mem["dense"]["resident"]
    assert mem["dense"]["peak"] == mem["dense"]["resident"] + mem["dense"]["temp"]
    assert details["sq_norm_temp_bytes"] >= 0 and details["sq_norm_s"] > 0
    assert mem_row.unit == "MiB" and mem_row.ratio > 0
    # dense skipped above the memory limit: one time row and one memory row, no ratio
    skipped = bench.bench_gated(ds=(6,), S=16, r=3, repeats=1, dense_max_bytes=0)
    assert skipped[0].reference is None and "dense skipped" in skipped[0].name
    assert skipped[1].ours > 0


def test_dense_from_gated_materializes_the_operator():
    jac, F, X = bench.gated_problem(5, 15, 12)
    dense = bench.dense_from_gated(jac, chunk=5)  # gcd(12, 5) = 1: one sample at a time
    np.testing.assert_allclose(dense.J, jac.dense(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dense.J_out, jnp.transpose(jac.dense(), (1, 0, 2)), rtol=1e-5, atol=1e-6)
    assert F.shape == (12, 5) and X.shape == (12, 5) and dense.J.dtype == jnp.float32
