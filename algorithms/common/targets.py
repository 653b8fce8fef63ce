"""TD targets and losses as small pure functions (rlax style), shared by DQN and Ape-X."""
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lightspeed.algorithms.common.transition import Transition


def n_step_transition(rewards: jax.Array, terminated: jax.Array, truncated: jax.Array, next_obs: jax.Array,
                      discount: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The n-step transition starting at the first step of a window of n steps.

    rewards, terminated, truncated: [n, ...]; next_obs: [n, ...] the observation after each step
    before any auto-reset. The return sums discounted rewards up to the first episode end in the
    window; a termination there stops the bootstrap, a truncation bootstraps from that step's
    final observation. Returns (n_step_return, bootstrap_obs, bootstrap_discount).
    """
    n = rewards.shape[0]
    done = terminated | truncated
    # steps before the first episode end (inclusive) count; later ones belong to a new episode
    ended_before = jnp.cumsum(done, axis=0) - done > 0
    live = ~ended_before
    powers = discount ** jnp.arange(n, dtype=jnp.float32).reshape((n,) + (1,) * (rewards.ndim - 1))
    n_step_return = (powers * rewards * live).sum(axis=0)
    # index of the last step that counts: the first episode end, or the window's end
    last = jnp.where(done.any(axis=0), jnp.argmax(done, axis=0), n - 1)
    per_step_obs_axes = (1,) * (next_obs.ndim - rewards.ndim)
    bootstrap_obs = jnp.take_along_axis(next_obs, last.reshape((1,) + last.shape + per_step_obs_axes), axis=0)[0]
    ended_by_termination = jnp.take_along_axis(terminated, last[None], axis=0)[0]
    bootstrap_discount = jnp.where(ended_by_termination, 0.0, discount ** (last + 1.0))
    return n_step_return, bootstrap_obs, bootstrap_discount


def q_targets(n_step_return: jax.Array, bootstrap_discount: jax.Array, target_next_q: jax.Array,
              online_next_q: jax.Array | None = None) -> jax.Array:
    """G + discount^m * Q_target(s', a*), a* from the online net (double Q) or the target net."""
    selector = target_next_q if online_next_q is None else online_next_q
    best = jnp.argmax(selector, axis=-1)
    next_value = jnp.take_along_axis(target_next_q, best[..., None], axis=-1)[..., 0]
    return n_step_return + bootstrap_discount * next_value


def huber(errors: jax.Array, delta: float = 1.0) -> jax.Array:
    absolute = jnp.abs(errors)
    return jnp.where(absolute <= delta, 0.5 * errors**2, delta * (absolute - 0.5 * delta))


def squared(errors: jax.Array) -> jax.Array:
    return 0.5 * errors**2


def td_errors(params: Any, target_params: Any, batch: Transition, network: nn.Module,
              double_q: bool) -> tuple[jax.Array, jax.Array]:
    """(n-step double/plain Q target - Q(s, a), Q(s, a)) for a batch of replay items."""
    q_values = network.apply(params, batch.obs)
    chosen = jnp.take_along_axis(q_values, batch.action[:, None], axis=-1)[:, 0]
    online_next = network.apply(params, batch.bootstrap_obs) if double_q else None
    targets = q_targets(batch.n_step_return, batch.bootstrap_discount,
                        network.apply(target_params, batch.bootstrap_obs), online_next)
    return jax.lax.stop_gradient(targets) - chosen, chosen
