"""Prioritised replay on Flashbax 0.1.3, with explicit priorities and a drift-free sum tree.

Flashbax's `add` returns no indices and gives new items the maximum recorded priority truncated
to an integer; its float32 sum tree drifts after very many priority updates (upstream issue 52).
Here `add` computes where each item lands and sets its priority explicitly, and
`rebuild_sum_tree` recomputes every inner node from the leaves.
"""
from typing import Any, NamedTuple

import flashbax as fbx
import jax
import jax.numpy as jnp


class PrioritizedReplay(NamedTuple):
    init: Any  # example item -> state
    add: Any  # (state, items [rows, steps, ...], priorities [rows, steps]) -> state
    sample: Any  # (state, key) -> (items [batch, ...], indices [batch], probabilities [batch])
    set_priorities: Any  # (state, indices, priorities) -> state; raw priorities, the exponent applied inside
    can_sample: Any


def make_prioritized_replay(capacity: int, rows: int, batch_size: int, priority_exponent: float,
                            min_size: int | None = None) -> PrioritizedReplay:
    """A buffer of `capacity` items stored as `rows` rows (one per writer, e.g. per env)."""
    slots_per_row = capacity // rows
    buffer = fbx.make_prioritised_trajectory_buffer(
        add_batch_size=rows, sample_batch_size=batch_size, sample_sequence_length=1, period=1,
        min_length_time_axis=min(slots_per_row, max(1, -(-(min_size or batch_size) // rows))),
        max_length_time_axis=slots_per_row,
        priority_exponent=priority_exponent)

    def add(state: Any, items: Any, priorities: jax.Array) -> Any:
        steps = priorities.shape[1]
        # items land at the write position of every row, one slot per step, wrapping around
        slots = (state.current_index + jnp.arange(steps)) % slots_per_row
        indices = jnp.arange(rows)[:, None] * slots_per_row + slots[None, :]
        state = buffer.add(state, items)
        return buffer.set_priorities(state, indices.ravel(), priorities.ravel())

    def sample(state: Any, key: jax.Array) -> tuple[Any, jax.Array, jax.Array]:
        batch = buffer.sample(state, key)
        items = jax.tree.map(lambda x: x[:, 0], batch.experience)  # drop the length-1 time axis
        return items, batch.indices, batch.probabilities

    return PrioritizedReplay(buffer.init, add, sample, buffer.set_priorities, buffer.can_sample)


def importance_weights(probabilities: jax.Array, num_items: jax.Array, beta: jax.Array) -> jax.Array:
    """w_i = (N * P(i))^-beta, divided by the batch's largest weight (Schaul et al., 2016).

    An item drawn with probability 0 (float32 rounding at the edge of the tree can land on an
    empty slot) gets weight 0 instead of an infinite one.
    """
    drawable = probabilities > 0
    weights = jnp.where(drawable, (num_items * jnp.where(drawable, probabilities, 1.0)) ** -beta, 0.0)
    return weights / jnp.maximum(weights.max(), 1e-30)


def rebuild_sum_tree(state: Any) -> Any:
    """Every inner node recomputed from the leaves: removes the float32 drift of many updates."""
    tree = state.sum_tree_state
    level = tree.nodes[2**tree.tree_depth - 1:]
    levels = [level]
    for _ in range(tree.tree_depth):
        level = level.reshape(-1, 2).sum(axis=1)
        levels.append(level)
    return state.replace(sum_tree_state=tree.replace(nodes=jnp.concatenate(levels[::-1])))
