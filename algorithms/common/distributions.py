"""The action distributions of a stochastic policy, one env's: a Categorical over Discrete actions, a diagonal
Gaussian over a Box's flattened entries (the sample taken as it is: the framework clips it to the bounds for the
env, and its log-prob is of the unclipped sample, as in CleanRL's and Stable-Baselines3's PPO)."""
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

LOG_2PI = math.log(2 * math.pi)


class Categorical(NamedTuple):
    logits: jax.Array  # [A]

    def sample(self, key: jax.Array) -> jax.Array:
        return jax.random.categorical(key, self.logits).astype(jnp.int32)

    def log_prob(self, action: jax.Array) -> jax.Array:
        return jnp.take(jax.nn.log_softmax(self.logits), action)

    def entropy(self) -> jax.Array:
        log_p = jax.nn.log_softmax(self.logits)
        return -(jnp.exp(log_p) * log_p).sum()


class DiagonalGaussian(NamedTuple):
    mean: jax.Array  # [A]
    log_std: jax.Array  # [A]

    def sample(self, key: jax.Array) -> jax.Array:
        return self.mean + jnp.exp(self.log_std) * jax.random.normal(key, self.mean.shape)

    def log_prob(self, action: jax.Array) -> jax.Array:
        z = (action - self.mean) * jnp.exp(-self.log_std)
        return (-0.5 * jnp.square(z) - self.log_std - 0.5 * LOG_2PI).sum()

    def entropy(self) -> jax.Array:
        return (self.log_std + 0.5 * (1.0 + LOG_2PI)).sum()
