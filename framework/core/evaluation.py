"""Greedy evaluation on a JAX env: a batch of episodes per seed, stepped without auto-reset (pure functions over
the env and algorithm contracts, shared by the single program, the tools and algorithms that record an episode).

Every episode carries its own policy state (`Algorithm.act_init`, e.g. a recurrent state) from its first step,
where `start` is True, to its last."""
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from lightspeed.framework.core.env import Environment
from lightspeed.framework.core.spaces import clip_actions


def batch_act(act: Callable, act_init: Callable, num_episodes: int) -> tuple[Callable, Callable]:
    """One episode's (act, act_init) over a batch: (init () -> states [E], act (policy, states, obs [E], start
    [E], keys [E]) -> (actions [E], states)); the policy is shared."""
    init = lambda: jax.vmap(act_init)(jnp.arange(num_episodes, dtype=jnp.int32))
    return init, jax.vmap(act, in_axes=(None, 0, 0, 0, 0))


def _make_play(env: Environment, env_params: Any, algorithm: Any, num_episodes: int, record: bool) -> Callable:
    """(policy of one seed, key) -> (returns [num_episodes], episode 0's (states, rewards, running) per step
    when `record`, its first state). Evaluation and recording are this one function: a recorded episode is
    the evaluation's episode 0, the same keys for its reset, its actions and its steps."""
    horizon = env.max_episode_steps(env_params)
    reset = jax.vmap(env.reset_env, in_axes=(0, None))
    step = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))
    init_states, act_all = batch_act(algorithm.act, algorithm.act_init, num_episodes)
    action_space = env.action_space(env_params)
    first_episode = lambda tree: jax.tree.map(lambda leaf: leaf[0], tree)

    def play(policy: Any, key: jax.Array) -> tuple[jax.Array, Any, Any]:
        # a key per step drawn at once (key 0: the resets), split in the step for the acts and each
        # episode: one draw site per step instead of two, and memory that grows with the horizon only
        keys = jax.random.split(key, horizon + 1)
        obs, env_state = reset(jax.random.split(keys[0], num_episodes), env_params)

        def one_step(carry, step_key):
            obs, env_state, policy_state, start, returns, running = carry
            step_keys = jax.random.split(step_key, num_episodes + 1)
            actions, policy_state = act_all(policy, policy_state, obs, start,
                                            jax.random.split(step_keys[0], num_episodes))
            actions = clip_actions(action_space, actions)
            obs, env_state, reward, terminated, truncated, _ = step(step_keys[1:], env_state, actions, env_params)
            reward = jnp.where(running, reward, 0.0)
            kept = first_episode((env_state, reward, running)) if record else None
            carry = (obs, env_state, policy_state, jnp.zeros_like(start), returns + reward,
                     running & ~(terminated | truncated))
            return carry, kept

        initial = (obs, env_state, init_states(), jnp.ones(num_episodes, bool), jnp.zeros(num_episodes),
                   jnp.ones(num_episodes, bool))
        (_, _, _, _, returns, _), kept = jax.lax.scan(one_step, initial, keys[1:])
        return returns, kept, first_episode(env_state)

    return play


def make_evaluate(env: Environment, env_params: Any, algorithm: Any, num_episodes: int) -> Callable:
    """(policy of one seed, key) -> undiscounted return of each of `num_episodes` episodes played by
    `algorithm`'s act and act_init (an Algorithm, or anything with the two)."""
    play = _make_play(env, env_params, algorithm, num_episodes, record=False)
    return lambda policy, key: play(policy, key)[0]


def make_record_episode(env: Environment, env_params: Any, algorithm: Any, num_episodes: int = 1) -> Callable:
    """(policy of one seed, key) -> (states [horizon + 1, ...], rewards [horizon], steps taken): episode 0
    of `make_evaluate(env, env_params, algorithm, num_episodes)`'s evaluation with the same key, every
    state kept for drawing it. All `num_episodes` are played, as the evaluation plays them, with the same keys."""
    play = _make_play(env, env_params, algorithm, num_episodes, record=True)

    def record(policy: Any, key: jax.Array) -> tuple[Any, jax.Array, jax.Array]:
        _, (states, rewards, running), first_state = play(policy, key)
        states = jax.tree.map(lambda first, rest: jnp.concatenate([jnp.asarray(first, rest.dtype)[None], rest]),
                              first_state, states)
        return states, rewards, running.sum()

    return record


class HostEpisodesAct:
    """An algorithm's evaluation act for host code (host envs, saved policies): a batch of episodes [*lead, width]
    (`lead`: seeds, each with its own policy), each carrying its policy state from its start. Episode slot e
    starts from act_init(e); a step's key is cut from its episode's number and its step in the episode, so an
    episode replays the same whatever plays beside it."""

    def __init__(self, algorithm: Any, lead: tuple[int, ...], width: int):
        init_states, act = batch_act(algorithm.act, algorithm.act_init, width)
        for _ in lead:
            act = jax.vmap(act)
        step_key = lambda episode, step: jax.random.fold_in(jax.random.fold_in(jax.random.key(0), episode), step)
        keys = jax.vmap(step_key)
        for _ in lead:
            keys = jax.vmap(keys)
        self._act = jax.jit(lambda policy, states, obs, start, episodes, steps: act(
            policy, states, obs, start, keys(episodes, steps)))
        self.states = jax.tree.map(lambda leaf: jnp.broadcast_to(leaf, (*lead, *leaf.shape)), init_states())
        self.steps = np.zeros((*lead, width), np.uint32)

    def __call__(self, policy: Any, obs: np.ndarray, start: np.ndarray, episodes: np.ndarray) -> np.ndarray:
        """Actions [*lead, width] for `obs` [*lead, width, ...]; `start` marks slots whose episode begins here,
        `episodes` [*lead, width] the number of each slot's episode (its key stream)."""
        self.steps = np.where(start, 0, self.steps + 1).astype(np.uint32)
        actions, self.states = self._act(policy, self.states, obs, np.asarray(start, bool),
                                         np.asarray(episodes, np.uint32), self.steps)
        return np.asarray(actions)
