"""DQN's uniform replay: draws spread evenly over the stored items only, before and after wrapping."""
import jax
import jax.numpy as jnp
import numpy as np

from lightspeed.algorithms.common.uniform_replay import make_uniform_replay


def _counts(replay, state, draws, capacity):
    sample = jax.jit(lambda bits: replay.sample(state, bits)["id"])
    bits = jax.random.bits(jax.random.key(0), (draws, 256), jnp.uint32)
    return np.bincount(np.concatenate([np.asarray(sample(batch)) for batch in bits]), minlength=capacity + 40)


def _chi_square_uniform(counts):
    expected = counts.sum() / len(counts)
    return float(((counts - expected) ** 2 / expected).sum())


def test_a_partly_filled_buffer_samples_only_what_it_holds():
    replay = make_uniform_replay(capacity=64, batch_size=16)
    state = replay.add(replay.init({"id": jnp.int32(0)}), {"id": jnp.arange(40, dtype=jnp.int32)})
    counts = _counts(replay, state, draws=200, capacity=64)
    assert counts[40:].sum() == 0
    # 99.9% critical value of chi-square with 39 degrees of freedom is 72.1
    assert _chi_square_uniform(counts[:40]) < 72.1


def test_a_wrapped_buffer_samples_the_newest_capacity_items():
    replay = make_uniform_replay(capacity=64, batch_size=16)
    state = replay.init({"id": jnp.int32(0)})
    for start in (0, 40, 80):  # 120 items through 64 slots: ids 56..119 remain
        state = replay.add(state, {"id": jnp.arange(start, start + 40, dtype=jnp.int32)})
    counts = _counts(replay, state, draws=200, capacity=64)[:120]
    assert counts[:56].sum() == 0
    # 99.9% critical value of chi-square with 63 degrees of freedom is 103.4
    assert _chi_square_uniform(counts[56:]) < 103.4
