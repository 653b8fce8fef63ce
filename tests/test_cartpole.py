"""CartPole: one-step agreement with gymnasium's CartPole-v1, time limit, auto-reset, registry."""
import math

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from lightspeed.envs.cartpole import CartPole, CartPoleConfig, CartPoleParams, CartPoleState, make_cartpole
from lightspeed.framework.core.errors import ConfigError
from lightspeed.framework.core.registry import build_config, lookup

ENV = CartPole()
PARAMS = CartPoleParams()
THETA_LIMIT = 12 * 2 * math.pi / 360
# One compiled step over a batch of states and actions; the key is unused by step_env.
batched_step_env = jax.jit(jax.vmap(ENV.step_env, in_axes=(None, 0, 0, None)))


def to_states(values: np.ndarray, time: int = 0) -> CartPoleState:
    """A batch of states from float rows [x, x_dot, theta, theta_dot]."""
    columns = jnp.asarray(values, jnp.float32).T
    return CartPoleState(*columns, time=jnp.full(len(values), time, jnp.int32))


def gymnasium_visited_states(episodes: int = 40) -> np.ndarray:
    """States that gymnasium's own CartPole-v1 reaches under seeded random actions."""
    env = gymnasium.make("CartPole-v1")
    rng = np.random.default_rng(0)
    states = []
    for episode in range(episodes):
        env.reset(seed=episode)
        done = False
        while not done:
            states.append(np.array(env.unwrapped.state))
            _, _, terminated, truncated, _ = env.step(int(rng.integers(2)))
            done = terminated or truncated
    return np.array(states)


def uniform_states_inside_bounds(count: int = 2000) -> np.ndarray:
    rng = np.random.default_rng(1)
    high = np.array([2.4, 3.0, THETA_LIMIT, 3.0])
    return rng.uniform(-high, high, size=(count, 4))


def gymnasium_step(state: np.ndarray, action: int) -> tuple[np.ndarray, float, bool]:
    """gymnasium's unwrapped step from an arbitrary state (float64 physics)."""
    env = gymnasium_step.env
    env.state = np.array(state, np.float64)
    env.steps_beyond_terminated = None  # every step counts as the first after a reset
    _, reward, terminated, _, _ = env.step(action)
    return np.array(env.state), reward, terminated


gymnasium_step.env = CartPoleEnv()
gymnasium_step.env.reset(seed=0)


@pytest.mark.parametrize("make_states", [gymnasium_visited_states, uniform_states_inside_bounds])
def test_step_matches_gymnasium(make_states):
    # Compare from float32-representable states so both sides start from identical inputs.
    states = make_states().astype(np.float32)
    assert len(states) >= 1000
    states = np.concatenate([states, states])
    actions = np.repeat([0, 1], len(states) // 2)
    obs, next_state, reward, terminated, truncated, info = batched_step_env(
        jax.random.key(0), to_states(states), jnp.asarray(actions), PARAMS)
    expected = [gymnasium_step(state, int(action)) for state, action in zip(states, actions, strict=True)]
    expected_states = np.array([e[0] for e in expected])
    ours = np.stack([next_state.x, next_state.x_dot, next_state.theta, next_state.theta_dot], axis=1)
    np.testing.assert_allclose(ours, expected_states, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(obs, ours)
    np.testing.assert_array_equal(terminated, [e[2] for e in expected])
    np.testing.assert_array_equal(reward, [e[1] for e in expected])
    assert obs.dtype == jnp.float32 and reward.dtype == jnp.float32 and info == {}
    assert not truncated.any()
    assert 0 < terminated.sum() < len(states)  # both outcomes are exercised


def run_upright(params: CartPoleParams, steps: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """step_env (no reset) under a balancing controller: (terminated, truncated, time) per step."""

    def body(state, _):
        action = (state.theta + 0.5 * state.theta_dot + 0.05 * state.x + 0.1 * state.x_dot > 0).astype(jnp.int32)
        _, state, _, terminated, truncated, _ = ENV.step_env(None, state, action, params)
        return state, (terminated, truncated, state.time)

    _, start = ENV.reset(jax.random.key(3), params)
    return jax.lax.scan(body, start, None, length=steps)[1]


@pytest.mark.parametrize("max_steps", [500, 10])
def test_truncated_exactly_at_max_steps(max_steps):
    _, params = make_cartpole(CartPoleConfig(max_steps=max_steps))
    terminated, truncated, time = run_upright(params, max_steps)
    assert not terminated.any()
    np.testing.assert_array_equal(np.flatnonzero(truncated), [max_steps - 1])
    assert int(time[-1]) == max_steps


def test_terminated_and_truncated_are_independent():
    upright, falling = [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.2, 2.0]
    states = jax.tree.map(lambda *leaves: jnp.concatenate(leaves),
                          to_states([upright, falling], time=498), to_states([upright, falling], time=499))
    _, _, _, terminated, truncated, _ = batched_step_env(None, states, jnp.zeros(4, jnp.int32), PARAMS)
    np.testing.assert_array_equal(terminated, [False, True, False, True])
    np.testing.assert_array_equal(truncated, [False, False, True, True])


def test_step_auto_resets_after_termination():
    key = jax.random.key(7)
    leaving = to_states([[2.39, 3.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    actions = jnp.ones(2, jnp.int32)
    step = jax.jit(jax.vmap(ENV.step, in_axes=(None, 0, 0, None)))
    obs, state, reward, terminated, truncated, info = step(key, leaving, actions, PARAMS)
    raw_obs = batched_step_env(key, leaving, actions, PARAMS)[0]
    reset_obs, reset_state = ENV.reset(key, PARAMS)
    np.testing.assert_array_equal(terminated, [True, False])
    np.testing.assert_array_equal(truncated, [False, False])
    np.testing.assert_array_equal(reward, [1.0, 1.0])
    np.testing.assert_array_equal(info["final_observation"], raw_obs)
    assert raw_obs[0, 0] > 2.4
    # The ended episode restarts from the reset of the same (whole) key; the other carries on.
    np.testing.assert_allclose(obs[0], reset_obs, atol=1e-8)  # jit may fuse the scaling into an FMA
    np.testing.assert_array_equal(obs[1], raw_obs[1])
    assert int(state.time[0]) == 0 and int(state.time[1]) == 1
    np.testing.assert_allclose(state.x[0], reset_state.x, atol=1e-8)
    assert np.all(np.abs(obs[0]) <= 0.05)


def test_reset_is_uniform_in_small_box():
    keys = jax.random.split(jax.random.key(0), 4096)
    obs, state = jax.jit(jax.vmap(ENV.reset, in_axes=(0, None)))(keys, PARAMS)
    assert obs.shape == (4096, *ENV.observation_shape) and obs.dtype == jnp.float32
    assert state.time.dtype == jnp.int32 and not state.time.any()
    np.testing.assert_array_equal(obs[:, 0], state.x)
    assert np.all(np.abs(obs) <= 0.05)
    assert len(np.unique(obs)) > 4000
    # Each of the four values spans the box with the spread of a uniform distribution.
    np.testing.assert_allclose(obs.min(0), -0.05, atol=1e-3)
    np.testing.assert_allclose(obs.max(0), 0.05, atol=1e-3)
    np.testing.assert_allclose(obs.std(0), 0.1 / math.sqrt(12), rtol=0.05)
    # Legacy uint32 keys work too.
    legacy_obs, _ = ENV.reset(jax.random.PRNGKey(0), PARAMS)
    assert np.all(np.abs(legacy_obs) <= 0.05)


def test_environment_properties():
    assert ENV.name == "cartpole" and ENV.num_actions == 2 and ENV.observation_shape == (4,)
    assert ENV.stochastic_transitions is False
    assert ENV.max_episode_steps(PARAMS) == 500


def test_registry_builds_cartpole():
    entry = lookup("env", "cartpole")
    assert entry.config_class is CartPoleConfig
    env, params = entry.factory(build_config("env", "cartpole", {"max_steps": 200}))
    assert isinstance(env, CartPole) and params.max_steps == 200 and env.max_episode_steps(params) == 200


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_registry_rejects_bad_max_steps(bad):
    with pytest.raises(ConfigError) as error:
        build_config("env", "cartpole", {"max_steps": bad})
    assert error.value.key == "env.max_steps"
    assert "env.max_steps" in str(error.value)
