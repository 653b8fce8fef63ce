"""n-step transitions and Q targets against numbers worked out by hand."""
import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.common.targets import huber, n_step_transition, q_targets

GAMMA = 0.5
REWARDS = jnp.array([1.0, 2.0, 4.0])
NEXT_OBS = jnp.array([[10.0], [20.0], [30.0]])
F, T = False, True

CASES = {
    # (terminated, truncated) per step -> (return, bootstrap obs, bootstrap discount)
    "no end in the window": ([F, F, F], [F, F, F], 1 + 0.5 * 2 + 0.25 * 4, 30.0, 0.125),
    "terminated at the second step": ([F, T, F], [F, F, F], 1 + 0.5 * 2, 20.0, 0.0),
    "truncated at the first step": ([F, F, F], [T, F, F], 1.0, 10.0, 0.5),
    "truncated, then a new episode terminates": ([F, F, T], [F, T, F], 1 + 0.5 * 2, 20.0, 0.25),
    "terminated at the last step": ([F, F, T], [F, F, F], 1 + 0.5 * 2 + 0.25 * 4, 30.0, 0.0),
    "terminated and truncated together": ([T, F, F], [T, F, F], 1.0, 10.0, 0.0),
}


@pytest.mark.parametrize("terminated, truncated, expected_return, expected_obs, expected_discount",
                         CASES.values(), ids=CASES.keys())
def test_n_step_transition_by_hand(terminated, truncated, expected_return, expected_obs, expected_discount):
    n_step_return, bootstrap_obs, discount = n_step_transition(
        REWARDS, jnp.array(terminated), jnp.array(truncated), NEXT_OBS, GAMMA)
    assert float(n_step_return) == pytest.approx(expected_return)
    assert float(bootstrap_obs[0]) == expected_obs
    assert float(discount) == pytest.approx(expected_discount)


def test_n_step_transition_is_batched_over_envs():
    rewards = jnp.stack([REWARDS, REWARDS], axis=1)  # [n, envs]
    terminated = jnp.array([[F, F], [F, T], [F, F]])
    truncated = jnp.zeros((3, 2), bool)
    next_obs = jnp.stack([NEXT_OBS, NEXT_OBS + 1], axis=1)  # [n, envs, 1]
    n_step_return, bootstrap_obs, discount = n_step_transition(rewards, terminated, truncated, next_obs, GAMMA)
    np.testing.assert_allclose(n_step_return, [3.0, 2.0])
    np.testing.assert_allclose(bootstrap_obs[:, 0], [30.0, 21.0])
    np.testing.assert_allclose(discount, [0.125, 0.0])


def test_q_targets_plain_and_double():
    target_next = jnp.array([[1.0, 5.0, 3.0]])
    online_next = jnp.array([[9.0, 0.0, 1.0]])  # prefers action 0, where the target says 1.0
    assert float(q_targets(jnp.array([2.0]), jnp.array([0.5]), target_next)[0]) == 2.0 + 0.5 * 5.0
    assert float(q_targets(jnp.array([2.0]), jnp.array([0.5]), target_next, online_next)[0]) == 2.0 + 0.5 * 1.0
    assert float(q_targets(jnp.array([2.0]), jnp.array([0.0]), target_next, online_next)[0]) == 2.0


def test_huber_is_quadratic_inside_and_linear_outside():
    np.testing.assert_allclose(huber(jnp.array([0.5, -2.0, 3.0])), [0.125, 1.5, 2.5])
