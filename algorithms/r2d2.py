"""R2D2 (Kapturowski et al., 2019): Ape-X with a recurrent Q-network trained on stored sequences, as actor and learner
parts (the framework runs them in one program on JAX envs, in actor threads or Ray processes on host envs).

    actor    each env acts epsilon-greedily at its actor's rung of Ape-X's ladder, carrying its LSTM state (zeroed
             where an episode starts), and records every step with the state it acted from and its Q-values
    replay   each step stored once per env ring; a sequence of burn_in + sequence_length + 1 steps starts every
             sequence_period steps, with the actor's state at its first step; its first priority is the
             eta-mixed |TD error| of the actor's own Q-values (algorithms/common/sequence_replay.py)
    learner  prioritised batches of sequences: burn-in from the stored (or a zero) state on the online and the
             target network without gradient, then n-step double-Q targets under the value rescaling h over the
             sequence_length steps after it (algorithms/common/sequence_targets.py), importance-weighted squared
             TD loss, eta-mixed priorities written back, the target copied every target_update_period updates

A sequence may run across an episode's end: the unroll zeroes the state where the actor did, and no target
bootstraps across the end, so it trains what the actors saw; nothing is padded (every env writes the same number
of steps, so a block always inserts block_steps / sequence_period sequences per env: the rate limiter's unit).
One learner per seed (several devices split the seeds; Ape-X's averaging learners are not R2D2's yet).
"""
import dataclasses
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from flax.training.train_state import TrainState

from lightspeed.algorithms.common.exploration import actor_epsilons, epsilon_greedy
from lightspeed.algorithms.common.networks import check_network_config, select_tree
from lightspeed.algorithms.common.optimizer import (
    apply_gradients,
    check_learning_rate_config,
    clipped_adam,
    decayed_learning_rate,
)
from lightspeed.algorithms.common.prioritized_replay import importance_weights, priority_metrics
from lightspeed.algorithms.common.recurrent import (
    LSTMState,
    RecurrentQNetwork,
    make_recurrent_q_network,
    reset_where,
    unroll,
    zero_state,
)
from lightspeed.algorithms.common.replays import count_filled
from lightspeed.algorithms.common.sequence_replay import (
    SequenceReplay,
    SequenceReplayState,
    Sequences,
    StepRecord,
    make_sequence_replay,
)
from lightspeed.algorithms.common.sequence_targets import SequenceSteps, n_step_targets, sequence_priority
from lightspeed.framework.core.algorithm import ActorLearner, ActorStep, Algorithm, Memory, Metrics
from lightspeed.framework.core.errors import check, check_number, check_positive_int
from lightspeed.framework.core.registry import register_algorithm


@dataclasses.dataclass
class R2D2Config:
    """R2D2's keys. Defaults are the paper's (P: Kapturowski et al. 2019, table 2) or Acme's R2D2Config (A) where
    the paper is silent; sizes for small envs are in conf/algo_env/r2d2_<env>.yaml, with their evidence."""

    name: str = "r2d2"  # the registered name of the algorithm that algo=r2d2 chooses
    num_actors: int = 8  # P: 256 actors; 8 x 4 envs fit a laptop and still span the ladder
    envs_per_actor: int = 4  # envs each actor steps together
    rollout_length: int = 40  # steps of every env per iteration: a multiple of sequence_period
    actor_epsilon: float = 0.4  # P (Ape-X's ladder): actor i explores with 0.4^(1 + 7 i / (num_actors - 1))
    actor_alpha: float = 7.0  # P
    actor_sync_period: int = 16  # learner updates between refreshes of the actors' parameters (A: 400 actor steps)
    burn_in: int = 40  # P: steps that only warm the state up (no loss)
    sequence_length: int = 80  # P: trained steps of a sequence (one more step is stored for the last bootstrap)
    sequence_period: int = 40  # P: a new sequence every 40 steps (adjacent ones overlap by burn_in + 40 + 1)
    stored_state: bool = True  # P: start the unroll from the actor's stored state; False: from zeros (ablation)
    n_step: int = 5  # P
    discount: float = 0.997  # P
    value_rescaling: bool = True  # P: h(x) = sign(x)(sqrt(|x| + 1) - 1) + 1e-3 x on the targets
    buffer_size: int = 100_000  # A (max_replay_size): sequences per device; each takes sequence_period steps
    batch_size: int = 64  # P
    samples_per_insert: float = 4.0  # A: sampled sequences per inserted one (the rate limiter's ratio)
    learning_starts: int = 256  # sequences in replay before the learner starts
    learning_rate: float = 1e-4  # P (Adam)
    lr_decay_env_steps: int = 0  # env steps of a linear decay to lr_final_fraction * learning_rate; 0: constant
    lr_final_fraction: float = 0.0  # the learning rate at the decay's end, as a fraction of learning_rate
    max_grad_norm: float = 80.0  # A
    priority_exponent: float = 0.9  # P
    importance_exponent: float = 0.6  # P
    priority_eta: float = 0.9  # P: priority = eta max|delta| + (1 - eta) mean|delta| over a sequence
    target_update_period: int = 2500  # P: learner updates between target copies
    lstm_size: int = 512  # P
    hidden_sizes: list[int] = dataclasses.field(default_factory=lambda: [512])  # P: the torso's dense layer
    dueling: bool = True  # P
    double_q: bool = True  # P
    activation: str = "relu"  # relu, tanh, gelu, silu or elu
    layer_norm: bool = False  # LayerNorm between each hidden Dense and its activation
    torso: Optional[str] = None  # mlp, conv or nature; null: nature for [H, W, C] images >= 36x36, conv for smaller
    conv_channels: list[int] = dataclasses.field(default_factory=lambda: [16])  # conv torso: 3x3 filters per layer
    conv_dense: int = 128  # conv torso: units of its dense layer

    @property
    def stored_length(self) -> int:
        return self.burn_in + self.sequence_length + 1

    @property
    def num_envs(self) -> int:
        return self.num_actors * self.envs_per_actor

    @property
    def ring_steps(self) -> int:
        """Steps each env's ring holds: its share of the buffer's sequences, sequence_period steps each."""
        return self.buffer_size // self.num_envs * self.sequence_period

    @property
    def sequences_per_iteration(self) -> int:
        """Sequences an iteration inserts: the rate limiter's unit."""
        return self.num_envs * self.rollout_length // self.sequence_period

    def validate(self) -> None:
        for key in ("num_actors", "envs_per_actor", "rollout_length", "actor_sync_period", "sequence_length",
                    "sequence_period", "n_step", "buffer_size", "batch_size", "target_update_period", "lstm_size"):
            check_positive_int(f"algo.{key}", getattr(self, key))
        for key in ("burn_in", "learning_starts"):
            check_positive_int(f"algo.{key}", getattr(self, key), minimum=0)
        check(self.rollout_length % self.sequence_period == 0, "algo.rollout_length", self.rollout_length,
              f"a multiple of algo.sequence_period ({self.sequence_period})",
              "every iteration must end where a sequence may start")
        check(self.ring_steps >= self.stored_length + self.rollout_length, "algo.buffer_size", self.buffer_size,
              f"at least {-(-(self.stored_length + self.rollout_length) // self.sequence_period) * self.num_envs}",
              "each env's ring must hold a whole sequence and an iteration's steps")
        check_number("algo.samples_per_insert", self.samples_per_insert, 0, low_inclusive=False)
        inserted = self.sequences_per_iteration
        sampled = self.samples_per_insert * inserted
        check(self.batch_size <= sampled, "algo.batch_size", self.batch_size,
              f"at most samples_per_insert x {inserted} ({sampled:g}: the sequences an iteration samples)",
              "each iteration's learner round is a whole number of batches")
        check(sampled >= self.batch_size and float(sampled / self.batch_size).is_integer(), "algo.samples_per_insert",
              self.samples_per_insert, f"a value that makes samples_per_insert x {inserted} (the sequences an "
              f"iteration inserts) a multiple of algo.batch_size ({self.batch_size})",
              "each iteration's learner round is a whole number of batches")
        check_number("algo.actor_epsilon", self.actor_epsilon, 0, 1)
        check_number("algo.actor_alpha", self.actor_alpha, 0)
        check_number("algo.discount", self.discount, 0, 1)
        check_learning_rate_config(self.learning_rate, self.lr_decay_env_steps, self.lr_final_fraction)
        check_number("algo.max_grad_norm", self.max_grad_norm, 0, low_inclusive=False)
        check_number("algo.priority_exponent", self.priority_exponent, 0, 1, low_inclusive=False)
        check_number("algo.importance_exponent", self.importance_exponent, 0, 1)
        check_number("algo.priority_eta", self.priority_eta, 0, 1)
        check_network_config(self)

    def updates_per_iteration(self) -> int:
        return int(self.samples_per_insert * self.sequences_per_iteration) // self.batch_size


class ActedFrom(NamedTuple):
    """What an R2D2 actor hands its recorder with an action: the LSTM state it acted from (zeroed where an
    episode starts) and its Q-values there, which the replay stores for the burn-in and initial priorities."""

    state: LSTMState
    q: jax.Array


class R2D2Actor(NamedTuple):
    """An env's actor state: its place in the seed (its rung of the ladder) and its LSTM state."""

    index: jax.Array
    lstm: LSTMState


@struct.dataclass
class R2D2Learner:
    train_state: TrainState
    target_params: Any
    replay_state: SequenceReplayState
    updates: jax.Array
    filled: jax.Array  # sequences inserted, counted up to the learning start


def trained_steps(steps: StepRecord, burn_in: int) -> SequenceSteps:
    """The steps after the burn-in of one sequence [T, ...], as the targets read them."""
    return SequenceSteps(*(x[burn_in:] for x in (steps.action, steps.reward, steps.terminated, steps.truncated,
                                                  steps.start, steps.acted)))


def chosen_q(q: jax.Array, action: jax.Array) -> jax.Array:
    return jnp.take_along_axis(q, action[..., None], axis=-1)[..., 0]


def r2d2_parts(config: R2D2Config, network: RecurrentQNetwork) -> ActorLearner:
    """R2D2's actor and learner parts."""
    c = config
    num_envs = c.num_envs
    epsilons = np.asarray(actor_epsilons(c.num_actors, c.actor_epsilon, c.actor_alpha))
    optimizer = clipped_adam(c.max_grad_norm)
    # the first sequences are whole once every env has written a stored length
    learning_starts = max(c.learning_starts, c.batch_size, -(-c.stored_length // c.sequence_period) * num_envs)

    def sequence_td(q_online: jax.Array, q_target: jax.Array, steps: StepRecord) -> tuple[jax.Array, jax.Array]:
        """One sequence's TD errors and valid mask over its trained steps, from Q [T, A] at its observations."""
        trained = trained_steps(steps, c.burn_in)
        q_online, q_target = q_online[c.burn_in:], q_target[c.burn_in:]
        targets = n_step_targets(q_online if c.double_q else q_target, q_target, trained, c.n_step, c.discount,
                                 c.value_rescaling)
        return jax.lax.stop_gradient(targets.target) - chosen_q(q_online, trained.action), targets.valid

    def initial_priorities(steps: StepRecord) -> jax.Array:
        """New sequences [K, T, ...]: the eta-mixed |TD error| of the Q-values the actors acted with."""
        errors, valid = jax.vmap(lambda s: sequence_td(s.q, s.q, s))(steps)
        return sequence_priority(errors, valid, c.priority_eta)

    replay: SequenceReplay = make_sequence_replay(
        num_envs, c.ring_steps, c.stored_length, c.sequence_period, c.batch_size,
        c.priority_exponent, initial_priorities)

    # the actor part
    def actor_init(index: jax.Array, env_steps: jax.Array) -> R2D2Actor:
        return R2D2Actor(index, zero_state(c.lstm_size))

    def act(params: Any, actor: R2D2Actor, obs: jax.Array, start: jax.Array, key: jax.Array
            ) -> tuple[jax.Array, R2D2Actor, ActedFrom]:
        acted_from = reset_where(start, actor.lstm)
        lstm, q = network.apply(params, acted_from, obs)
        epsilon = jnp.asarray(epsilons)[actor.index // c.envs_per_actor]
        return epsilon_greedy(q, epsilon, jax.random.uniform(key)), actor._replace(lstm=lstm), ActedFrom(acted_from, q)

    def observe(params: Any, recorder: tuple, step: ActorStep) -> tuple[tuple, StepRecord]:
        """The step as the replay stores it: with the state the actor acted from and its Q-values there."""
        record = StepRecord(step.obs, step.action.astype(jnp.int32), step.reward.astype(jnp.float32),
                            step.terminated, step.truncated, step.start, step.acted, step.extras.state, step.extras.q)
        return recorder, record

    # the learner part
    def learner_init(key: jax.Array, obs: jax.Array) -> R2D2Learner:
        lstm = zero_state(c.lstm_size, obs.shape[:1])
        params = network.init(key, lstm, obs)
        _, q = network.apply(params, lstm, obs)
        example = jax.tree.map(lambda x: x[0], StepRecord(
            obs, jnp.zeros(num_envs, jnp.int32), jnp.zeros(num_envs), jnp.zeros(num_envs, bool),
            jnp.zeros(num_envs, bool), jnp.zeros(num_envs, bool), jnp.zeros(num_envs, bool), lstm, q))
        return R2D2Learner(TrainState.create(apply_fn=network.apply, params=params, tx=optimizer), params,
                           replay.init(example), jnp.int32(0), jnp.int32(0))

    def insert(learner: R2D2Learner, records: StepRecord) -> R2D2Learner:
        return learner.replace(replay_state=replay.add(learner.replay_state, records),
                               filled=count_filled(learner.filled, c.sequences_per_iteration, learning_starts))

    def unrolled_q(params: Any, batch: Sequences, with_gradient: bool) -> jax.Array:
        """Q [B, T, A] along the sampled sequences, from the stored (or a zero) state; the burn-in without gradient."""
        time_major = lambda x: jnp.swapaxes(x, 0, 1)
        obs, start = time_major(batch.steps.obs), time_major(batch.steps.start)
        initial = batch.state if c.stored_state else zero_state(c.lstm_size, start.shape[1:])
        frozen = jax.lax.stop_gradient(params)
        warm, burn_q = unroll(network, frozen, initial, obs[:c.burn_in], start[:c.burn_in])
        _, q = unroll(network, params if with_gradient else frozen, jax.lax.stop_gradient(warm), obs[c.burn_in:],
                      start[c.burn_in:])
        return time_major(jnp.concatenate([burn_q, q]))

    def loss(params: Any, target_params: Any, batch: Sequences, weights: jax.Array
             ) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
        q_online = unrolled_q(params, batch, with_gradient=True)
        q_target = unrolled_q(target_params, batch, with_gradient=False)
        errors, valid = jax.vmap(sequence_td)(q_online, q_target, batch.steps)
        per_sequence = (valid * 0.5 * jnp.square(errors)).sum(axis=1) / jnp.maximum(valid.sum(axis=1), 1.0)
        trained_q = chosen_q(q_online[:, c.burn_in:], batch.steps.action[:, c.burn_in:])
        return (weights * per_sequence).mean(), (errors, valid, trained_q)

    def learn(learner: R2D2Learner, key: jax.Array, env_steps: jax.Array) -> tuple[R2D2Learner, Metrics]:
        """A round of batches; only the sum tree goes through the loop (the stored steps come out as they came in)."""
        step_size = decayed_learning_rate(c.learning_rate, c.lr_final_fraction, c.lr_decay_env_steps, env_steps)
        with_tree = lambda tree: learner.replay_state.replace(sum_tree_state=tree)

        def one_batch(carry: tuple, uniforms: jax.Array) -> tuple[tuple, Metrics]:
            train_state, target_params, tree, updates = carry
            batch, slots, probabilities = replay.sample(with_tree(tree), uniforms)
            weights = importance_weights(probabilities, c.importance_exponent)
            (value, (errors, valid, chosen)), grads = jax.value_and_grad(loss, has_aux=True)(
                train_state.params, target_params, batch, weights)
            train_state = apply_gradients(train_state, grads, step_size)
            # a slot drawn with probability 0 holds no whole sequence: it keeps its 0
            priorities = sequence_priority(errors, valid, c.priority_eta) * (probabilities > 0)
            tree = replay.set_priorities(with_tree(tree), slots, priorities).sum_tree_state
            updates = updates + 1
            target_params = select_tree(updates % c.target_update_period == 0, train_state.params, target_params)
            stats = {"loss": value, "q_mean": (chosen * valid).sum() / jnp.maximum(valid.sum(), 1.0),
                     "valid_fraction": valid.mean(), "is_weight_min": weights.min()}
            return (train_state, target_params, tree, updates), stats

        uniforms = jax.random.uniform(key, (c.updates_per_iteration(), c.batch_size))
        carry = (learner.train_state, learner.target_params, learner.replay_state.sum_tree_state, learner.updates)
        (train_state, target_params, tree, updates), stats = jax.lax.scan(one_batch, carry, uniforms)
        metrics = {"train/loss": stats["loss"].mean(), "train/q_mean": stats["q_mean"].mean(),
                   "train/learning_rate": step_size, "replay/valid_step_fraction": stats["valid_fraction"].mean(),
                   "replay/is_weight_min": stats["is_weight_min"].min()}
        return R2D2Learner(train_state, target_params, with_tree(tree), updates, learner.filled), metrics

    def learner_metrics(learner: R2D2Learner) -> Metrics:
        """Mean and max raw sequence priority over the stored sequences (once per chunk)."""
        return priority_metrics(replay.stored_priorities(learner.replay_state))

    def actor_metrics(actors: R2D2Actor, returns: jax.Array) -> Metrics:
        per_actor = returns.reshape(c.num_actors, c.envs_per_actor).mean(axis=1)
        return {f"actors/return_eps_{float(eps):.3g}": per_actor[i] for i, eps in enumerate(epsilons)}

    return ActorLearner(
        num_envs=num_envs, block_steps=c.rollout_length, block_units=c.sequences_per_iteration,
        actor_init=actor_init, act=act, record_init=lambda obs: (), observe=observe,
        learner_init=learner_init, insert=insert, ready=lambda learner: learner.filled >= learning_starts,
        learn=learn, updates_per_learn=c.updates_per_iteration(), learn_units=c.updates_per_iteration() * c.batch_size,
        actor_params=lambda learner: learner.train_state.params, learner_steps=lambda learner: learner.updates,
        sync_period=c.actor_sync_period, actor_metrics=actor_metrics, learner_metrics=learner_metrics)


def greedy_recurrent_act(network: RecurrentQNetwork):
    """Evaluation's act: the argmax action, carrying the LSTM state (zeroed where an episode starts)."""
    def act(params: Any, lstm: LSTMState, obs: jax.Array, start: jax.Array, key: jax.Array
            ) -> tuple[jax.Array, LSTMState]:
        lstm, q = network.apply(params, reset_where(start, lstm), obs)
        return jnp.argmax(q, axis=-1).astype(jnp.int32), lstm
    return act


@register_algorithm("r2d2", config=R2D2Config)
def make_r2d2(config: R2D2Config, env: Any, env_params: Any) -> Algorithm:
    network = make_recurrent_q_network(config, env)
    parts = r2d2_parts(config, network)
    return Algorithm(init=None, update=None, policy=None, act=greedy_recurrent_act(network),
                     act_init=lambda index: zero_state(config.lstm_size),
                     env_steps_per_update=config.num_envs * config.rollout_length,
                     counters=("learner/updates",),
                     health_metrics=("train/loss", "train/q_mean"), learner_steps="learner/updates",
                     headline_metrics=(("train/episode_return", "train return"), ("train/loss", "loss")),
                     actor_learner=parts,
                     memory=Memory("replay", "algo.buffer_size", config.buffer_size, item="sequence"))
