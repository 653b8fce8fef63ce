"""Action selection by hand (one uniform per decision), Ape-X's epsilon ladder, and a rollout's bulk draws:
uniforms spread evenly over [0, 1), every env step its own key."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lightspeed.algorithms.common.exploration import actor_epsilons, epsilon_greedy, greedy_with_random_ties
from lightspeed.framework.core.keys import rollout_draws


def test_rollout_draws_give_distinct_independent_keys():
    act_keys, env_keys = rollout_draws(jax.random.key(0), 500, 64)
    assert act_keys.shape == env_keys.shape == (500, 64)
    words = np.concatenate([np.asarray(jax.random.key_data(keys)).reshape(-1, 2) for keys in (act_keys, env_keys)])
    assert len(np.unique(words, axis=0)) == 2 * 500 * 64
    # each key's first uniform is uniform (chi-square), and an act's draw is independent of its env step's
    acts = np.asarray(jax.vmap(jax.vmap(jax.random.uniform))(act_keys)).ravel()
    counts = np.histogram(acts, bins=50, range=(0.0, 1.0))[0]
    expected = len(acts) / 50
    # 99.9% critical value of chi-square with 49 degrees of freedom is 85.4
    assert ((counts - expected) ** 2 / expected).sum() < 85.4
    steps = np.asarray(jax.vmap(jax.vmap(jax.random.uniform))(env_keys)).ravel()
    assert abs(np.corrcoef(acts, steps)[0, 1]) < 0.02


def test_rollout_draws_cut_both_keys_from_one_draw_of_words():
    """Each draw's first words are the act key, the rest the env step's key."""
    key = jax.random.key(7)
    act_keys, env_keys = rollout_draws(key, 3, 5)
    words = np.asarray(jax.random.bits(key, (3, 5, 4), jnp.uint32))
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(act_keys)), words[..., :2])
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(env_keys)), words[..., 2:])


def test_rollout_draws_keep_the_keys_implementation():
    key = jax.random.key(7, impl="rbg")  # 4 words per key instead of threefry's 2
    act_keys, env_keys = rollout_draws(key, 2, 3)
    for keys in (act_keys, env_keys):
        assert jax.random.key_impl(keys) == jax.random.key_impl(key)
        assert jax.random.key_data(keys).shape == (2, 3, 4)


# maxima at actions 1, 2, 4 (three ties); one maximum at action 0; all four tied
TIES = np.array([[1.0, 3.0, 3.0, 0.0, 3.0], [9.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0, -1.0]], np.float32)


@pytest.mark.parametrize("uniform, expected", [
    # three ties split [0, 1) in thirds; four ties in quarters; a single maximum takes every uniform
    (0.0, [1, 0, 0]), (0.33, [1, 0, 1]), (0.34, [2, 0, 1]), (0.5, [2, 0, 2]), (0.66, [2, 0, 2]),
    (0.67, [4, 0, 2]), (0.76, [4, 0, 3]), (0.9999999, [4, 0, 3]),
    # 1.0 is outside the contract but epsilon_greedy's rescaling can round to it: still the last maximum
    (1.0, [4, 0, 3]),
])
def test_greedy_with_random_ties_picks_the_tie_the_uniform_falls_in(uniform, expected):
    actions = greedy_with_random_ties(jnp.asarray(TIES), jnp.full(3, uniform, jnp.float32))
    assert actions.dtype == jnp.int32
    assert actions.tolist() == expected


def test_greedy_with_random_ties_works_over_leading_batch_axes():
    q_values = jnp.asarray(np.stack([TIES, TIES[::-1]]))  # [2, 3, 5]
    uniforms = jnp.array([[0.0, 0.5, 0.9], [0.9, 0.5, 0.0]], jnp.float32)
    assert greedy_with_random_ties(q_values, uniforms).tolist() == [[1, 0, 3], [3, 0, 1]]


A4 = np.array([[0.0, 7.0, 1.0, 7.0]], np.float32)  # four actions, greedy ones at 1 and 3


@pytest.mark.parametrize("epsilon, uniform, expected", [
    # u < epsilon explores: u / epsilon in [0, 1) picks among the 4 actions in quarters
    (0.5, 0.1, 0), (0.5, 0.2, 1), (0.5, 0.3, 2), (0.5, 0.49, 3),
    # u >= epsilon exploits: (u - epsilon) / (1 - epsilon) picks among the 2 greedy actions in halves
    (0.5, 0.5, 1), (0.5, 0.74, 1), (0.5, 0.76, 3), (0.5, 0.99, 3),
    (0.0, 0.0, 1), (0.0, 0.6, 3),  # epsilon 0 never explores
    (1.0, 0.0, 0), (1.0, 0.6, 2), (1.0, 0.99, 3),  # epsilon 1 always does
    # float32 (u - eps) / (1 - eps) rounds to 1.0 here: the last greedy action, never action 0
    (0.3577952, 1 - 2**-24, 3),
])
def test_epsilon_greedy_spends_one_uniform_per_decision(epsilon, uniform, expected):
    action = epsilon_greedy(jnp.asarray(A4), jnp.float32(epsilon), jnp.array([uniform], jnp.float32))
    assert action.dtype == jnp.int32 and action.tolist() == [expected]


def test_epsilon_greedy_works_over_leading_batch_axes():
    """[seeds, envs, actions] with 4 actions and 3 envs: explored actions come from the last axis's size."""
    q_values = jnp.asarray(np.broadcast_to(A4, (2, 3, 4)))
    uniforms = jnp.array([[0.1, 0.3, 0.45], [0.6, 0.9, 0.2]], jnp.float32)
    # epsilon 0.5: u / 0.5 * 4 -> actions 0, 2, 3; (u - 0.5) / 0.5 halves the two greedy actions -> 1, 3; 0.4 * 4 -> 1
    assert epsilon_greedy(q_values, 0.5, uniforms).tolist() == [[0, 2, 3], [1, 3, 1]]


def test_epsilon_greedy_takes_an_epsilon_per_env():
    q_values = jnp.asarray(np.repeat(A4, 3, axis=0))
    actions = epsilon_greedy(q_values, jnp.array([0.0, 0.5, 1.0]), jnp.array([0.3, 0.3, 0.3], jnp.float32))
    assert actions.tolist() == [1, 2, 1]  # exploit (first half of the ties), explore 0.6, explore 0.3


@pytest.mark.parametrize("num_actors", [1, 2, 8])
def test_actor_epsilons_follow_the_apex_ladder(num_actors):
    epsilons = actor_epsilons(num_actors, 0.4, 7.0)
    expected = [0.4 ** (1 + 7.0 * i / max(num_actors - 1, 1)) for i in range(num_actors)]
    assert epsilons.dtype == jnp.float32 and epsilons.shape == (num_actors,)
    np.testing.assert_allclose(epsilons, expected, rtol=1e-6)
