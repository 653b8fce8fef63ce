"""An algorithm written as an actor part and a learner part, run as one program with a JAX env between them.

    update = act and step every env `block_steps` times (observe records each step) -> insert -> learn, once ready

The framework builds `init`, `update` and `policy` from the parts (`composed` checks what the parts return, then
`single_program` builds them), so an algorithm's
parts run in both shapes: here, and in framework/sebulba's actor threads, which step host envs between the
same functions and draw the same keys (framework/core/keys.py).
"""
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from lightspeed.framework.core.algorithm import ActorLearner, ActorStep, Algorithm, Metrics, check_parts
from lightspeed.framework.core.devices import device_index
from lightspeed.framework.core.env import EpisodeStatistics
from lightspeed.framework.core.keys import rollout_draws
from lightspeed.framework.core.spaces import clip_actions


class PartsState(NamedTuple):
    """One seed's state in the single program: its learner, its actors and their envs."""

    learner: Any
    actor_params: Any  # the actors' copy of the learner's parameters, refreshed every `sync_period` updates
    env_state: Any
    obs: jax.Array  # [num_envs, ...] the observations the actors act on next
    start: jax.Array  # [num_envs] where `obs` begins an episode
    actor_state: Any  # [num_envs, ...] what `act` is given next
    recorder: Any  # the `observe` state (n-step windows, sequences being cut)
    env_steps: jax.Array  # the seed's env steps so far
    key: jax.Array


def items_inserted(parts: ActorLearner, env_steps: jax.Array) -> jax.Array:
    """Replay items a seed has inserted after `env_steps` env steps (one block's items per block)."""
    return env_steps // (parts.num_envs * parts.block_steps) * parts.block_units


def after_round(ready: jax.Array, learned: Any, inserted: Any) -> Any:
    """The learned state once learning may start, else the inserted one. A leaf `learn` returned as it came in
    is taken as it is: no select, so a replay's buffer is never copied for it."""
    return jax.tree.map(lambda new, old: old if new is old else jnp.where(ready, new, old), learned, inserted)


def single_program(algorithm: Algorithm, env: Any, env_params: Any) -> Algorithm:
    """`algorithm` with `init`, `update` and `policy` built from its `actor_learner` parts and a JAX env."""
    parts = algorithm.actor_learner
    num_envs, steps = parts.num_envs, parts.block_steps
    stats_env = EpisodeStatistics(env)
    reset_envs = jax.vmap(stats_env.reset, in_axes=(0, None))
    step_envs = jax.vmap(stats_env.step, in_axes=(0, 0, 0, None))
    act = jax.vmap(parts.act, in_axes=(None, 0, 0, 0, 0))  # every env acts with the same parameters
    action_space = env.action_space(env_params)
    memory = algorithm.memory

    def init(key: jax.Array) -> PartsState:
        key, net_key, reset_key = jax.random.split(key, 3)
        if algorithm.parallel_learners:  # one network per seed, shared by its learners; envs differ per device
            key, reset_key = (jax.random.fold_in(k, device_index()) for k in (key, reset_key))
        obs, env_state = reset_envs(jax.random.split(reset_key, num_envs), env_params)
        learner = parts.learner_init(net_key, obs)
        actor_state = jax.vmap(parts.actor_init, in_axes=(0, None))(jnp.arange(num_envs, dtype=jnp.int32),
                                                                    jnp.int32(0))
        return PartsState(learner, parts.actor_params(learner), env_state, obs, jnp.ones(num_envs, bool), actor_state,
                          parts.record_init(obs), jnp.int32(0), key)

    def actor_step(carry: tuple, keys: tuple[jax.Array, jax.Array]) -> tuple[tuple, tuple]:
        """Every env acts once and steps; `observe` records the step."""
        params, env_state, obs, start, actor_state, recorder, fresh = carry
        act_keys, env_keys = keys
        raw_actions, next_actor_state, extras = act(params, actor_state, obs, start, act_keys)
        actions = clip_actions(action_space, raw_actions)
        next_obs, env_state, reward, terminated, truncated, info = step_envs(env_keys, env_state, actions, env_params)
        step = ActorStep(obs, actions, raw_actions, extras, reward, terminated, truncated, info["final_observation"],
                         acted=jnp.ones(num_envs, bool), start=start, fresh=jnp.full(num_envs, fresh),
                         actor_state=actor_state)
        recorder, items = parts.observe(params, recorder, step)
        carry = (params, env_state, next_obs, terminated | truncated, next_actor_state, recorder, jnp.bool_(False))
        return carry, (items, info["returned_episode_return"])

    def update(state: PartsState) -> tuple[PartsState, Metrics]:
        key, rollout_key, learn_key = jax.random.split(state.key, 3)
        carry = (state.actor_params, state.env_state, state.obs, state.start, state.actor_state, state.recorder,
                 state.env_steps == 0)
        (_, env_state, obs, start, actor_state, recorder, _), (items, returns) = jax.lax.scan(
            actor_step, carry, rollout_draws(rollout_key, steps, num_envs))
        inserted = parts.insert(state.learner, items)
        env_steps = state.env_steps + num_envs * steps
        learned, learn_metrics = parts.learn(inserted, learn_key, env_steps)
        ready = parts.ready(inserted)
        learner = after_round(ready, learned, inserted)
        updates = parts.learner_steps(learner)
        refresh = updates // parts.sync_period > parts.learner_steps(state.learner) // parts.sync_period
        actor_params = jax.tree.map(lambda new, old: jnp.where(refresh, new, old), parts.actor_params(learner),
                                    state.actor_params)
        metrics = {name: jnp.where(ready, value, jnp.nan) for name, value in learn_metrics.items()}  # NaN: not yet
        metrics["train/episode_return"] = returns[-1].mean()
        metrics["learner/updates"] = updates.astype(jnp.float32)
        if memory is not None:
            metrics[f"{memory.path}/size"] = jnp.minimum(items_inserted(parts, env_steps), memory.capacity
                                                         ).astype(jnp.float32)
        if parts.actor_metrics is not None:
            metrics.update(parts.actor_metrics(actor_state, returns[-1]))
        return PartsState(learner, actor_params, env_state, obs, start, actor_state, recorder, env_steps, key), metrics

    state_metrics = (None if parts.learner_metrics is None
                     else lambda state: parts.learner_metrics(state.learner))
    return algorithm._replace(init=init, update=update, policy=lambda state: parts.actor_params(state.learner),
                              env_steps_per_update=num_envs * steps, state_metrics=state_metrics,
                              learner_steps=algorithm.learner_steps or "learner/updates")


def composed(name: str, algorithm: Algorithm, env: Any, env_params: Any) -> Algorithm:
    """An algorithm written as parts, its parts' outputs checked, with the single program's `init`, `update` and
    `policy` built from them and the JAX env (framework/anakin/compose.py); one written as one program as it is."""
    if algorithm.update is not None or getattr(env, "host", False):
        return algorithm
    observation = jax.eval_shape(lambda: env.reset_env(jax.random.key(0), env_params))[0]
    check_parts(name, algorithm.actor_learner, observation, env.action_space(env_params))
    return single_program(algorithm, env, env_params)
