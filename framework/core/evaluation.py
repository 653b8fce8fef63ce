"""Greedy evaluation on a JAX env: a batch of episodes per seed, stepped without auto-reset (pure functions over
the env contract, shared by the single program, the tools and algorithms that record an episode)."""
from typing import Any, Callable

import jax
import jax.numpy as jnp

from framework.core.env import Environment


def _make_play(env: Environment, env_params: Any, act: Callable, num_episodes: int, record: bool) -> Callable:
    """(policy of one seed, key) -> (returns [num_episodes], episode 0's (states, rewards, running) per step
    when `record`, its first state). Evaluation and recording are this one function: a recorded episode is
    the evaluation's episode 0, the same keys for its reset, its actions and its steps."""
    horizon = env.max_episode_steps(env_params)
    reset = jax.vmap(env.reset_env, in_axes=(0, None))
    step = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))
    first_episode = lambda tree: jax.tree.map(lambda leaf: leaf[0], tree)

    def play(policy: Any, key: jax.Array) -> tuple[jax.Array, Any, Any]:
        # a key per step drawn at once (key 0: the resets), split in the step for the act and each
        # episode: one draw site per step instead of two, and memory that grows with the horizon only
        keys = jax.random.split(key, horizon + 1)
        obs, env_state = reset(jax.random.split(keys[0], num_episodes), env_params)

        def one_step(carry, step_key):
            obs, env_state, returns, running = carry
            step_keys = jax.random.split(step_key, num_episodes + 1)
            actions = act(policy, obs, step_keys[0])
            obs, env_state, reward, terminated, truncated, _ = step(step_keys[1:], env_state, actions, env_params)
            reward = jnp.where(running, reward, 0.0)
            kept = first_episode((env_state, reward, running)) if record else None
            return (obs, env_state, returns + reward, running & ~(terminated | truncated)), kept

        initial = (obs, env_state, jnp.zeros(num_episodes), jnp.ones(num_episodes, bool))
        (_, _, returns, _), kept = jax.lax.scan(one_step, initial, keys[1:])
        return returns, kept, first_episode(env_state)

    return play


def make_evaluate(env: Environment, env_params: Any, act: Callable, num_episodes: int) -> Callable:
    """(policy of one seed, key) -> undiscounted return of each of `num_episodes` episodes."""
    play = _make_play(env, env_params, act, num_episodes, record=False)
    return lambda policy, key: play(policy, key)[0]


def make_record_episode(env: Environment, env_params: Any, act: Callable, num_episodes: int = 1) -> Callable:
    """(policy of one seed, key) -> (states [horizon + 1, ...], rewards [horizon], steps taken): episode 0
    of `make_evaluate(env, env_params, act, num_episodes)`'s evaluation with the same key, every state
    kept for drawing it. All `num_episodes` are played, as the evaluation plays them: `act` sees the
    same batch of observations and the same keys, so a random tie-break or a population acts alike."""
    play = _make_play(env, env_params, act, num_episodes, record=True)

    def record(policy: Any, key: jax.Array) -> tuple[Any, jax.Array, jax.Array]:
        _, (states, rewards, running), first_state = play(policy, key)
        states = jax.tree.map(lambda first, rest: jnp.concatenate([jnp.asarray(first, rest.dtype)[None], rest]),
                              first_state, states)
        return states, rewards, running.sum()

    return record
