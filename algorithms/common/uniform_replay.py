"""Uniform replay on Flashbax 0.1.3's item buffer, sampled from random bits drawn for many batches at once.

Flashbax's `sample` takes a key and spends two splits and two `randint`s per batch: six threefry
loops inside the learner loop, each compiled and run on its own. Here one `bits` draw before the
loop serves every batch of an update (`random_bits` [batches, batch_size]); a batch is a gather.
"""
from typing import Any, NamedTuple

import flashbax as fbx
import jax
import jax.numpy as jnp


class UniformReplay(NamedTuple):
    init: Any  # example item -> state
    add: Any  # (state, items [steps, ...]) -> state, oldest items overwritten first
    sample: Any  # (state, random_bits [batch_size] uint32) -> items [batch_size, ...]


def make_uniform_replay(capacity: int, batch_size: int) -> UniformReplay:
    """A buffer of `capacity` items; a batch is as large as its `random_bits` (the learners gate on env steps)."""
    # Flashbax requires a minimum and a batch size; only its own can_sample and sample read them
    buffer = fbx.make_item_buffer(max_length=capacity, min_length=batch_size, sample_batch_size=batch_size,
                                  add_sequences=True)

    def sample(state: Any, random_bits: jax.Array) -> Any:
        """Stored items drawn uniformly with replacement (modulo bias < stored / 2^32)."""
        stored = jnp.where(state.is_full, capacity, jnp.maximum(state.current_index, 1)).astype(jnp.uint32)
        slots = (random_bits % stored).astype(jnp.int32)
        return jax.tree.map(lambda x: x[0, slots], state.experience)  # one row: [1, capacity, ...]

    return UniformReplay(buffer.init, buffer.add, sample)
