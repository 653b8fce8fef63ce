"""Prioritised replay of overlapping sequences (R2D2), each step stored once, one ring per env.

The actors send every step (`StepRecord`); the replay keeps each env's steps in a ring of `capacity_per_env`
positions and a sequence starts at every `period`-th position, `length` steps long: adjacent sequences share
length - period steps, stored once. All envs write in lockstep, blocks of a multiple of `period` steps, so the
absolute position p of every env lives in slot p % capacity_per_env and sequence slot k holds the sequence
starting at the newest position written there that is k * period modulo the ring.

Each sequence slot keeps the recurrent state the actor held at its first step (the stored state R2D2 replays)
and a leaf in one sum tree over every env's slots (flat index env * slots_per_env + k). A leaf is 0 unless its
sequence is complete and intact: a write zeroes the slots it overwrites and gives the sequences it completes
their first priority, computed from the Q-values the actors acted with (`initial_priorities`), so a draw with a
nonzero probability is a whole sequence.
"""
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from flashbax.buffers import sum_tree
from flax import struct

from lightspeed.algorithms.common.prioritized_replay import set_leaves, stratified_sample


class StepRecord(NamedTuple):
    """One env step as an R2D2 actor records it: every field [..., per step]."""

    obs: jax.Array  # the observation acted on
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    start: jax.Array  # obs begins an episode (the actor's state was zeroed there)
    acted: jax.Array  # False: the engine spent the step on a reset
    state: Any  # the recurrent state the actor acted on obs from (after its reset where `start`)
    q: jax.Array  # the actor's Q-values at obs: its initial priorities' TD errors


@struct.dataclass
class SequenceReplayState:
    steps: StepRecord  # every field but `state`: [num_envs, capacity_per_env, ...]; `state`: None
    states: Any  # [num_envs, slots_per_env, ...] the recurrent state at each sequence slot's first step
    write_position: jax.Array  # the absolute position of the next block's first step
    sum_tree_state: sum_tree.SumTreeState


class Sequences(NamedTuple):
    """A batch of sampled sequences: steps [B, length, ...] and the state at their first step [B, ...]."""

    steps: StepRecord
    state: Any


class SequenceReplay(NamedTuple):
    init: Callable[[StepRecord], SequenceReplayState]  # one env's example step -> an empty replay
    add: Callable[..., SequenceReplayState]  # (state, steps [T, num_envs, ...], T a multiple of period) -> state
    sample: Callable[..., tuple[Sequences, jax.Array, jax.Array]]  # (state, uniforms [B]) -> (batch, slots, probs)
    set_priorities: Callable[..., SequenceReplayState]  # (state, slots, raw priorities) -> state
    stored_priorities: Callable[[SequenceReplayState], jax.Array]  # raw priority of every slot (0: none)


def make_sequence_replay(num_envs: int, capacity_per_env: int, length: int, period: int, batch_size: int,
                         priority_exponent: float,
                         initial_priorities: Callable[[StepRecord], jax.Array]) -> SequenceReplay:
    """`initial_priorities`: sequences' steps [K, length, ...] -> their raw priorities [K]."""
    capacity, slots_per_env = capacity_per_env, capacity_per_env // period
    if capacity % period:
        raise ValueError(f"capacity_per_env {capacity} is not a multiple of the sequence period {period}")

    def init(example: StepRecord) -> SequenceReplayState:
        per_position = lambda x: jnp.zeros((num_envs, capacity, *jnp.shape(x)), jnp.asarray(x).dtype)
        per_slot = lambda x: jnp.zeros((num_envs, slots_per_env, *jnp.shape(x)), jnp.asarray(x).dtype)
        steps = jax.tree.map(per_position, example._replace(state=None))
        return SequenceReplayState(steps, jax.tree.map(per_slot, example.state), jnp.int32(0),
                                   sum_tree.init(num_envs * slots_per_env))

    def gather(state: SequenceReplayState, env: jax.Array, first: jax.Array) -> StepRecord:
        """Steps [K, length, ...] from absolute positions `first` [K] of envs `env` [K]."""
        positions = (first[:, None] + jnp.arange(length)) % capacity
        return jax.tree.map(lambda x: x[env[:, None], positions], state.steps)

    to_leaf = lambda priorities: jnp.where(priorities > 0, priorities, 0.0) ** priority_exponent

    def add(state: SequenceReplayState, records: StepRecord) -> SequenceReplayState:
        block, write = records.reward.shape[0], state.write_position
        if block % period or block + length > capacity:
            raise ValueError(f"a block of {block} steps must be a multiple of the period {period} and fit with a "
                             f"sequence of {length} in {capacity} positions")
        env_major = lambda x: jnp.swapaxes(x, 0, 1)  # [T, num_envs, ...] -> the ring's [num_envs, T, ...]
        positions = (write + jnp.arange(block)) % capacity
        steps = jax.tree.map(lambda stored, new: stored.at[:, positions].set(env_major(new)), state.steps,
                             records._replace(state=None))
        new_slots = (write + jnp.arange(0, block, period)) % capacity // period
        states = jax.tree.map(lambda stored, new: stored.at[:, new_slots].set(env_major(new[::period])),
                              state.states, records.state)
        state = state.replace(steps=steps, states=states, write_position=write + block)
        envs = jnp.arange(num_envs)[:, None]
        # the slots written now begin sequences not complete yet (and end the ones stored there before)
        tree = set_leaves(state.sum_tree_state, (envs * slots_per_env + new_slots).ravel(),
                          jnp.zeros(num_envs * new_slots.size))
        # the sequences whose last step this block wrote: starts in (write - length, write + block - length]
        first = -(-(write - length + 1) // period) * period + jnp.arange(0, block, period)
        env, start = jnp.repeat(jnp.arange(num_envs), first.size), jnp.tile(first, num_envs)
        priorities = to_leaf(initial_priorities(gather(state, env, start % capacity))) * (start >= 0)
        tree = set_leaves(tree, env * slots_per_env + start % capacity // period, priorities)
        return state.replace(sum_tree_state=tree)

    def sample(state: SequenceReplayState, uniforms: jax.Array) -> tuple[Sequences, jax.Array, jax.Array]:
        """`uniforms` in [0, 1), one per stratum; a sequence drawn with probability 0 is not whole (weight it 0)."""
        slots, probabilities = stratified_sample(state.sum_tree_state, uniforms)
        env, slot = slots // slots_per_env, slots % slots_per_env
        env = jnp.minimum(env, num_envs - 1)  # a leaf of the tree's padding to a power of two (probability 0)
        steps = gather(state, env, slot * period)
        initial = jax.tree.map(lambda x: x[env, slot], state.states)
        return Sequences(steps, initial), slots, probabilities

    def set_priorities(state: SequenceReplayState, slots: jax.Array, priorities: jax.Array) -> SequenceReplayState:
        """Raw priorities (the exponent applied here); a slot drawn twice must carry one value."""
        return state.replace(sum_tree_state=set_leaves(state.sum_tree_state, slots, to_leaf(priorities)))

    def stored_priorities(state: SequenceReplayState) -> jax.Array:
        tree = state.sum_tree_state
        leaves = tree.nodes[2**tree.tree_depth - 1:]
        return jnp.where(leaves > 0, leaves, 0.0) ** (1.0 / priority_exponent)

    return SequenceReplay(init, add, sample, set_priorities, stored_priorities)
