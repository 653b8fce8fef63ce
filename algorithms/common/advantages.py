"""Advantages as small pure functions (rlax style): GAE(lambda) over a block and their per-minibatch normalisation
(its masked means policy_losses.masked_mean)."""
import jax
import jax.numpy as jnp

from lightspeed.algorithms.common.policy_losses import masked_mean


def gae(rewards: jax.Array, values: jax.Array, next_values: jax.Array, terminated: jax.Array, done: jax.Array,
        acted: jax.Array, discount: float, lam: float) -> tuple[jax.Array, jax.Array]:
    """Advantages and value targets [T, ...] of a block [T, ...] by GAE(lambda), the chain cut after every episode's
    end and zero at reset steps; each step bootstraps from its own next value, so a block's last step needs no more.

    values: at each step's observation; next_values: at the true next observation (the final one where the episode
    ended); terminated: no bootstrap after this step; done: terminated or truncated (the chain is cut after this
    step); acted: False where the engine spent the step on a reset (no transition).
    """
    deltas = rewards + discount * (1.0 - terminated) * next_values - values

    def backwards(after: jax.Array, step: tuple) -> tuple[jax.Array, jax.Array]:
        delta, done, acted = step
        advantage = jnp.where(acted, delta + discount * lam * (1.0 - done) * after, 0.0)
        return advantage, advantage

    _, advantages = jax.lax.scan(backwards, jnp.zeros_like(deltas[0]), (deltas, done, acted), reverse=True)
    return advantages, advantages + values


def normalized(advantages: jax.Array, mask: jax.Array) -> jax.Array:
    """The advantages less their mean, over their std (both over the steps where `mask` is 1), as CleanRL's
    per-minibatch normalisation; an all-zero mask divides by one step, not zero."""
    mean = masked_mean(advantages, mask)
    std = jnp.sqrt(masked_mean(jnp.square(advantages - mean), mask))
    return (advantages - mean) / (std + 1e-8)  # 1e-8: a minibatch of equal advantages gives zeros, not NaNs
