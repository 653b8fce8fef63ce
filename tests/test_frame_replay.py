"""Frame replay against a naive reference: a simulated engine's explicitly stacked observations
(NEXT_STEP resets, lost lives, truncations, restarted streams) and n-step returns by a plain loop,
checked at every slot after every block; priorities, sampling frequencies, the bytes per
transition, and jit + vmap."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import chisquare

from lightspeed.algorithms.common.frame_replay import FrameStep, make_frame_replay
from lightspeed.algorithms.common.replays import check_frame_ring
from lightspeed.framework.core.errors import ConfigError

NUM_ENVS, FRAME, STACK, N_STEP, DISCOUNT, BLOCK, ALPHA = 3, (5, 6), 4, 3, 0.9, 7, 0.6
CAPACITY, BLOCKS = 24, 10  # 70 steps through 24 slots: the ring wraps around twice


def _engine_stream(seed, length, fresh_at=None, end=0.1, lost_life=0.1, truncation=0.1):
    """[length, NUM_ENVS] steps of a simulated frame-stacking engine, with each step's stacked observation
    and true next observation built explicitly. `fresh_at`: {env: steps where its stream restarts}."""
    rng = np.random.default_rng(seed)
    fresh_at = fresh_at or {}
    new_frame = lambda: rng.integers(1, 256, FRAME, dtype=np.uint8)  # never 0: padding shows
    reset = lambda: np.concatenate([np.zeros((*FRAME, STACK - 1), np.uint8), new_frame()[..., None]], -1)
    keys = ["frame", "next_frame", "action", "reward", "terminated", "truncated", "acted", "start", "fresh",
            "lost_life", "obs_stack", "next_stack"]
    columns = {key: [[] for _ in range(NUM_ENVS)] for key in keys}
    for env in range(NUM_ENVS):
        for t in range(length):
            fresh = t == 0 or t in fresh_at.get(env, ())
            if fresh:
                obs, start, resetting = reset(), True, False
            acted = not resetting
            reward, terminated, truncated, lost = 0.0, False, False, False
            if resetting:  # NEXT_STEP autoreset: the action is ignored, the new episode's first observation comes
                next_obs, next_start, resetting = reset(), True, False
            else:
                reward, draw = float(rng.normal()), rng.random()
                next_obs, next_start = np.concatenate([obs[..., 1:], new_frame()[..., None]], -1), False
                terminated, lost = draw < end + lost_life, end <= draw < end + lost_life
                truncated = end + lost_life <= draw < end + lost_life + truncation
                resetting = (terminated and not lost) or truncated
            step = dict(frame=obs[..., -1], next_frame=next_obs[..., -1], action=int(rng.integers(0, 6)),
                        reward=reward, terminated=terminated, truncated=truncated, acted=acted, start=start,
                        fresh=fresh, lost_life=lost, obs_stack=obs, next_stack=next_obs)
            for key in keys:
                columns[key][env].append(step[key])
            obs, start = next_obs, next_start
    dtypes = dict(action=np.int32, reward=np.float32)
    return {key: np.stack([np.asarray(c, dtypes.get(key)) for c in columns[key]], axis=1) for key in keys}


def _steps(stream, block):
    # numpy: no eager op compiles
    return FrameStep(**{key: stream[key][block * BLOCK:(block + 1) * BLOCK] for key in FrameStep._fields})


def _naive_valid(stream, env, position, written, capacity):
    """The rules by hand: the engine acted, p + n written, the whole stack still in the ring, no restart
    within p + 1 .. p + n."""
    fresh = stream["fresh"][:written, env]
    return bool(position >= 0 and position + N_STEP <= written and stream["acted"][position, env]
                and position - STACK + 1 >= written - capacity + 1
                and not fresh[position + 1:position + N_STEP + 1].any())


def _naive_item(stream, env, position):
    """(obs, action, n-step return, bootstrap obs, bootstrap discount, the step k that ended the window early)."""
    n_step_return = 0.0
    for k in range(N_STEP):
        step = position + k
        n_step_return += DISCOUNT**k * stream["reward"][step, env]
        if stream["terminated"][step, env] or stream["truncated"][step, env]:
            bootstrap_discount = 0.0 if stream["terminated"][step, env] else DISCOUNT ** (k + 1)
            break
    else:
        bootstrap_discount, k = DISCOUNT**N_STEP, None
    last = position + (N_STEP - 1 if k is None else k)
    return (stream["obs_stack"][position, env], stream["action"][position, env], n_step_return,
            stream["next_stack"][last, env], bootstrap_discount, k)


def _slot_position(written, slot, capacity):
    return written - (written - slot) % capacity


@functools.cache
def _replay(priority_exponent=None, capacity=CAPACITY, num_envs=NUM_ENVS, batch_size=64):
    """A replay with its jitted functions, compiled once per process."""
    replay = make_frame_replay(num_envs, capacity, FRAME, jnp.uint8, STACK, N_STEP, DISCOUNT, batch_size,
                               priority_exponent)
    jitted = replay._replace(init=jax.jit(replay.init), add=jax.jit(replay.add), sample=jax.jit(replay.sample),
                             gather_items=jax.jit(replay.gather_items),
                             set_priorities=replay.set_priorities and jax.jit(replay.set_priorities))
    return replay, jitted


# episode ends, lost lives and truncations, a restart at a block's start (env 1) and one inside a block (env 2)
STREAM_FRESH = {1: (35,), 2: (45,)}


@pytest.fixture(scope="module")
def stream():
    return _engine_stream(0, BLOCK * BLOCKS, STREAM_FRESH)


def _all_items(jitted, state):
    batch = jitted.gather_items(state, np.arange(NUM_ENVS * CAPACITY))
    return jax.tree.map(np.asarray, batch)


def test_every_slot_matches_the_naive_stacked_transitions_after_every_block(stream):
    _, replay = _replay()
    state, seen = replay.init(), set()
    for block in range(BLOCKS):
        state = replay.add(state, _steps(stream, block))
        written = (block + 1) * BLOCK
        items = _all_items(replay, state)
        for index in range(NUM_ENVS * CAPACITY):
            env, position = divmod(index, CAPACITY)
            position = _slot_position(written, position, CAPACITY)
            expected_valid = _naive_valid(stream, env, position, written, CAPACITY)
            assert items.valid[index] == float(expected_valid), (block, env, position)
            if not expected_valid:
                seen.add("reset step" if 0 <= position < written and not stream["acted"][position, env] else "invalid")
                continue
            obs, action, n_step_return, bootstrap_obs, bootstrap_discount, ended_at = _naive_item(stream, env, position)
            np.testing.assert_array_equal(items.obs[index], obs)
            assert items.action[index] == action
            np.testing.assert_allclose(items.n_step_return[index], n_step_return, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(items.bootstrap_obs[index], bootstrap_obs)
            np.testing.assert_allclose(items.bootstrap_discount[index], bootstrap_discount, rtol=1e-6)
            if not obs[..., 0].any():
                seen.add("episode start in the stack")
            if stream["lost_life"][max(position - STACK + 1, 0):position, env].any():
                seen.add("lost life in the stack")
            if ended_at is not None and ended_at < N_STEP - 1:
                seen.add("truncated early" if bootstrap_discount > 0 else "terminated early")
            if position + N_STEP == written:
                seen.add("bootstrap at the write head")
    assert seen >= {"reset step", "invalid", "episode start in the stack", "lost life in the stack",
                    "truncated early", "terminated early", "bootstrap at the write head"}


def _valid_mask(replay, stream, blocks):
    state = replay.init()
    for block in range(blocks):
        state = replay.add(state, _steps(stream, block))
    return _all_items(replay, state).valid.reshape(NUM_ENVS, CAPACITY).astype(bool)


def test_a_restarted_stream_invalidates_exactly_the_n_items_before_it():
    _, replay = _replay()
    restarts = {1: (17,), 2: (21,)}  # inside a block, at a block's start
    restarted = _engine_stream(1, BLOCK * 4, restarts, end=0.0, lost_life=0.0, truncation=0.0)
    not_fresh = {**restarted, "fresh": restarted["fresh"] & (np.arange(BLOCK * 4) == 0)[:, None]}
    cut, uncut = _valid_mask(replay, restarted, 4), _valid_mask(replay, not_fresh, 4)
    expected = uncut.copy()
    for env, (restart,) in restarts.items():
        slots = np.arange(restart - N_STEP, restart) % CAPACITY
        assert uncut[env, slots].all()
        expected[env, slots] = False
    np.testing.assert_array_equal(cut, expected)
    assert uncut.sum() - cut.sum() == 2 * N_STEP


def _leaves(state):
    tree = state.sum_tree_state
    return np.asarray(tree.nodes[2**tree.tree_depth - 1:])


@pytest.fixture(scope="module")
def prioritized(stream):
    """The stream added with random priorities: (jitted replay, state, expected leaf of every flat index)."""
    _, replay = _replay(ALPHA)
    rng = np.random.default_rng(2)
    state, given = replay.init(), {}
    for block in range(BLOCKS):
        priorities = rng.uniform(0.1, 2.0, (BLOCK, NUM_ENVS)).astype(np.float32)
        for t in range(BLOCK):  # the Ape-X actor's priority of step t is the item it completes
            for env in range(NUM_ENVS):
                given[env, block * BLOCK + t - N_STEP + 1] = priorities[t, env]
        state = replay.add(state, _steps(stream, block), priorities)
        written = (block + 1) * BLOCK
        expected = np.zeros(NUM_ENVS * CAPACITY, np.float32)
        for index in range(NUM_ENVS * CAPACITY):
            env, slot = divmod(index, CAPACITY)
            position = _slot_position(written, slot, CAPACITY)
            if _naive_valid(stream, env, position, written, CAPACITY):
                expected[index] = given[env, position] ** ALPHA
        leaves = _leaves(state)
        np.testing.assert_allclose(leaves[:NUM_ENVS * CAPACITY], expected, rtol=1e-5)
        assert not leaves[NUM_ENVS * CAPACITY:].any()
    return replay, state, expected


def test_stored_priorities_are_the_given_ones_to_the_alpha_and_zero_where_invalid(prioritized):
    _, _, expected = prioritized
    assert (expected > 0).sum() > NUM_ENVS * CAPACITY // 2 and (expected == 0).any()


def test_prioritized_sampling_frequencies_and_probabilities(prioritized):
    replay, state, expected = prioritized
    draws = np.random.default_rng(0).random((500, 64), np.float32)
    batch, indices, probabilities = jax.jit(jax.vmap(lambda uniforms: replay.sample(state, uniforms)))(draws)
    indices = np.asarray(indices).ravel()
    target = expected.astype(np.float64) / expected.sum()
    np.testing.assert_allclose(np.asarray(probabilities).ravel(), target[indices], rtol=1e-5)
    assert np.asarray(batch.valid).all()
    counts = np.bincount(indices, minlength=NUM_ENVS * CAPACITY)
    drawable = expected > 0
    assert not counts[~drawable].any()
    assert chisquare(counts[drawable], target[drawable] / target[drawable].sum() * counts.sum()).pvalue > 1e-3


def test_set_priorities_never_makes_an_invalid_item_drawable(prioritized):
    replay, state, expected = prioritized
    valid_index, invalid_index = np.flatnonzero(expected > 0)[0], np.flatnonzero(expected == 0)[0]
    state = replay.set_priorities(state, np.array([valid_index, invalid_index]), np.array([5.0, 5.0], np.float32))
    leaves = _leaves(state)
    np.testing.assert_allclose(leaves[valid_index], 5.0**ALPHA, rtol=1e-6)
    assert leaves[invalid_index] == 0.0


def test_a_draw_of_probability_zero_comes_back_invalid():
    _, replay = _replay(ALPHA, capacity=32, num_envs=1)  # 32 leaves: the tree has no padding
    stream = _engine_stream(7, BLOCK * 5, end=0.0, lost_life=0.0, truncation=0.0)
    state = replay.init()
    for block in range(5):
        steps = jax.tree.map(lambda value: value[:, :1], _steps(stream, block))
        state = replay.add(state, steps, np.zeros((BLOCK, 1), np.float32))
    assert replay.gather_items(state, np.array([31])).valid[0] == 1.0
    # every priority 0: each walk down the tree ends at the last leaf, a valid item of probability 0
    batch, indices, probabilities = replay.sample(state, np.random.default_rng(8).random(64, np.float32))
    assert (np.asarray(indices) == 31).all() and not np.asarray(probabilities).any()
    assert not np.asarray(batch.valid).any()


@pytest.mark.parametrize("blocks", [2, BLOCKS])  # 14 steps in 24 slots: half empty; 70: wrapped around
def test_uniform_draws_stay_in_the_stored_range_and_mark_invalid_ones(stream, blocks):
    _, replay = _replay()
    state = replay.init()
    for block in range(blocks):
        state = replay.add(state, _steps(stream, block))
    written = blocks * BLOCK
    random_bits = np.random.default_rng(blocks).integers(0, 2**32, (200, 64), np.uint32)
    batch, indices, probabilities = jax.jit(jax.vmap(lambda bits: replay.sample(state, bits)))(random_bits)
    indices, valid = np.asarray(indices).ravel(), np.asarray(batch.valid).ravel()
    env, slot = np.divmod(indices, CAPACITY)
    position = _slot_position(written, slot, CAPACITY)
    first, last = max(written - CAPACITY + STACK, 0), written - N_STEP  # the stack in the ring, the window written
    assert position.min() >= first and position.max() <= last
    expected_valid = [_naive_valid(stream, e, p, written, CAPACITY) for e, p in zip(env, position, strict=True)]
    np.testing.assert_array_equal(valid, expected_valid)
    assert (valid == 0).any()
    np.testing.assert_allclose(probabilities, 1.0 / (NUM_ENVS * (last - first + 1)))
    counts = np.bincount(env * CAPACITY + position % CAPACITY, minlength=NUM_ENVS * CAPACITY)
    stored = counts[counts > 0]
    assert len(stored) == NUM_ENVS * (last - first + 1) and chisquare(stored).pvalue > 1e-3


def test_bytes_per_transition_for_84x84_frames_is_a_frame_and_a_few_bytes():
    for priority_exponent in (None, ALPHA):
        replay = make_frame_replay(8, 100_000, (84, 84), jnp.uint8, 4, 3, 0.99, 32, priority_exponent)
        assert 84 * 84 < replay.bytes_per_transition < 10_000


def test_jit_and_vmap_over_seeds_match_unbatched():
    _, replay = _replay(ALPHA)
    streams = [_engine_stream(seed, BLOCK * 4) for seed in (3, 4)]
    priorities = np.random.default_rng(5).uniform(0.1, 2.0, (2, 4, BLOCK, NUM_ENVS)).astype(np.float32)
    add_seeds = jax.jit(jax.vmap(replay.add))
    batched = jax.jit(jax.vmap(lambda _: replay.init()))(np.arange(2))
    singles = [replay.init(), replay.init()]
    for block in range(4):
        steps = [_steps(s, block) for s in streams]
        batched = add_seeds(batched, jax.tree.map(lambda *x: np.stack(x), *steps), priorities[:, block])
        singles = [replay.add(single, step, priorities[seed, block])
                   for seed, (single, step) in enumerate(zip(singles, steps, strict=True))]
    uniforms = np.random.default_rng(6).random((2, 64), np.float32)
    batched_sample = jax.jit(jax.vmap(replay.sample))(batched, uniforms)
    for seed, single in enumerate(singles):
        _assert_row_equals(batched, seed, single)
        _assert_row_equals(batched_sample, seed, replay.sample(single, uniforms[seed]))


def _assert_row_equals(batched, row, single):
    jax.tree.map(lambda b, s: np.testing.assert_array_equal(np.asarray(b)[row], s), batched, single)


@pytest.mark.parametrize("capacity, num_envs, n_step, key, allowed", [
    (15_625 * 64, 64, 100_000_000, "algo.n_step", "at most 15621"),  # the fuzz test's find: n_step past the ring
    (3, 8, 3, "algo.buffer_size", "at least 56"),  # fewer frames per env than a stack
])
def test_a_ring_too_short_for_one_item_is_a_config_error_naming_the_key(capacity, num_envs, n_step, key, allowed):
    with pytest.raises(ConfigError, match=rf"^Invalid config: {key}=\d+ .*Allowed: {allowed}\.$"):
        check_frame_ring(capacity, num_envs=num_envs, stack=4, n_step=n_step)
    check_frame_ring(64 * (4 + 3), num_envs=64, stack=4, n_step=3)  # exactly one item per env: accepted
