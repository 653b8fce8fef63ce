"""Replay for stacked-frame observations (Atari): each frame stored once, stacks and n-step
transitions rebuilt at sampling time (Dopamine's circular buffer), one ring per env.

An 84x84x4 observation stored with its next observation takes 56 KB per item; here a step takes
one frame (7 KB) and a few bytes of action, reward and flags. All envs write in lockstep: the
absolute position p of every env lives in slot p % capacity_per_env, and the state keeps the
position where the next block starts. Step t of a block written at position h fills slot h + t;
the block's last `next_frame` fills slot h + T, which the next block's first `frame` (the same
frame, unless the stream restarts) overwrites.

The item at position p is the one `nstep.oldest_transition` builds for the item replay: obs is the
stack of frames p - stack + 1 .. p (the frames before an episode's first observation zeroed) and
the n-step part runs over steps p .. p + n - 1 through `n_step_transition`, bootstrapping from the
stack at the position after the last step that counts. An item is valid where the engine acted at
p (no reset step), position p + n is written, the stack's oldest frame p - stack + 1 is still in
the ring (so no frame it or its bootstrap stack reads was overwritten), and no restarted stream
(`fresh`) begins within p + 1 .. p + n.

Prioritised (Ape-X): one sum tree over all num_envs * capacity_per_env slots (flat index
env * capacity_per_env + slot), with leaf 0 wherever the item is not valid, so that a draw with a
nonzero probability is a valid item.
"""
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
from flashbax.buffers import sum_tree
from flax import struct

from lightspeed.algorithms.common.prioritized_replay import set_leaves, stratified_sample
from lightspeed.algorithms.common.targets import n_step_transition
from lightspeed.algorithms.common.transition import Transition


@struct.dataclass
class FrameReplayState:
    """Per-env rings [num_envs, capacity_per_env, ...], indexed by slot."""

    frames: jax.Array  # [num_envs, capacity, H, W]: the newest frame of each position's observation
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    start: jax.Array  # the observation is an episode's first: its stack is zero-padded before it
    acted: jax.Array  # an item may start here: the engine acted, and no later restart cut its window
    write_position: jax.Array  # absolute position of the next block's first step: the newest frame's
    sum_tree_state: Optional[sum_tree.SumTreeState] = None  # prioritised only


class FrameStep(NamedTuple):
    """One vector step as the frame replay stores it, [num_envs, ...] (a block of them: [T, num_envs, ...])."""

    frame: jax.Array  # [..., H, W]: the newest frame of the observation acted on
    next_frame: jax.Array  # [..., H, W]: the newest frame of the observation after the step, before any reset
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array  # no bootstrap: a real end or a lost life
    truncated: jax.Array  # bootstrap from the final observation
    acted: jax.Array  # False: the engine spent the step on a reset
    start: jax.Array  # the observation is an episode's first
    fresh: jax.Array  # it begins a new stream (so also an episode) that the ring's previous content does not lead to


class FrameReplay(NamedTuple):
    init: Any  # () -> an empty state
    add: Any  # (state, FrameStep of [T, num_envs, ...], priorities [T, num_envs] or None) -> state
    sample: Any  # (state, random_bits [batch] uint32 | uniforms [batch]) -> (batch, indices, probabilities)
    set_priorities: Any  # (state, indices, priorities) -> state; raw priorities; None for uniform replay
    gather_items: Any  # (state, flat indices [B]) -> the Transitions stored there, `valid` marking the usable ones
    bytes_per_transition: float  # storage of the whole state / (num_envs * capacity_per_env)


def make_frame_replay(num_envs: int, capacity_per_env: int, frame_shape: tuple[int, int], frame_dtype: Any,
                      stack: int, n_step: int, discount: float, batch_size: int,
                      priority_exponent: float | None = None) -> FrameReplay:
    """Uniform replay if `priority_exponent` is None, else prioritised with that exponent.

    `add` takes a block of steps, a FrameStep of [T, num_envs] arrays. Its `priorities[t]` belong to the item at
    position h + t - n + 1, whose window that step completes (h: the block's write position).
    """
    capacity = capacity_per_env
    if stack + n_step > capacity:
        raise ValueError(f"capacity_per_env {capacity} holds no item of stack {stack} and n_step {n_step}")
    num_slots = num_envs * capacity

    def init() -> FrameReplayState:
        per_slot = lambda dtype: jnp.zeros((num_envs, capacity), dtype)
        tree = None if priority_exponent is None else sum_tree.init(num_slots)
        return FrameReplayState(jnp.zeros((num_envs, capacity, *frame_shape), frame_dtype), per_slot(jnp.int32),
                                per_slot(jnp.float32), per_slot(bool), per_slot(bool), per_slot(bool),
                                per_slot(bool), jnp.int32(0), tree)

    def position_of(state: FrameReplayState, slot: jax.Array) -> jax.Array:
        """The absolute position a slot holds: the newest one written there (negative: never written)."""
        return state.write_position - (state.write_position - slot) % capacity

    def is_valid(state: FrameReplayState, env: jax.Array, position: jax.Array) -> jax.Array:
        newest = state.write_position
        # env >= num_envs: a leaf of the sum tree's padding to a power of two
        return ((env < num_envs) & (position >= 0) & state.acted[env, position % capacity]
                & (position + n_step <= newest) & (position - stack + 1 >= newest - capacity + 1))

    def stacked(state: FrameReplayState, env: jax.Array, position: jax.Array) -> jax.Array:
        """[B, H, W, stack]: the frames of positions position - stack + 1 .. position, oldest first."""
        slots = (position[:, None] + jnp.arange(1 - stack, 1)) % capacity
        frames = state.frames[env[:, None], slots]
        starts = state.start[env[:, None], slots]
        # a frame belongs to an earlier episode if a later frame of the stack starts one
        later_starts = jnp.cumsum(starts[:, ::-1], axis=1)[:, ::-1] - starts
        frames = jnp.where((later_starts == 0)[:, :, None, None], frames, jnp.zeros((), frames.dtype))
        return jnp.moveaxis(frames, 1, -1)

    def gather_items(state: FrameReplayState, indices: jax.Array) -> Transition:
        """The items at flat indices env * capacity_per_env + slot, as `nstep.oldest_transition` builds them."""
        env, position = indices // capacity, position_of(state, indices % capacity)
        window = position[:, None] + jnp.arange(n_step)
        per_step = lambda field: field[env[:, None], window % capacity].T  # [n, B]: n_step_transition's layout
        # positions stand in for the next observations: the bootstrap comes back as a position
        n_step_return, bootstrap_position, bootstrap_discount = n_step_transition(
            per_step(state.reward), per_step(state.terminated), per_step(state.truncated), (window + 1).T, discount)
        return Transition(obs=stacked(state, env, position), action=state.action[env, position % capacity],
                          n_step_return=n_step_return, bootstrap_obs=stacked(state, env, bootstrap_position),
                          bootstrap_discount=bootstrap_discount,
                          valid=is_valid(state, env, position).astype(jnp.float32))

    def write(state: FrameReplayState, steps: FrameStep) -> FrameReplayState:
        block, start = steps.frame.shape[0], state.write_position
        if block + n_step > capacity:
            raise ValueError(f"a block of {block} steps with n_step {n_step} overlaps itself in {capacity} slots")
        env_major = lambda x: jnp.swapaxes(x, 0, 1)  # [T, num_envs, ...] -> the ring's [num_envs, T, ...]
        slots = (start + jnp.arange(block + 1)) % capacity
        frames = jnp.concatenate([steps.frame, steps.next_frame[-1:]])
        # a restarted stream's first observation begins an episode; after a reset step the next one does
        starts = jnp.concatenate([steps.start | steps.fresh, ~steps.acted[-1:]])
        # a stream restarting at q cuts the windows of the items at q - n .. q - 1
        fresh_so_far = jnp.cumsum(jnp.pad(steps.fresh, ((n_step, n_step), (0, 0))), axis=0)
        cut = fresh_so_far[n_step:] - fresh_so_far[:-n_step] > 0  # positions start - n .. start + T - 1
        acted_slots = (start - n_step + jnp.arange(block + n_step)) % capacity
        acted = jnp.concatenate([env_major(state.acted[:, acted_slots[:n_step]]), steps.acted]) & ~cut
        set_steps = lambda stored, new: stored.at[:, slots[:-1]].set(env_major(new))
        return state.replace(
            frames=state.frames.at[:, slots].set(env_major(frames)),
            action=set_steps(state.action, steps.action), reward=set_steps(state.reward, steps.reward),
            terminated=set_steps(state.terminated, steps.terminated),
            truncated=set_steps(state.truncated, steps.truncated),
            start=state.start.at[:, slots].set(env_major(starts)),
            acted=state.acted.at[:, acted_slots].set(env_major(acted)), write_position=start + block)

    to_leaf = lambda priorities: jnp.where(priorities > 0, priorities, 0.0) ** priority_exponent

    def refresh_leaves(state: FrameReplayState, block_start: jax.Array, priorities: jax.Array) -> FrameReplayState:
        """After a write: the items it completed take their priorities, and every slot whose item it
        changed is 0 unless valid (incomplete, overwritten, its stack's oldest frame gone, or cut)."""
        block = priorities.shape[0]
        # the written slots and the n before them (cut by a restart), and the tail that lost its oldest frame
        touched = jnp.concatenate([block_start - n_step + jnp.arange(block + n_step + 1),
                                   block_start - capacity + stack + jnp.arange(block)]) % capacity
        env, position = jnp.arange(num_envs)[:, None], position_of(state, touched)
        completed = position - (block_start - n_step + 1)  # the step of the block that completed the item
        given = to_leaf(priorities[jnp.clip(completed, 0, block - 1)].T)
        indices = env * capacity + touched
        current = state.sum_tree_state.nodes[2**state.sum_tree_state.tree_depth - 1 + indices]
        # a slot listed twice gets one value: it is computed from the slot's state after the write
        leaves = jnp.where((completed >= 0) & (completed < block), given, current) * is_valid(state, env, position)
        return state.replace(sum_tree_state=set_leaves(state.sum_tree_state, indices.ravel(), leaves.ravel()))

    def add(state: FrameReplayState, steps: FrameStep, priorities: jax.Array | None = None) -> FrameReplayState:
        block_start = state.write_position
        state = write(state, steps)
        return state if priority_exponent is None else refresh_leaves(state, block_start, priorities)

    def check_batch(draws: jax.Array) -> None:
        if draws.shape != (batch_size,):
            raise ValueError(f"expected one draw per item of a batch of {batch_size}, got shape {draws.shape}")

    def sample_uniform(state: FrameReplayState, random_bits: jax.Array) -> tuple[Transition, jax.Array, jax.Array]:
        """Drawn uniformly (modulo bias < stored / 2^32) over the positions where the ring's bounds allow
        an item: a stack inside the ring, a written window; others (reset steps, cut) come back invalid."""
        check_batch(random_bits)
        first = jnp.maximum(state.write_position - capacity + stack, 0)
        per_env = jnp.maximum(state.write_position - n_step - first + 1, 1)  # an empty ring: one invalid draw
        draws = (random_bits % (num_envs * per_env).astype(jnp.uint32)).astype(jnp.int32)
        indices = draws // per_env * capacity + (first + draws % per_env) % capacity
        return gather_items(state, indices), indices, jnp.full(random_bits.shape, 1.0 / (num_envs * per_env))

    def sample_prioritized(state: FrameReplayState, uniforms: jax.Array) -> tuple[Transition, jax.Array, jax.Array]:
        """`uniforms` in [0, 1), one per stratum; an item drawn with probability 0 comes back invalid."""
        check_batch(uniforms)
        indices, probabilities = stratified_sample(state.sum_tree_state, uniforms)
        batch = gather_items(state, indices)
        return batch._replace(valid=batch.valid * (probabilities > 0)), indices, probabilities

    def set_priorities(state: FrameReplayState, indices: jax.Array, priorities: jax.Array) -> FrameReplayState:
        """Raw priorities (the exponent applied here); an invalid item's stays 0, so it is never drawn."""
        valid = is_valid(state, indices // capacity, position_of(state, indices % capacity))
        return state.replace(sum_tree_state=set_leaves(state.sum_tree_state, indices, to_leaf(priorities) * valid))

    bytes_per_transition = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(jax.eval_shape(init))) / num_slots
    if priority_exponent is None:
        return FrameReplay(init, add, sample_uniform, None, gather_items, bytes_per_transition)
    return FrameReplay(init, add, sample_prioritized, set_priorities, gather_items, bytes_per_transition)
