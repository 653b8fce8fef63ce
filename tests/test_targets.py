"""n-step transitions, Q targets, losses and TD errors against numbers worked out by hand or in numpy."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lightspeed.algorithms.common.targets import huber, n_step_transition, q_targets, squared, td_errors
from lightspeed.algorithms.common.transition import Transition

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


def test_n_step_transition_keeps_each_observations_shape():
    """Image-like observations [n, envs, 2, 3]: the bootstrap observation is the whole one of the right step."""
    terminated = jnp.array([[F, F, F, F], [F, F, F, F], [F, F, F, F]])
    truncated = jnp.array([[F, T, F, F], [F, F, T, F], [F, F, F, F]])
    next_obs = jnp.arange(3 * 4 * 6, dtype=jnp.float32).reshape(3, 4, 2, 3)
    _, bootstrap_obs, discount = n_step_transition(jnp.ones((3, 4)), terminated, truncated, next_obs, GAMMA)
    assert bootstrap_obs.shape == (4, 2, 3)
    last_step = [2, 0, 1, 2]  # env 1 ends at step 0, env 2 at step 1, the others run the window out
    for env, step in enumerate(last_step):
        np.testing.assert_array_equal(bootstrap_obs[env], next_obs[step, env])
    np.testing.assert_allclose(discount, [GAMMA**3, GAMMA, GAMMA**2, GAMMA**3])


def test_huber_is_quadratic_inside_and_linear_outside():
    np.testing.assert_allclose(huber(jnp.array([0.5, -2.0, 3.0])), [0.125, 1.5, 2.5])
    # delta = 2: 0.5 e^2 up to |e| = 2, then 2 (|e| - 1)
    np.testing.assert_allclose(huber(jnp.array([1.0, -1.5, 3.0, -5.0]), delta=2.0), [0.5, 1.125, 4.0, 8.0])


def test_squared_is_half_the_square():
    np.testing.assert_allclose(squared(jnp.array([0.5, -2.0, 3.0])), [0.125, 2.0, 4.5])


class LinearQ:
    """A stand-in network: Q(s) = s @ W, so the expected TD errors and gradients are a line of numpy."""

    @staticmethod
    def apply(params, obs):
        return obs @ params


@pytest.fixture(scope="module")
def linear_batch():
    rng = np.random.default_rng(0)
    params, target_params = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    batch = Transition(obs=rng.normal(size=(5, 3)), action=np.array([0, 3, 1, 2, 3]), n_step_return=rng.normal(size=5),
                       bootstrap_obs=rng.normal(size=(5, 3)), bootstrap_discount=np.array([0.0, 0.9, 0.81, 0.5, 0.9]),
                       valid=np.ones(5))
    as_jax = lambda x: jnp.asarray(x, jnp.int32 if x.dtype.kind == "i" else jnp.float32)
    to_jax = lambda tree: jax.tree.map(as_jax, tree)
    return params, target_params, batch, to_jax


@pytest.mark.parametrize("double_q", [False, True])
def test_td_errors_against_numpy(linear_batch, double_q):
    params, target_params, batch, to_jax = linear_batch
    errors, chosen = td_errors(to_jax(params), to_jax(target_params), to_jax(batch), LinearQ, double_q)
    online_next, target_next = batch.bootstrap_obs @ params, batch.bootstrap_obs @ target_params
    best = (online_next if double_q else target_next).argmax(axis=1)
    assert (online_next.argmax(axis=1) != target_next.argmax(axis=1)).any(), "the two selections never differ"
    expected_chosen = (batch.obs @ params)[np.arange(5), batch.action]
    expected = batch.n_step_return + batch.bootstrap_discount * target_next[np.arange(5), best] - expected_chosen
    np.testing.assert_allclose(chosen, expected_chosen, rtol=1e-5)
    np.testing.assert_allclose(errors, expected, rtol=1e-5, atol=1e-5)


def test_td_errors_pass_no_gradient_through_the_target(linear_batch):
    """With the online network as its own target (double Q), d(sum of errors)/dW is -d(sum of Q(s, a))/dW."""
    params, _, batch, to_jax = linear_batch
    gradient = jax.grad(lambda w: td_errors(w, w, to_jax(batch), LinearQ, True)[0].sum())(to_jax(params))
    expected = -batch.obs.T @ np.eye(4)[batch.action]
    np.testing.assert_allclose(gradient, expected, rtol=1e-5, atol=1e-6)


def test_q_targets_over_leading_batch_axes():
    """[seeds, batch, actions]: the action is chosen, and its value read, along the last axis."""
    rng = np.random.default_rng(1)
    target_next, online_next = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 3, 4))
    returns, discounts = rng.normal(size=(2, 3)), rng.uniform(size=(2, 3))
    for selector in (None, online_next):
        best = (target_next if selector is None else selector).argmax(axis=-1)
        expected = returns + discounts * np.take_along_axis(target_next, best[..., None], axis=-1)[..., 0]
        online = None if selector is None else jnp.asarray(selector, jnp.float32)
        targets = q_targets(jnp.asarray(returns, jnp.float32), jnp.asarray(discounts, jnp.float32),
                            jnp.asarray(target_next, jnp.float32), online)
        np.testing.assert_allclose(targets, expected, rtol=1e-5, atol=1e-6)
