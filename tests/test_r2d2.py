"""R2D2's replay of overlapping sequences and its stored state: which sequences are drawable and with which first
priority, what a draw gathers, and the learner's unroll from a stored state reproducing the actor's Q-values."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import compose_config

from lightspeed.algorithms.common.recurrent import polar_orthogonal, unroll, zero_state
from lightspeed.algorithms.common.sequence_replay import StepRecord, make_sequence_replay
from lightspeed.framework.anakin.trainer import build
from lightspeed.framework.core.config import validated
from lightspeed.framework.sebulba.actor import with_device_axis

NUM_ENVS, CAPACITY, LENGTH, PERIOD, BLOCK = 2, 24, 7, 4, 4


def block_of(first_position: int, block: int = BLOCK) -> StepRecord:
    """[block, NUM_ENVS] steps whose observation is (absolute position, env); the state, a pair as an LSTM's, holds
    the position and the observation as int32 (a state field of another dtype and shape)."""
    position = jnp.arange(first_position, first_position + block, dtype=jnp.float32)[:, None]
    env = jnp.arange(NUM_ENVS, dtype=jnp.float32)[None, :]
    flags = jnp.zeros((block, NUM_ENVS), bool)
    obs = jnp.stack(jnp.broadcast_arrays(position, env), axis=-1)
    return StepRecord(obs, jnp.zeros((block, NUM_ENVS), jnp.int32), position + 0 * env, flags, flags, flags,
                      ~flags, (position + 0 * env, obs.astype(jnp.int32)), jnp.zeros((block, NUM_ENVS, 2)))


def first_position_priority(steps: StepRecord) -> jax.Array:
    """A first priority that names the sequence: 1 + its first position + 100 x its env."""
    return 1.0 + steps.obs[:, 0, 0] + 100.0 * steps.obs[:, 0, 1]


def make_replay(length: int = LENGTH, priority_exponent: float = 1.0):
    """Built in each test rather than in a module fixture: mutation testing (bench/mutation.py) runs a test against
    the functions called during it, and a module fixture's call counts for the first test only."""
    return make_sequence_replay(NUM_ENVS, CAPACITY, length, PERIOD, batch_size=64,
                                priority_exponent=priority_exponent, initial_priorities=first_position_priority)


def example_step() -> StepRecord:
    return jax.tree.map(lambda x: x[0, 0], block_of(0))


@pytest.mark.parametrize("length, block", [(LENGTH, BLOCK), (2 * PERIOD + 1, 2 * PERIOD)])
def test_only_whole_intact_sequences_are_drawable_with_their_first_priority(length, block):
    """Also sequences one step longer than two periods (as R2D2's default 121 steps every 40), written two periods
    at a time: a block completes two sequences, the earliest exactly at its first step."""
    replay = make_replay(length)
    state = replay.init(example_step())
    add = jax.jit(replay.add)
    for index in range(48 // block):  # 48 positions through a ring of 24: it wraps twice
        state = add(state, block_of(index * block, block))
        written = (index + 1) * block
        stored = np.asarray(replay.stored_priorities(state))[: NUM_ENVS * CAPACITY // PERIOD].reshape(NUM_ENVS, -1)
        expected = np.zeros_like(stored)
        for start in range(0, written, PERIOD):
            whole, intact = start + length <= written, start >= written - CAPACITY
            if whole and intact:
                for env in range(NUM_ENVS):
                    expected[env, start % CAPACITY // PERIOD] = 1 + start + 100 * env
        np.testing.assert_allclose(stored, expected, rtol=1e-6, err_msg=f"after {written} positions")


def test_a_draw_gathers_a_whole_sequence_and_the_state_at_its_first_step():
    replay = make_replay()
    state = replay.init(example_step())
    add = jax.jit(replay.add)
    for block in range(9):
        state = add(state, block_of(block * BLOCK))
    batch, slots, probabilities = jax.jit(replay.sample)(state, jax.random.uniform(jax.random.key(0), (64,)))
    first = np.asarray(batch.steps.obs[:, 0, 0])
    assert np.all(probabilities > 0) and np.all(first % PERIOD == 0)
    np.testing.assert_array_equal(batch.steps.obs[:, :, 0], first[:, None] + np.arange(LENGTH))  # consecutive
    np.testing.assert_array_equal(batch.steps.obs[:, :, 1], np.repeat(batch.steps.obs[:, :1, 1], LENGTH, axis=1))
    # the state stored with the sequence's first step, every field in the dtype it was recorded in
    np.testing.assert_array_equal(batch.state[0], first)
    np.testing.assert_array_equal(batch.state[1], batch.steps.obs[:, 0])
    assert batch.state[1].dtype == jnp.int32
    recorded = block_of(0)
    assert all(getattr(batch.steps, name).dtype == getattr(recorded, name).dtype
               for name in StepRecord._fields if name != "state"), batch.steps
    np.testing.assert_allclose(probabilities, (1 + first + 100 * batch.steps.obs[:, 0, 1])
                               / float(replay.stored_priorities(state).sum()), rtol=1e-5)


def test_replay_priorities_are_stored_raw_and_drawn_in_proportion_to_their_power():
    replay = make_replay(priority_exponent=0.5)
    state = replay.init(example_step())
    add = jax.jit(replay.add)
    for block in range(6):  # 24 positions: the sequences at slots 0-4 of each env are whole, slot 5's is not
        state = add(state, block_of(block * BLOCK))
    first = np.asarray([[1 + PERIOD * k + 100 * env if k < 5 else 0 for k in range(6)] for env in range(NUM_ENVS)])
    # new raw priorities for env 0's slot 1 and env 1's slots 0 (a zero: not drawable) and 3
    state = replay.set_priorities(state, jnp.asarray([1, 6, 9]), jnp.asarray([4.0, 0.0, 2.25]))
    expected = first.ravel().astype(np.float64)
    expected[[1, 6, 9]] = [4.0, 0.0, 2.25]
    np.testing.assert_allclose(replay.stored_priorities(state)[:12], expected, rtol=1e-5)
    _, slots, probabilities = jax.jit(replay.sample)(state, jax.random.uniform(jax.random.key(1), (64,)))
    power = expected**0.5
    np.testing.assert_allclose(probabilities, power[np.asarray(slots)] / power.sum(), rtol=1e-5)


def test_replay_rejects_a_ring_or_a_block_that_cannot_hold_whole_sequences():
    with pytest.raises(ValueError, match="capacity_per_env 26 is not a multiple of the sequence period 4"):
        make_sequence_replay(NUM_ENVS, 26, LENGTH, PERIOD, batch_size=64, priority_exponent=1.0,
                             initial_priorities=first_position_priority)
    replay = make_replay(length=2 * PERIOD)
    state = replay.init(example_step())
    jax.eval_shape(replay.add, state, block_of(0, 16))  # a block of 16 and a sequence of 8 fill the ring exactly
    for block in (6, 20):  # not a multiple of the period; a multiple too long to fit a sequence beside it
        with pytest.raises(ValueError, match=f"a block of {block} steps must be a multiple of the period 4"):
            replay.add(state, block_of(0, block))


SMALL = ["algo=r2d2", "env=cartpole", "env.observe=position", "num_seeds=2", "algo.num_actors=2",
         "algo.envs_per_actor=2", "algo.rollout_length=8", "algo.sequence_period=8", "algo.burn_in=4",
         "algo.sequence_length=11", "algo.batch_size=8", "algo.samples_per_insert=2", "algo.buffer_size=64",
         "algo.lstm_size=8", "algo.hidden_sizes=[8]"]


def test_the_learner_unroll_from_a_stored_state_reproduces_the_actor_q_values():
    """Sequences cross CartPole's early episode ends (about 20 steps): the unroll zeroes the state where the actor
    did, so from the stored state it gives the actor's Q-values at every step; from a zero state it does not."""
    train = validated(compose_config(*SMALL, "algo.learning_starts=100000"))  # no learning: the actors' params
    _, _, algorithm = build(train)
    parts = algorithm.actor_learner
    state = jax.jit(jax.vmap(with_device_axis(algorithm.init)))(jax.random.split(jax.random.key(3), 2))
    update = jax.jit(jax.vmap(with_device_axis(algorithm.update)))  # one learner on a device axis
    for _ in range(6):
        state, _ = update(state)
    seed = jax.tree.map(lambda x: x[0], state.learner)
    replay = seed.replay_state
    params = parts.actor_params(seed)
    network_apply = seed.train_state.apply_fn
    steps, states = replay.steps, replay.states
    length = train.algo.stored_length
    assert bool(steps.start[:, 1:].any()), "no episode starts inside the stored steps: the test would prove nothing"

    class Network:
        apply = staticmethod(network_apply)

    for env in range(4):
        for slot, first in enumerate(range(0, 48 - length + 1, 8)):
            obs, start = steps.obs[env, first:first + length], steps.start[env, first:first + length]
            stored = jax.tree.map(lambda x, env=env, slot=slot: x[env, slot], states)
            _, q = unroll(Network, params, stored, obs, start)
            np.testing.assert_allclose(q, steps.q[env, first:first + length], rtol=1e-5, atol=1e-6)
            if not bool(start[0]):  # mid-episode: a zero state is not what the actor held
                _, from_zero = unroll(Network, params, zero_state(8), obs, start)
                assert not np.allclose(from_zero, q, atol=1e-4)


@pytest.mark.parametrize("shape", [(8, 8), (64, 64), (512, 512), (16, 64), (64, 16)])
def test_the_recurrent_kernel_init_is_orthogonal(shape):
    """The QR-free initializer gives orthonormal columns (or rows, for a wide matrix) and differs per key."""
    w = np.asarray(polar_orthogonal(jax.random.key(1), shape), np.float64)
    gram = w.T @ w if shape[0] >= shape[1] else w @ w.T
    np.testing.assert_allclose(gram, np.eye(min(shape)), atol=1e-5)
    assert not np.allclose(w, np.asarray(polar_orthogonal(jax.random.key(2), shape)))


def test_the_recurrent_kernel_init_is_finite_as_the_trainer_compiles_init():
    """One seed, XLA's optimization level 0 (the trainer's options for init): 60 unrolled iterations gave NaN here
    (every R2D2 run with num_seeds=1 then acted on NaN Q-values); the loop does not."""
    from lightspeed.framework.anakin.trainer import CPU_COMPILER_OPTIONS

    keys = jax.random.split(jax.random.key(0), 1)
    init = jax.jit(jax.vmap(lambda key: polar_orthogonal(key, (64, 64)))).lower(keys).compile(CPU_COMPILER_OPTIONS[0])
    assert bool(jnp.isfinite(init(keys)).all())
