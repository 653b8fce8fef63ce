"""Greedy evaluation: a batch of episodes per seed, stepped without auto-reset."""
from typing import Any, Callable

import jax
import jax.numpy as jnp

from framework.env import Environment


def make_evaluate(env: Environment, env_params: Any, act: Callable, num_episodes: int) -> Callable:
    """(policy of one seed, key) -> undiscounted return of each of `num_episodes` episodes."""
    horizon = env.max_episode_steps(env_params)
    reset = jax.vmap(env.reset_env, in_axes=(0, None))
    step = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))

    def evaluate(policy: Any, key: jax.Array) -> jax.Array:
        # a key per step drawn at once (key 0: the resets), split in the step for the act and each
        # episode: one draw site per step instead of two, and memory that grows with the horizon only
        keys = jax.random.split(key, horizon + 1)
        obs, env_state = reset(jax.random.split(keys[0], num_episodes), env_params)

        def one_step(carry, step_key):
            obs, env_state, returns, running = carry
            step_keys = jax.random.split(step_key, num_episodes + 1)
            actions = act(policy, obs, step_keys[0])
            obs, env_state, reward, terminated, truncated, _ = step(step_keys[1:], env_state, actions, env_params)
            returns = returns + jnp.where(running, reward, 0.0)
            return (obs, env_state, returns, running & ~(terminated | truncated)), None

        initial = (obs, env_state, jnp.zeros(num_episodes), jnp.ones(num_episodes, bool))
        (_, _, returns, _), _ = jax.lax.scan(one_step, initial, keys[1:])
        return returns

    return evaluate
