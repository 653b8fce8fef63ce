"""Greedy evaluation: a batch of episodes per seed, stepped without auto-reset."""
from typing import Any, Callable

import jax
import jax.numpy as jnp

from framework.env import Environment

FINAL_EVALUATION = 2**31 - 1  # the final evaluation's number: its keys differ from every periodic one's


def run_keys(seed: jax.Array, evaluation: jax.Array, num_seeds: int) -> tuple[jax.Array, jax.Array]:
    """Every seed's init key, and every seed's key for evaluation number `evaluation` (seed: uint32)."""
    init_key, eval_root_key = jax.random.split(jax.random.key(seed))
    eval_key = jax.random.fold_in(eval_root_key, evaluation)
    return jax.random.split(init_key, num_seeds), jax.random.split(eval_key, num_seeds)


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


def make_record_episode(env: Environment, env_params: Any, act: Callable) -> Callable:
    """(policy of one seed, key) -> (states [horizon + 1, ...], rewards [horizon], steps taken): one
    greedy episode as `evaluate`'s first, with every state kept for drawing it."""
    horizon = env.max_episode_steps(env_params)

    def record(policy: Any, key: jax.Array) -> tuple[Any, jax.Array, jax.Array]:
        keys = jax.random.split(key, horizon + 1)
        obs, env_state = env.reset_env(keys[0], env_params)

        def one_step(carry, step_key):
            obs, env_state, running = carry
            act_key, env_key = jax.random.split(step_key)
            action = act(policy, obs[None], act_key)[0]
            obs, env_state, reward, terminated, truncated, _ = env.step_env(env_key, env_state, action, env_params)
            return (obs, env_state, running & ~(terminated | truncated)), (env_state, jnp.where(running, reward, 0.0), running)

        _, (states, rewards, running) = jax.lax.scan(one_step, (obs, env_state, jnp.bool_(True)), keys[1:])
        states = jax.tree.map(lambda first, rest: jnp.concatenate([jnp.asarray(first, rest.dtype)[None], rest]), env_state, states)
        return states, rewards, running.sum()

    return record
