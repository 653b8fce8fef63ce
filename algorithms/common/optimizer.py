"""Clipped Adam whose step size is set at every update: a learning rate that decays with the env steps.

The decay follows the seed's env steps, not the optimizer's count, so one key (`lr_decay_env_steps`,
by default the run's `total_env_steps`) means the same for every algorithm, learning start and
number of learner devices.
"""
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax.training.train_state import TrainState

from lightspeed.framework.core.errors import check_number, check_positive_int


def clipped_adam(max_grad_norm: float) -> optax.GradientTransformation:
    """Adam's direction (unit step size) after clipping the gradient's global norm."""
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.scale_by_adam())


def decayed_learning_rate(learning_rate: float, final_fraction: float, decay_env_steps: int,
                          env_steps: jax.Array) -> jax.Array:
    """Linear from `learning_rate` to `final_fraction * learning_rate` over `decay_env_steps` (0: constant)."""
    if not decay_env_steps:
        return jnp.float32(learning_rate)
    progress = jnp.minimum(env_steps / decay_env_steps, 1.0)
    return learning_rate * (1.0 - (1.0 - final_fraction) * progress)


def apply_gradients(train_state: TrainState, grads: Any, learning_rate: jax.Array) -> TrainState:
    """One descent step of `learning_rate` along the optimizer's direction (`train_state.tx`: clipped_adam)."""
    direction, opt_state = train_state.tx.update(grads, train_state.opt_state, train_state.params)
    params = optax.apply_updates(train_state.params, jax.tree.map(lambda d: -learning_rate * d, direction))
    return train_state.replace(step=train_state.step + 1, params=params, opt_state=opt_state)


def check_learning_rate_config(learning_rate: float, decay_env_steps: int, final_fraction: float) -> None:
    """`algo.learning_rate`, `algo.lr_decay_env_steps` and `algo.lr_final_fraction` of any gradient learner."""
    check_number("algo.learning_rate", learning_rate, 0, low_inclusive=False)
    check_positive_int("algo.lr_decay_env_steps", decay_env_steps, minimum=0)
    check_number("algo.lr_final_fraction", final_fraction, 0, 1)
