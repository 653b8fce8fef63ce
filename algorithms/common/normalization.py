"""Running statistics for observation normalisation and reward scaling (Stable-Baselines3's VecNormalize: the
parallel-variance update of Chan et al., observations clipped to +-10 standard deviations)."""
from typing import NamedTuple

import jax
import jax.numpy as jnp

CLIP = 10.0  # VecNormalize's clip_obs and clip_reward
EPSILON = 1e-8


class RunningStats(NamedTuple):
    count: jax.Array  # [] float32, starts at EPSILON as VecNormalize's
    mean: jax.Array  # [...] per entry
    var: jax.Array  # [...] per entry


def empty_stats(shape: tuple[int, ...]) -> RunningStats:
    return RunningStats(jnp.float32(EPSILON), jnp.zeros(shape, jnp.float32), jnp.ones(shape, jnp.float32))


def updated(stats: RunningStats, values: jax.Array, mask: jax.Array) -> RunningStats:
    """The statistics with the batch `values` [K, ...] folded in, where `mask` [K] holds."""
    weights = mask.astype(jnp.float32).reshape(-1, *([1] * (values.ndim - 1)))
    count = weights.sum()
    batch_mean = (weights * values).sum(axis=0) / jnp.maximum(count, 1.0)
    batch_var = (weights * jnp.square(values - batch_mean)).sum(axis=0) / jnp.maximum(count, 1.0)
    total = stats.count + count
    delta = batch_mean - stats.mean
    mean = stats.mean + delta * count / total
    m2 = stats.var * stats.count + batch_var * count + jnp.square(delta) * stats.count * count / total
    return RunningStats(total, mean, m2 / total)


def normalized(stats: RunningStats, values: jax.Array) -> jax.Array:
    """Values in standard deviations from the running mean, clipped to +-CLIP."""
    return jnp.clip((values - stats.mean) / jnp.sqrt(stats.var + EPSILON), -CLIP, CLIP)


def scaled(stats: RunningStats, rewards: jax.Array) -> jax.Array:
    """Rewards divided by the running standard deviation of the discounted return, clipped to +-CLIP."""
    return jnp.clip(rewards / jnp.sqrt(stats.var + EPSILON), -CLIP, CLIP)
