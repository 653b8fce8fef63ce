"""Actor-side n-step transitions: a rolling window of the last n steps of every env."""
from typing import Optional

import jax
import jax.numpy as jnp
from flax import struct

from lightspeed.algorithms.common.targets import n_step_transition
from lightspeed.algorithms.common.transition import Transition


@struct.dataclass
class NStepWindow:
    """The last n steps of every env, oldest first: [n, num_envs, ...]."""

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    next_obs: jax.Array
    filled: jax.Array  # steps pushed so far, capped at n
    # host envs only: False where the engine spent the step on a reset (no item starts there); None: always acted
    acted: Optional[jax.Array] = None


def empty_window(obs: jax.Array, n: int, host: bool = False, action: Optional[jax.ShapeDtypeStruct] = None
                 ) -> NStepWindow:
    """A window for envs whose current observations are `obs` [num_envs, ...]; `host`: it records `acted`.
    `action`: one env's action (shape and dtype), by default an integer []; a Box env's are float vectors."""
    action = action or jax.ShapeDtypeStruct((), jnp.int32)
    per_env = lambda dtype, shape=(): jnp.zeros((n, obs.shape[0], *shape), dtype)
    no_obs = jnp.zeros((n, *obs.shape), obs.dtype)
    return NStepWindow(no_obs, per_env(action.dtype, action.shape), per_env(jnp.float32), per_env(bool),
                       per_env(bool), no_obs, jnp.int32(0), per_env(bool) if host else None)


def push(window: NStepWindow, step: dict, n: int) -> NStepWindow:
    """Drop the oldest step of each env's window and append the newest."""
    shift = lambda old, new: jnp.concatenate([old[1:], new[None]], axis=0)
    fields = {k: shift(getattr(window, k), v) for k, v in step.items()}
    return NStepWindow(**fields, filled=jnp.minimum(window.filled + 1, n))


def oldest_transition(window: NStepWindow, discount: float) -> Transition:
    """The replay item that starts at the window's oldest step, valid once the window is full."""
    n_step_return, bootstrap_obs, bootstrap_discount = n_step_transition(
        window.reward, window.terminated, window.truncated, window.next_obs, discount)
    num_envs = window.reward.shape[1]
    valid = jnp.broadcast_to(window.filled >= window.reward.shape[0], (num_envs,))
    if window.acted is not None:
        valid = valid & window.acted[0]
    return Transition(obs=window.obs[0], action=window.action[0], n_step_return=n_step_return,
                      bootstrap_obs=bootstrap_obs, bootstrap_discount=bootstrap_discount,
                      valid=valid.astype(jnp.float32))
