"""The paper's metrics against direct numpy formulas and Lemma 4's inequality."""

import numpy as np
import pytest

import jaxbsd as jb
from jaxbsd.solver import metrics


def test_relative_rmse_matches_the_paper_formula():
    rng = np.random.default_rng(0)
    Y = rng.normal(size=(50, 3)) * [1.0, 10.0, 0.1] + [0.0, 5.0, -2.0]
    Y_hat = Y + rng.normal(size=Y.shape) * 0.05
    expected = [100 * np.sqrt(np.sum((Y[:, i] - Y_hat[:, i]) ** 2) / np.sum((Y[:, i] - Y[:, i].mean()) ** 2)) for i in range(3)]
    np.testing.assert_allclose(metrics.relative_rmse(Y, Y_hat), expected, rtol=1e-10)
    with pytest.raises(ValueError, match="Y_hat"):
        metrics.relative_rmse(Y, Y_hat[:, :2])


def test_relative_errors():
    J = np.arange(24.0).reshape(2, 3, 4) + 1
    J_hat = J * 1.1
    np.testing.assert_allclose(metrics.error_J(J, J_hat), 0.01, rtol=1e-12)
    np.testing.assert_allclose(metrics.error_F(J[0], J[0]), 0.0)


def test_savings_and_accuracy_drop():
    assert metrics.savings_percentage(25, 100) == pytest.approx(75.0)
    assert metrics.savings_percentage(524650, 668650) == pytest.approx(21.54, abs=0.01)  # paper's table
    assert metrics.accuracy_drop(94.77, 94.41) == pytest.approx(0.36)
    with pytest.raises(ValueError, match="p_old"):
        metrics.savings_percentage(1, 0)


def test_parameter_counts():
    assert metrics.params_bsd(64, 64, 64, 4) == 64 * 64 * 2 + 64 * 4
    assert metrics.params_fc(64, 256) == 2 * 4 * 64**2  # P_FC = 2 δ m²
    assert metrics.params_fc(64, 256, bias=True) == 2 * 4 * 64**2 + 256 + 64


@pytest.mark.parametrize("m, delta, dof", [(64, 4, 4), (64, 4, 7), (768, 4, 11), (10, 1, 3), (5, 2, 50)])
def test_lemma4_bounds_are_tight(m, delta, dof):
    H = delta * m
    r = metrics.max_rank(m, H, dof)
    assert metrics.params_bsd(m, m, r, dof) < metrics.params_fc(m, H) or r == 0
    assert metrics.params_bsd(m, m, r + 1, dof) >= metrics.params_fc(m, H)
    # the paper's closed form for n = m
    assert r == int(np.ceil(delta * m**2 / (m + dof / 2))) - 1
    if r >= 1:
        nu = metrics.max_dof(m, H, r)
        assert metrics.params_bsd(m, m, r, nu) < metrics.params_fc(m, H)
        assert metrics.params_bsd(m, m, r, nu + 1) >= metrics.params_fc(m, H)
        assert nu == int(np.ceil(2 * m * (delta * m - r) / r)) - 1


def test_decoupled_num_params_matches_formula():
    import jax.numpy as jnp

    model = jb.Decoupled(W0=jnp.zeros((5, 7)), W1=jnp.zeros((3, 5)), coef=jnp.zeros((5, 4)),
                         knots=jnp.zeros((5, 8)), basis=jb.BSpline(3, 4))
    assert model.num_params() == metrics.params_bsd(7, 3, 5, 4)
