"""Flax Q-networks shared by DQN and Ape-X."""
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

ACTIVATIONS = {"relu": nn.relu, "tanh": nn.tanh, "gelu": nn.gelu, "silu": nn.silu, "elu": nn.elu}


class QNetwork(nn.Module):
    """An MLP torso and a Q head: plain, or dueling (value + advantage minus its mean)."""

    num_actions: int
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "relu"
    dueling: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        activation = ACTIVATIONS[self.activation]
        features = obs.reshape(*obs.shape[: obs.ndim - 1], -1).astype(jnp.float32)
        for size in self.hidden_sizes:
            features = activation(nn.Dense(size)(features))
        if not self.dueling:
            return nn.Dense(self.num_actions)(features)
        value = nn.Dense(1)(features)
        advantages = nn.Dense(self.num_actions)(features)
        return value + advantages - advantages.mean(axis=-1, keepdims=True)
