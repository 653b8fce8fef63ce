"""R2D2's replay of overlapping sequences and its stored state: which sequences are drawable and with which first
priority, what a draw gathers, and the learner's unroll from a stored state reproducing the actor's Q-values."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import compose_config

from algorithms.common.recurrent import polar_orthogonal, unroll, zero_state
from algorithms.common.sequence_replay import StepRecord, make_sequence_replay
from framework.anakin.trainer import build
from framework.core.config import validated
from framework.sebulba.actor import with_device_axis

NUM_ENVS, CAPACITY, LENGTH, PERIOD, BLOCK = 2, 24, 7, 4, 4


def block_of(first_position: int) -> StepRecord:
    """[BLOCK, NUM_ENVS] steps whose observation is (absolute position, env) and whose state is the position."""
    position = jnp.arange(first_position, first_position + BLOCK, dtype=jnp.float32)[:, None]
    env = jnp.arange(NUM_ENVS, dtype=jnp.float32)[None, :]
    flags = jnp.zeros((BLOCK, NUM_ENVS), bool)
    obs = jnp.stack(jnp.broadcast_arrays(position, env), axis=-1)
    return StepRecord(obs, jnp.zeros((BLOCK, NUM_ENVS), jnp.int32), position + 0 * env, flags, flags, flags,
                      ~flags, position + 0 * env, jnp.zeros((BLOCK, NUM_ENVS, 2)))


def first_position_priority(steps: StepRecord) -> jax.Array:
    """A first priority that names the sequence: 1 + its first position + 100 x its env."""
    return 1.0 + steps.obs[:, 0, 0] + 100.0 * steps.obs[:, 0, 1]


@pytest.fixture(scope="module")
def replay():
    return make_sequence_replay(NUM_ENVS, CAPACITY, LENGTH, PERIOD, batch_size=64, priority_exponent=1.0,
                                initial_priorities=first_position_priority)


def test_only_whole_intact_sequences_are_drawable_with_their_first_priority(replay):
    state = replay.init(jax.tree.map(lambda x: x[0, 0], block_of(0)))
    add = jax.jit(replay.add)
    for block in range(12):  # 48 positions through a ring of 24: it wraps twice
        state = add(state, block_of(block * BLOCK))
        written = (block + 1) * BLOCK
        stored = np.asarray(replay.stored_priorities(state))[: NUM_ENVS * CAPACITY // PERIOD].reshape(NUM_ENVS, -1)
        expected = np.zeros_like(stored)
        for start in range(0, written, PERIOD):
            whole, intact = start + LENGTH <= written, start >= written - CAPACITY
            if whole and intact:
                for env in range(NUM_ENVS):
                    expected[env, start % CAPACITY // PERIOD] = 1 + start + 100 * env
        np.testing.assert_allclose(stored, expected, rtol=1e-6, err_msg=f"after {written} positions")


def test_a_draw_gathers_a_whole_sequence_and_the_state_at_its_first_step(replay):
    state = replay.init(jax.tree.map(lambda x: x[0, 0], block_of(0)))
    for block in range(9):
        state = replay.add(state, block_of(block * BLOCK))
    batch, slots, probabilities = replay.sample(state, jax.random.uniform(jax.random.key(0), (64,)))
    first = np.asarray(batch.steps.obs[:, 0, 0])
    assert np.all(probabilities > 0) and np.all(first % PERIOD == 0)
    np.testing.assert_array_equal(batch.steps.obs[:, :, 0], first[:, None] + np.arange(LENGTH))  # consecutive
    np.testing.assert_array_equal(batch.steps.obs[:, :, 1], np.repeat(batch.steps.obs[:, :1, 1], LENGTH, axis=1))
    np.testing.assert_array_equal(batch.state, first)  # the state stored with the sequence's first step
    np.testing.assert_allclose(probabilities, (1 + first + 100 * batch.steps.obs[:, 0, 1])
                               / float(replay.stored_priorities(state).sum()), rtol=1e-5)


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
    from framework.anakin.trainer import CPU_COMPILER_OPTIONS

    keys = jax.random.split(jax.random.key(0), 1)
    init = jax.jit(jax.vmap(lambda key: polar_orthogonal(key, (64, 64)))).lower(keys).compile(CPU_COMPILER_OPTIONS[0])
    assert bool(jnp.isfinite(init(keys)).all())
