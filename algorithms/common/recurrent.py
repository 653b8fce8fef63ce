"""A recurrent Q-network (R2D2's): the Q-network's torso, an LSTM, its Q head; and its unroll over a sequence.

An LSTM, as in the R2D2 paper and Acme: its state is what the stored-state ablation is about, and an LSTM's
separate cell keeps a cue over long delays better than a GRU of the same width at these sizes.
"""
from typing import Any, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from lightspeed.algorithms.common.networks import make_q_network, q_head, torso_features


def polar_orthogonal(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
    """An orthogonal initializer by matmuls alone: the polar factor of a Gaussian matrix (Haar-distributed, as the
    QR-based `nn.initializers.orthogonal`) by Newton-Schulz iterations. XLA's CPU QR (a LAPACK call) hung at
    random (2 runs in 3) inside the vmapped init over seeds on a device axis: the LSTM's recurrent kernel avoids it."""
    rows, columns = shape[-2], shape[-1]
    x = jax.random.normal(key, (max(rows, columns), min(rows, columns)), jnp.float32)
    x = x / jnp.linalg.norm(x)  # singular values in (0, 1]: the iteration below then converges to 1
    # a loop, not 60 unrolled steps: XLA's CPU backend at optimization level 0 (the trainer's init) turned the
    # unrolled chain into NaN for one seed
    x = jax.lax.fori_loop(0, POLAR_ITERATIONS, lambda _, x: 1.5 * x - 0.5 * x @ (x.T @ x), x)
    return (x if rows >= columns else x.T).reshape(shape).astype(dtype)


POLAR_ITERATIONS = 60  # from x / |x|_F the smallest singular value grows 1.5x per step until near 1, then converges


class LSTMState(NamedTuple):
    """An LSTM's recurrent state, [..., lstm_size] each."""

    cell: jax.Array
    hidden: jax.Array


class RecurrentQNetwork(nn.Module):
    """torso (QNetwork's: mlp, conv or nature) -> LSTM -> Q head (plain or dueling), one step at a time."""

    num_actions: int
    lstm_size: int = 64
    hidden_sizes: Sequence[int] = (64,)
    activation: str = "relu"
    dueling: bool = True
    layer_norm: bool = False
    torso: str = "mlp"
    conv_channels: Sequence[int] = (16,)
    conv_dense: int = 128
    observation_ndim: int = 1

    @nn.compact
    def __call__(self, state: LSTMState, obs: jax.Array) -> tuple[LSTMState, jax.Array]:
        """(state, obs [..., *observation]) -> (next state, Q-values [..., num_actions])."""
        (cell, hidden), output = nn.OptimizedLSTMCell(self.lstm_size, recurrent_kernel_init=polar_orthogonal)(
            tuple(state), torso_features(self, obs))
        return LSTMState(cell, hidden), q_head(self, output)


def zero_state(lstm_size: int, batch_shape: tuple[int, ...] = ()) -> LSTMState:
    zeros = jnp.zeros((*batch_shape, lstm_size), jnp.float32)
    return LSTMState(zeros, zeros)


def reset_where(start: jax.Array, state: LSTMState) -> LSTMState:
    """The state zeroed where `start` [...] says an episode begins (an LSTM starts every episode from zeros)."""
    return jax.tree.map(lambda x: jnp.where(start[..., None], jnp.zeros_like(x), x), state)


def unroll(network: RecurrentQNetwork, params: Any, state: LSTMState, obs: jax.Array, start: jax.Array
           ) -> tuple[LSTMState, jax.Array]:
    """Q-values along a sequence, time first: obs [T, ...], start [T, ...] (the state is zeroed where an episode
    begins, as the actor zeroed it), from `state` at its first step -> (the state after the last step, Q [T, ...])."""
    def one_step(state: LSTMState, step: tuple[jax.Array, jax.Array]) -> tuple[LSTMState, jax.Array]:
        obs, start = step
        return network.apply(params, reset_where(start, state), obs)

    return jax.lax.scan(one_step, state, (obs, start))


def make_recurrent_q_network(config: Any, env: Any) -> RecurrentQNetwork:
    """The recurrent Q-network an algorithm config describes (its torso chosen and checked as make_q_network's)."""
    q = make_q_network(config, env)
    return RecurrentQNetwork(q.num_actions, config.lstm_size, q.hidden_sizes, q.activation, q.dueling, q.layer_norm,
                             q.torso, q.conv_channels, q.conv_dense, q.observation_ndim)
