"""Prioritised replay: explicit priorities land on the right items, sampling follows p^alpha,
importance weights by hand, priority writes agree with Flashbax's own, and the sum tree stays
faithful after >= 1M priority updates."""
import functools

import flashbax as fbx
import jax
import jax.numpy as jnp
import numpy as np

from lightspeed.algorithms.common.prioritized_replay import importance_weights, make_prioritized_replay

ALPHA = 0.6


@functools.cache  # built once per process: compilation, not the tests, is what takes time here
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
    sample = jax.jit(jax.vmap(lambda uniforms: replay.sample(state, uniforms)[0]["id"]))  # all batches at once
    ids = np.asarray(sample(jax.random.uniform(jax.random.key(0), (draws, batch)))).ravel()
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
    # (N P(i))^-beta over its largest value: N = 8 items (any N: it cancels), beta = 0.5
    raw = np.array([(8 * 0.5) ** -0.5, (8 * 0.25) ** -0.5, (8 * 0.125) ** -0.5])
    np.testing.assert_allclose(importance_weights(probabilities, 0.5), raw / raw.max(), rtol=1e-6)
    np.testing.assert_allclose(importance_weights(probabilities, 0.5), [0.5, 0.5**0.5, 1.0], rtol=1e-6)
    np.testing.assert_allclose(importance_weights(probabilities, 1.0), [0.25, 0.5, 1.0], rtol=1e-6)
    np.testing.assert_allclose(importance_weights(probabilities, 0.0), [1.0, 1.0, 1.0])
    # an item drawn with probability 0 (an empty slot at a stratum's edge) weighs 0, not infinity
    np.testing.assert_allclose(importance_weights(jnp.array([0.5, 0.0, 0.25]), 0.5), [0.5**0.5, 0.0, 1.0], rtol=1e-6)
    np.testing.assert_array_equal(importance_weights(jnp.zeros(3), 0.5), [0.0, 0.0, 0.0])


def test_add_writes_items_where_flashbax_would_and_sets_their_priorities():
    """Two rows of 8 slots, three adds of 4, 4 and 3 steps: the buffer fills exactly, then wraps around."""
    replay = make_prioritized_replay(16, 2, 4, ALPHA)
    reference = fbx.make_prioritised_trajectory_buffer(
        add_batch_size=2, sample_batch_size=4, sample_sequence_length=1, period=1, min_length_time_axis=1,
        max_length_time_axis=8, priority_exponent=ALPHA)
    ours = theirs = replay.init({"id": jnp.int32(0), "obs": jnp.zeros(3)})
    expected_priorities, written = np.zeros(16), 0
    for steps in (4, 4, 3):
        ids = 100 * (1 + jnp.arange(2))[:, None] + written + jnp.arange(steps)[None, :]  # [rows, steps]
        items = {"id": ids, "obs": jnp.stack([ids, -ids, 2 * ids], axis=-1).astype(jnp.float32)}
        priorities = (1.0 + ids % 7).astype(jnp.float32)
        ours, theirs = jax.jit(replay.add)(ours, items, priorities), jax.jit(reference.add)(theirs, items)
        for field in ("current_index", "is_full", "running_index"):
            assert int(getattr(ours, field)) == int(getattr(theirs, field)), (steps, field)
        jax.tree.map(np.testing.assert_array_equal, ours.experience, theirs.experience)
        for step in range(steps):  # slot (row, (written + step) mod 8) holds that step's priority
            expected_priorities[np.arange(2) * 8 + (written + step) % 8] = np.asarray(priorities[:, step])
        written += steps
        np.testing.assert_allclose(replay.stored_priorities(ours), expected_priorities, rtol=1e-5)
        _assert_every_node_sums_its_children(ours.sum_tree_state)
    assert bool(ours.is_full) and int(ours.current_index) == 3


def test_a_buffer_of_one_slot_per_row_keeps_each_rows_latest_item():
    """capacity == rows (one slot per env, nothing forbids it): every add overwrites each row's only slot."""
    replay = make_prioritized_replay(4, 4, 2, ALPHA)
    state = replay.init({"id": jnp.int32(0)})
    for step in (1, 2):
        ids = jnp.arange(4)[:, None] * 10 + step  # [rows, 1 step]
        state = replay.add(state, {"id": ids}, (step * (1 + jnp.arange(4, dtype=jnp.float32)))[:, None])
    np.testing.assert_array_equal(state.experience["id"][:, 0], [2, 12, 22, 32])
    np.testing.assert_allclose(replay.stored_priorities(state), [2.0, 4.0, 6.0, 8.0], rtol=1e-5)
    assert bool(state.is_full) and int(state.current_index) == 0


def test_stored_priorities_undo_the_exponent_and_empty_or_negative_slots_hold_zero():
    replay = make_prioritized_replay(8, 1, 4, ALPHA)
    state = replay.init({"id": jnp.int32(0)})
    assert not np.asarray(replay.stored_priorities(state)).any()
    state = replay.set_priorities(state, jnp.array([0, 2, 3, 5]), jnp.array([0.5, 9.0, -1.0, 2.0]))
    np.testing.assert_allclose(replay.stored_priorities(state), [0.5, 0, 9.0, 0, 0, 2.0, 0, 0], rtol=1e-5)
    leaves = np.asarray(state.sum_tree_state.nodes[-8:])
    np.testing.assert_allclose(leaves, [0.5**ALPHA, 0, 9.0**ALPHA, 0, 0, 2.0**ALPHA, 0, 0], rtol=1e-6)


def test_stratified_sampling_inverts_the_cumulative_priorities():
    """Each uniform u in stratum k lands on the item whose share of the cumulative sum holds (k + u) / B of
    the total, computed in float64; its probability is its share of the total."""
    replay, state = _filled(capacity=64, rows=4, batch=256)
    leaves = (1.0 + np.arange(64) % 7) ** ALPHA
    cumulative = np.cumsum(leaves)
    uniforms = jax.random.uniform(jax.random.key(4), (256,))
    items, indices, probabilities = replay.sample(state, uniforms)
    targets = (np.arange(256) + np.asarray(uniforms, np.float64)) / 256 * cumulative[-1]
    indices = np.asarray(indices)
    slack = 1e-5 * cumulative[-1]  # float32 sums in the tree
    assert (cumulative[indices] - leaves[indices] - slack <= targets).all()
    assert (targets < cumulative[indices] + slack).all()
    np.testing.assert_array_equal(np.asarray(items["id"]), indices)
    np.testing.assert_allclose(probabilities, leaves[indices] / cumulative[-1], rtol=1e-5)


def test_probabilities_of_priorities_below_one_and_of_an_empty_buffer():
    """Leaves and sums below 1 (priorities 0.01 to 0.5): each drawn item's probability is its share; a buffer
    holding nothing yet gives probability 0 (weight 0), never a made-up 1."""
    replay = make_prioritized_replay(8, 1, 4, ALPHA)
    empty = replay.init({"id": jnp.int32(0)})
    np.testing.assert_array_equal(replay.sample(empty, jnp.full(4, 0.5))[2], np.zeros(4))
    priorities = np.array([0.01, 0.5, 0.02, 0.3, 0.05, 0.2, 0.1, 0.4], np.float32)
    state = replay.set_priorities(empty, jnp.arange(8), jnp.asarray(priorities))
    _, indices, probabilities = replay.sample(state, jnp.array([0.2, 0.4, 0.6, 0.8]))
    leaves = priorities.astype(np.float64) ** ALPHA
    assert leaves.sum() < 4 and len(set(np.asarray(indices).tolist())) > 1
    np.testing.assert_allclose(probabilities, leaves[np.asarray(indices)] / leaves.sum(), rtol=1e-5)


def test_a_uniform_at_a_strata_boundary_takes_the_item_that_starts_there():
    """Eight items of priority 1: stratum k of 4 starts at item 2k; its middle, (k + 0.5) / 4 of the total,
    is exactly where item 2k + 1 begins."""
    replay = make_prioritized_replay(8, 1, 4, ALPHA)
    state = replay.set_priorities(replay.init({"id": jnp.int32(0)}), jnp.arange(8), jnp.ones(8))
    for uniform, expected in ((0.0, [0, 2, 4, 6]), (0.5, [1, 3, 5, 7]), (0.99, [1, 3, 5, 7])):
        _, indices, probabilities = replay.sample(state, jnp.full(4, uniform))
        assert np.asarray(indices).tolist() == expected, uniform
        np.testing.assert_allclose(probabilities, np.full(4, 1 / 8), rtol=1e-6)


def test_sampling_stays_faithful_after_a_million_priority_updates():
    replay, state = _filled(capacity=1024, rows=4, batch=512)

    def update_many(state, key):
        def one(state, key):
            index_key, value_key = jax.random.split(key)
            indices = jax.random.randint(index_key, (512,), 0, 1024)
            priorities = jax.random.uniform(value_key, (512,), minval=1e-3, maxval=1e3)
            return replay.set_priorities(state, indices, priorities), None
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
