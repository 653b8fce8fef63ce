"""Greedy evaluation: a batch of episodes per seed, stepped without auto-reset."""
from typing import Any, Callable

import jax
import jax.numpy as jnp

from framework.env import Environment


def make_evaluate(env: Environment, env_params: Any, act: Callable, num_episodes: int) -> Callable:
    """(state of one seed, key) -> undiscounted return of each of `num_episodes` episodes."""
    horizon = env.max_episode_steps(env_params)
    reset = jax.vmap(env.reset_env, in_axes=(0, None))
    step = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))

    def evaluate(state: Any, key: jax.Array) -> jax.Array:
        # every key at once, [step, act + one per episode] (row 0: the resets): one draw site for XLA
        # instead of two per step, for (horizon + 1) x (episodes + 1) keys of 8 bytes per seed
        keys = jax.random.split(key, (horizon + 1, num_episodes + 1))
        obs, env_state = reset(keys[0, 1:], env_params)

        def one_step(carry, step_keys):
            obs, env_state, returns, running = carry
            actions = act(state, obs, step_keys[0])
            obs, env_state, reward, terminated, truncated, _ = step(step_keys[1:], env_state, actions, env_params)
            returns = returns + jnp.where(running, reward, 0.0)
            return (obs, env_state, returns, running & ~(terminated | truncated)), None

        initial = (obs, env_state, jnp.zeros(num_episodes), jnp.ones(num_episodes, bool))
        (_, _, returns, _), _ = jax.lax.scan(one_step, initial, keys[1:])
        return returns

    return evaluate
