"""PPO's losses per step as small pure functions (rlax style): the clipped surrogate, the (clipped) value errors,
the diagnostics of the ratio, and the mean over the steps that count."""
from typing import Optional

import jax
import jax.numpy as jnp


def clipped_surrogate(ratio: jax.Array, advantages: jax.Array, clip_eps: float) -> jax.Array:
    """PPO's objective per step (to maximise): the smaller of the ratio's and the clipped ratio's advantage."""
    return jnp.minimum(ratio * advantages, jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * advantages)


def value_errors(value: jax.Array, acted_value: jax.Array, targets: jax.Array, clip_eps: Optional[float]
                 ) -> jax.Array:
    """Squared value errors per step; with `clip_eps`, the larger of the plain and the clipped one (the new value
    kept within clip_eps of the value the actor had), as PureJaxRL and CleanRL."""
    errors = jnp.square(value - targets)
    if clip_eps is None:
        return errors
    clipped = acted_value + jnp.clip(value - acted_value, -clip_eps, clip_eps)
    return jnp.maximum(errors, jnp.square(clipped - targets))


def approx_kl(log_ratio: jax.Array) -> jax.Array:
    """Per step (r - 1) - log r of the ratio r = exp(log_ratio): its mean estimates KL(acting || new) without bias,
    and every term is >= 0 (Schulman's k3 estimator, CleanRL's approx_kl)."""
    return (jnp.exp(log_ratio) - 1.0) - log_ratio


def outside_clip_range(ratio: jax.Array, clip_eps: float) -> jax.Array:
    """Per step True where the ratio is farther than clip_eps from 1 (its mean: the clip fraction)."""
    return jnp.abs(ratio - 1.0) > clip_eps


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """The mean over the steps where `mask` is 1; an all-zero mask gives 0, not NaN."""
    return (values * mask).sum() / jnp.maximum(mask.sum(), 1.0)
