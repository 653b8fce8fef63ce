"""Lockstep on the host path equals the single program: a JAX env behind a host adapter, stepped by the actor
thread with the single program's keys, gives the learner the single program's state (float tolerance)."""
import jax
import numpy as np
import pytest
from conftest import compose_config

from lightspeed.framework.anakin.trainer import build
from lightspeed.framework.core.config import validated
from lightspeed.framework.core.env import EpisodeStatistics
from lightspeed.framework.core.host_env import HostStep
from lightspeed.framework.core.keys import rollout_draws
from lightspeed.framework.core.spaces import Space
from lightspeed.framework.sebulba.actor import first_round_keys, next_round_keys, with_device_axis
from lightspeed.framework.sebulba.runtime import BoundedQueue, StopSignal
from lightspeed.framework.sebulba.trainer import HostRun

ROUNDS = 6
RUN = [f"total_env_steps={32 * ROUNDS}", f"log_every={32 * ROUNDS}", f"eval_every={32 * ROUNDS}", "num_seeds=2",
       "runtime.mode=lockstep"]
DQN = ["algo=dqn", "env=cartpole", "algo.num_envs=4", "algo.train_every=32", "algo.batch_size=16",
       "algo.learning_starts=64", "algo.updates_per_train=2", "algo.buffer_size=512"]
# R2D2 (recurrent, sequences): 4 envs x 8 steps a round, a sequence of 16 steps every 8, learning from round 2
R2D2 = ["algo=r2d2", "env=cartpole", "env.observe=position", "algo.num_actors=2", "algo.envs_per_actor=2",
        "algo.rollout_length=8", "algo.sequence_period=8", "algo.burn_in=4", "algo.sequence_length=11",
        "algo.batch_size=8", "algo.samples_per_insert=4", "algo.buffer_size=64", "algo.learning_starts=8",
        "algo.lstm_size=8", "algo.hidden_sizes=[8]", "algo.actor_sync_period=1", "algo.target_update_period=2"]
# D4PG (Box actions, Gaussian noise): gymnax's Pendulum cut at 20 steps (episodes end), 4 envs x 8 steps a round,
# learning from round 2
D4PG = ["algo=d4pg", "env=gymnax", "env.id=Pendulum-v1", "+env.params.max_steps_in_episode=20", "algo.num_actors=2",
        "algo.envs_per_actor=2", "algo.rollout_length=8", "algo.batch_size=16", "algo.learning_starts=64",
        "algo.learner_updates_per_iteration=2", "algo.buffer_size=512", "algo.num_atoms=11",
        "algo.policy_hidden_sizes=[16]", "algo.critic_hidden_sizes=[16]", "algo.target_update_period=2"]

# PPO (on-policy): 4 envs x 8 steps a block, 2 epochs of 2 minibatches, every block learned from the first
PPO = ["algo=ppo", "env=cartpole", "algo.num_envs=4", "algo.rollout_length=8", "algo.update_epochs=2",
       "algo.num_minibatches=2", "algo.hidden_sizes=[16]"]


class JaxEnvOnHost:
    """A JAX env behind the host interface, stepped with the keys the single program gives it: the reset keys of
    its `init` and each round's env keys of `rollout_draws`."""

    host = True

    def __init__(self, env, env_params, seed: int, num_seeds: int, num_envs: int, steps_per_round: int):
        self.env, self.params, self.name = EpisodeStatistics(env), env_params, env.name
        self.observation_shape, self.space = env.observation_shape, env.action_space(env_params)
        self.observation_dtype = np.float32
        self.seed, self.num_seeds, self.num_envs, self.steps_per_round = seed, num_seeds, num_envs, steps_per_round
        self.reset_all = jax.jit(jax.vmap(jax.vmap(self.env.reset, in_axes=(0, None)), in_axes=(0, None)))
        self.step_all = jax.jit(jax.vmap(jax.vmap(self.env.step, in_axes=(0, 0, 0, None)), in_axes=(0, 0, 0, None)))
        self.env_keys = jax.jit(jax.vmap(lambda key: rollout_draws(key, steps_per_round, num_envs)[1]))

    def action_space(self, params=None) -> Space:
        return self.space

    def vector_env(self, num_envs: int, timeout_s: float) -> "JaxEnvOnHost":
        assert num_envs == self.num_seeds * self.num_envs
        return self

    def reset(self, seed: int) -> np.ndarray:
        """The single program's init: each seed key split in three, the third reset key split over the envs."""
        seed_keys = jax.random.split(jax.random.key(np.uint32(self.seed)))[0]
        seed_keys = jax.random.split(seed_keys, self.num_seeds)
        reset_keys = jax.vmap(lambda key: jax.random.split(jax.random.split(key, 3)[2], self.num_envs))(seed_keys)
        obs, self.state = self.reset_all(reset_keys, self.params)
        self.round_keys, _ = first_round_keys(self.seed, self.num_seeds)
        self.t = self.steps_per_round
        return np.asarray(obs).reshape(-1, *self.observation_shape)

    def step(self, actions: np.ndarray) -> HostStep:
        if self.t == self.steps_per_round:  # a new round: its rollout keys, as the actor part draws its own
            self.round_keys, rollout_keys, _ = next_round_keys(self.round_keys)
            self.keys, self.t = self.env_keys(rollout_keys), 0
        actions = np.asarray(actions).reshape(self.num_seeds, self.num_envs, *getattr(self.space, "shape", ()))
        obs, self.state, reward, terminated, truncated, info = self.step_all(self.keys[:, self.t], self.state,
                                                                             actions, self.params)
        self.t += 1
        flat = lambda x: np.asarray(x).reshape(self.num_seeds * self.num_envs, *np.shape(x)[2:])
        ended = flat(terminated | truncated)
        return HostStep(obs=flat(obs), reward=flat(reward), terminated=flat(terminated), truncated=flat(truncated),
                        final_obs=flat(info["final_observation"]), acted=np.ones(len(ended), bool),
                        episode_return=flat(info["returned_episode_return"]),
                        episode_length=flat(info["returned_episode_length"]), ended=ended, started=ended)

    def close(self) -> None:
        pass


# the first round each learns in: DQN's and D4PG's 64 items, R2D2's 8 whole sequences fill by round 2; PPO learns each
# R2D2's is slow-marked (the 10-minute budget): DQN's, D4PG's and PPO's cover replay, Box actions and on-policy in CI
@pytest.mark.parametrize("algo, first_learned", [(DQN, 2), pytest.param(R2D2, 2, marks=pytest.mark.slow), (D4PG, 2),
                                                 (PPO, 1)], ids=["dqn", "r2d2", "d4pg", "ppo"])
def test_lockstep_on_the_host_equals_the_single_program(algo, first_learned):
    train = validated(compose_config(*algo, *RUN))
    env, env_params, algorithm = build(train)
    parts = algorithm.actor_learner
    host_env = JaxEnvOnHost(env, env_params, train.seed, train.num_seeds, parts.num_envs, parts.block_steps)
    run = HostRun(train, host_env, algorithm)
    run.start_actors()
    stop = StopSignal()
    run.run_lockstep(BoundedQueue(ROUNDS + 1), stop)
    stop.raise_if_failed()
    # the first rounds wait for the learner to be ready (its replay to hold enough), then each round learns
    assert run.rounds_inserted == ROUNDS and run.rounds_learned == ROUNDS - first_learned + 1

    seed_keys = jax.random.split(jax.random.split(jax.random.key(np.uint32(train.seed)))[0], train.num_seeds)
    state = jax.jit(jax.vmap(with_device_axis(algorithm.init)))(seed_keys)  # R2D2's learner is on a device axis
    update = jax.jit(jax.vmap(with_device_axis(algorithm.update)))
    for _ in range(ROUNDS):
        state, metrics = update(state)
    # the algorithm's actor metrics (returns per exploration rate) over the host run's envs: the single program's
    actor_metrics = run.actor_side_metrics()
    assert parts.actor_metrics is None or actor_metrics and any(np.any(value != 0) for value in actor_metrics.values())
    for name, value in actor_metrics.items():
        np.testing.assert_allclose(value, metrics[name], rtol=1e-6, err_msg=name)
    host, single = jax.device_get(run.learner), jax.device_get(state.learner)
    # float tolerance: CartPole's physics compiled into two different programs round differently (observations
    # ~6e-7 apart), which ten Adam steps carry into the parameters (seen up to 3e-5 relative); the actions agree
    for a, b in zip(jax.tree.leaves(host), jax.tree.leaves(single), strict=True):
        if np.issubdtype(np.asarray(a).dtype, np.floating):
            np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-4, atol=1e-5)
        else:  # actions, flags, counters
            np.testing.assert_array_equal(a, b)
    assert int(single.updates[0]) == parts.updates_per_learn * run.rounds_learned > 0  # learned rounds compared
