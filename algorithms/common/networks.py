"""Flax Q-networks and the parameter plumbing shared by DQN and Ape-X."""
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from framework.errors import ConfigError, check, check_choice

MAX_WIDTH = 8192  # a layer of 1e8 units passed the state-size check, then ran out of memory in its activations
ACTIVATIONS = {"relu": nn.relu, "tanh": nn.tanh, "gelu": nn.gelu, "silu": nn.silu, "elu": nn.elu}


class QNetwork(nn.Module):
    """An MLP torso and a Q head: plain, or dueling (value + advantage minus its mean).

    `layer_norm`: LayerNorm between each hidden Dense and its activation (PQN, Gallici et al. 2024),
    which keeps the features' scale fixed while the targets move.
    """

    num_actions: int
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "relu"
    dueling: bool = False
    layer_norm: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        activation = ACTIVATIONS[self.activation]
        features = obs.reshape(*obs.shape[: obs.ndim - 1], -1).astype(jnp.float32)
        for size in self.hidden_sizes:
            features = nn.Dense(size)(features)
            features = activation(nn.LayerNorm()(features) if self.layer_norm else features)
        if not self.dueling:
            return nn.Dense(self.num_actions)(features)
        value = nn.Dense(1)(features)
        advantages = nn.Dense(self.num_actions)(features)
        return value + advantages - advantages.mean(axis=-1, keepdims=True)


def check_network_config(hidden_sizes: Sequence[int], activation: str) -> None:
    """`algo.hidden_sizes` and `algo.activation` of any Q-network algorithm."""
    check(len(hidden_sizes) > 0 and all(isinstance(s, int) and 1 <= s <= MAX_WIDTH for s in hidden_sizes),
          "algo.hidden_sizes", list(hidden_sizes), f"a non-empty list of integers from 1 to {MAX_WIDTH}")
    check_choice("algo.activation", activation, tuple(ACTIVATIONS))


def require_vector_observations(env: Any, algorithm: str) -> None:
    """A network needs feature vectors: grid cells are indices (GridWorld offers one_hot)."""
    if getattr(env, "observation_kind", None) == "cell":
        raise ConfigError("env.observation", "cell", f"one_hot (algo={algorithm} feeds observations to a network)",
                          "grid cells are indices, not features")


def select_tree(condition: jax.Array, new: Any, old: Any) -> Any:
    """`new` where `condition` holds, else `old`, leaf by leaf (a branch-free cond under vmap)."""
    return jax.tree.map(lambda a, b: jnp.where(condition, a, b), new, old)
