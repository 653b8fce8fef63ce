"""Prioritised replay: explicit priorities land on the right items, sampling follows p^alpha,
importance weights by hand, priority writes agree with Flashbax's own, and the sum tree stays
faithful after >= 1M priority updates."""
import flashbax as fbx
import jax
import jax.numpy as jnp
import numpy as np

from algorithms.common.prioritized_replay import importance_weights, make_prioritized_replay

ALPHA = 0.6


def _filled(capacity=64, rows=4, batch=256):
    """A full buffer, each item holding its own flat index as id, with priority 1 + id % 7."""
    replay = make_prioritized_replay(capacity, rows, batch, ALPHA)
    state = replay.init({"id": jnp.int32(0)})
    slots_per_row, steps = capacity // rows, capacity // rows // 2
    for chunk in range(2):  # two adds, so the write position moves between them
        slots = chunk * steps + jnp.arange(steps)
        ids = jnp.arange(rows)[:, None] * slots_per_row + slots[None, :]
        state = replay.add(state, {"id": ids}, (1 + ids % 7).astype(jnp.float32))
    return replay, state


def _sample_counts(replay, state, draws, num_items, batch):
    sample = jax.jit(lambda uniforms: replay.sample(state, uniforms)[0]["id"])
    uniforms = jax.random.uniform(jax.random.key(0), (draws, batch))
    ids = np.concatenate([np.asarray(sample(positions)) for positions in uniforms])
    return np.bincount(ids, minlength=num_items)


def _chi_square(counts, probabilities):
    expected = probabilities * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_sampling_follows_priorities_to_the_alpha():
    replay, state = _filled()
    counts = _sample_counts(replay, state, draws=400, num_items=64, batch=256)
    ids = np.arange(64)
    expected = (1.0 + ids % 7) ** ALPHA
    # 99.9% critical value of chi-square with 63 degrees of freedom is 103.4
    assert _chi_square(counts, expected / expected.sum()) < 103.4


def test_sampled_probabilities_and_indices_match_the_items():
    replay, state = _filled()
    items, indices, probabilities = replay.sample(state, jax.random.uniform(jax.random.key(1), (256,)))
    ids = np.asarray(items["id"])
    expected = (1.0 + ids % 7) ** ALPHA / ((1.0 + np.arange(64) % 7) ** ALPHA).sum()
    np.testing.assert_allclose(probabilities, expected, rtol=1e-5)
    # setting the priority of a sampled index changes exactly that item's probability
    state = replay.set_priorities(state, indices[:1], jnp.array([0.0]))
    later = np.asarray(replay.sample(state, jax.random.uniform(jax.random.key(2), (256,)))[0]["id"])
    assert ids[0] not in later


def _assert_every_node_sums_its_children(tree):
    nodes = np.asarray(tree.nodes)
    inner = np.arange(2**tree.tree_depth - 1)
    np.testing.assert_allclose(nodes[inner], nodes[2 * inner + 1] + nodes[2 * inner + 2], rtol=1e-6)


def test_priority_writes_match_flashbax_set_priorities():
    replay, state = _filled(capacity=64, rows=4)
    reference = fbx.make_prioritised_trajectory_buffer(
        add_batch_size=4, sample_batch_size=8, sample_sequence_length=1, period=1, min_length_time_axis=1,
        max_length_time_axis=16, priority_exponent=ALPHA)
    indices = jnp.array([3, 17, 17, 40, 63, 0])  # a batch may draw an item twice (same new priority)
    priorities = jnp.array([0.5, 9.0, 9.0, 2.0, 0.0, 1e-6])
    ours = replay.set_priorities(state, indices, priorities).sum_tree_state
    theirs = reference.set_priorities(state, indices, priorities).sum_tree_state
    np.testing.assert_allclose(ours.nodes, theirs.nodes, rtol=1e-6, atol=1e-6)  # theirs: float32 deltas
    _assert_every_node_sums_its_children(ours)


def test_importance_weights_by_hand():
    probabilities = jnp.array([0.5, 0.25, 0.125])
    weights = importance_weights(probabilities, 8, 0.5)
    raw = np.array([(8 * 0.5) ** -0.5, (8 * 0.25) ** -0.5, (8 * 0.125) ** -0.5])
    np.testing.assert_allclose(weights, raw / raw.max(), rtol=1e-6)
    assert float(weights.max()) == 1.0
    with_empty_slot = importance_weights(jnp.array([0.5, 0.0]), 8, 0.5)
    np.testing.assert_allclose(with_empty_slot, [1.0, 0.0])


def test_sampling_stays_faithful_after_a_million_priority_updates():
    replay, state = _filled(capacity=1024, rows=4, batch=512)

    def update_many(state, key):
        def one(state, key):
            index_key, value_key = jax.random.split(key)
            indices = jax.random.randint(index_key, (512,), 0, 1024)
            return replay.set_priorities(state, indices, jax.random.uniform(value_key, (512,), minval=1e-3, maxval=1e3)), None
        return jax.lax.scan(one, state, jax.random.split(key, 2000))[0]

    state = jax.jit(update_many)(state, jax.random.key(3))  # 2000 x 512 = 1,024,000 updates
    final_priorities = jnp.arange(1024, dtype=jnp.float32) % 5 + 1.0
    state = replay.set_priorities(state, jnp.arange(1024), final_priorities)
    tree = state.sum_tree_state
    leaves = np.asarray(tree.nodes[2**tree.tree_depth - 1:], dtype=np.float64)
    # Flashbax's incremental updates leave its root ~4e-4 of the total off at this point
    assert abs(float(tree.nodes[0]) - leaves.sum()) / leaves.sum() < 1e-6
    _assert_every_node_sums_its_children(tree)
    counts = _sample_counts(replay, state, draws=200, num_items=1024, batch=512)
    expected = np.asarray(final_priorities, dtype=np.float64) ** ALPHA
    # 99.9% critical value of chi-square with 1023 degrees of freedom is about 1168
    assert _chi_square(counts, expected / expected.sum()) < 1168
