"""Ape-X (Horgan et al., 2018) in one program: a vmapped population of actors with an epsilon
ladder writes n-step transitions with their own initial priorities into prioritised replay; the
learner samples by priority, corrects with importance weights and writes back |TD error|.

Actors act with a copy of the learner's parameters refreshed every `actor_sync_period` learner
updates: the staleness is part of Ape-X. Under several devices every device runs this whole loop
(its own actors and replay shard) and the learners average their gradients, so a seed's
parameters are the same on every device.
"""
import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from flax.training.train_state import TrainState

from algorithms.common import actor
from algorithms.common.exploration import actor_epsilons
from algorithms.common.networks import QNetwork, check_network_config, make_q_network, select_tree
from algorithms.common.nstep import NStepWindow, empty_window
from algorithms.common.optimizer import apply_gradients, check_learning_rate_config, clipped_adam, decayed_learning_rate
from algorithms.common.prioritized_replay import importance_weights
from algorithms.common.replays import prioritized_replay
from algorithms.common.targets import huber, td_errors
from framework.core.algorithm import ActorLearner, Algorithm, Memory
from framework.core.devices import device_index, mean_over_devices, num_learners
from framework.core.env import EpisodeStatistics
from framework.core.errors import check, check_number, check_positive_int
from framework.core.keys import rollout_draws
from framework.core.registry import register_algorithm

PRIORITY_EPSILON = 1e-6  # keeps every stored transition sampleable


@dataclasses.dataclass
class ApexConfig:
    """Ape-X's keys and their defaults: what `algo=apex` runs (conf/algo/apex.yaml adds only the decay's link
    to `total_env_steps`; conf/algo_env/apex_<env>.yaml retunes a few keys for one env).

    8 actors x 4 envs on an epsilon ladder (0.5^(1 + 7 i / 7): 0.5 down to 0.004), 5-step transitions
    with actor-side priorities, prioritised replay (alpha 0.6, beta 0.4 -> 1), a dueling double-Q
    learner with LayerNorm. Tuned for what a run ends with (the final greedy evaluation of every seed):
    16 batches of 128 per 256 env steps at lr 0.01 decaying linearly to 0 over the run's 100k env
    steps, target copied every 64 batches, a replay as long as the run. CartPole, tuned on
    seed=100/200/300: every one of 30 finals >= 475 (min 490), stability 0.90; on the untuned
    seed=2027/5150/8086: 30/30 (min 477), stability 0.92. GridWorld (one-hot): 6 of 6 seeds. The
    earlier defaults (batches of 32, constant lr 0.01, 300k env steps) solved CartPole by ~50k and then
    forgot it (1 of 10 finals >= 475; GridWorld 3 of 6). Without LayerNorm 25/30 finals; with the
    ladder from 0.4, 3-step returns or batches of 64, lower stability. Measured again on 2026-12-04, 100k-step
    runs ended 27/30 on unseen seeds, so on CartPole conf/algo_env/apex_cartpole.yaml ends each seed once solved,
    with its best policy, 150k env steps at most (30/30 there).
    """

    name: str = "apex"
    num_actors: int = 8
    envs_per_actor: int = 4
    rollout_length: int = 8  # steps of every env per iteration
    actor_epsilon: float = 0.5  # actor i explores with actor_epsilon^(1 + actor_alpha i / (num_actors - 1))
    actor_alpha: float = 7.0
    actor_sync_period: int = 16  # learner updates between refreshes of the actors' parameters
    n_step: int = 5
    discount: float = 0.99
    buffer_size: int = 100_000  # per device, as batch_size; as long as the default run
    batch_size: int = 128
    learning_starts: int = 2_000  # transitions in replay before the learner starts
    learner_updates_per_iteration: int = 16
    learning_rate: float = 1e-2
    # env steps (all learners') of a linear decay to lr_final_fraction * learning_rate; 0: constant.
    # The tuned schedule decays over the whole run: apex.yaml sets ${total_env_steps}; from Python,
    # this default is TrainConfig's 100k env steps (pass the run's length for another one).
    lr_decay_env_steps: int = 100_000
    lr_final_fraction: float = 0.0
    max_grad_norm: float = 40.0
    priority_alpha: float = 0.6
    beta_start: float = 0.4
    beta_steps: int = 20_000  # learner updates over which beta rises linearly to 1
    target_update_period: int = 64
    dueling: bool = True
    double_q: bool = True
    hidden_sizes: list[int] = dataclasses.field(default_factory=lambda: [64, 64])
    activation: str = "relu"
    layer_norm: bool = True
    torso: Optional[str] = None  # mlp, conv or nature; null: nature for [H, W, C] images >= 36x36, conv for smaller
    conv_channels: list[int] = dataclasses.field(default_factory=lambda: [16])  # conv torso: 3x3 filters per layer
    conv_dense: int = 128  # conv torso: units of its dense layer

    def validate(self) -> None:
        for key in ("num_actors", "envs_per_actor", "rollout_length", "actor_sync_period", "n_step", "buffer_size",
                    "batch_size", "learner_updates_per_iteration", "beta_steps", "target_update_period"):
            check_positive_int(f"algo.{key}", getattr(self, key))
        check_positive_int("algo.learning_starts", self.learning_starts, minimum=0)
        rows = self.num_actors * self.envs_per_actor
        check(self.buffer_size >= rows * self.rollout_length, "algo.buffer_size", self.buffer_size,
              f"at least num_actors * envs_per_actor * rollout_length ({rows * self.rollout_length})",
              "one iteration's transitions must fit")
        check(self.batch_size <= self.buffer_size, "algo.batch_size", self.batch_size,
              f"at most algo.buffer_size ({self.buffer_size})", "a batch cannot be larger than the buffer")
        check_number("algo.actor_epsilon", self.actor_epsilon, 0, 1)
        check_number("algo.actor_alpha", self.actor_alpha, 0)
        check_number("algo.discount", self.discount, 0, 1)
        check_learning_rate_config(self.learning_rate, self.lr_decay_env_steps, self.lr_final_fraction)
        check_number("algo.max_grad_norm", self.max_grad_norm, 0, low_inclusive=False)
        check_number("algo.priority_alpha", self.priority_alpha, 0, 1, low_inclusive=False)  # Flashbax allows <= 1
        check_number("algo.beta_start", self.beta_start, 0, 1)
        check_network_config(self)


@struct.dataclass
class ApexLearner:
    train_state: TrainState
    target_params: Any
    replay_state: Any
    learner_updates: jax.Array


@struct.dataclass
class ApexState:
    learner: ApexLearner
    actor_params: Any  # the actors' stale copy of the learner's parameters
    env_state: Any
    obs: jax.Array
    window: NStepWindow
    env_steps: jax.Array
    key: jax.Array


def annealed_beta(config: ApexConfig, learner_updates: jax.Array) -> jax.Array:
    return config.beta_start + (1.0 - config.beta_start) * jnp.minimum(learner_updates / config.beta_steps, 1.0)


def learner_gradients(params: Any, target_params: Any, items: dict, weights: jax.Array, network: QNetwork,
                      double_q: bool) -> tuple[tuple, Any]:
    """Importance-weighted Huber loss and its gradient, averaged over all learners (devices)."""

    def loss_fn(params):
        errors, chosen = td_errors(params, target_params, items, network, double_q)
        return (weights * items["valid"] * huber(errors)).mean(), (errors, chosen)

    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    return (loss, aux), mean_over_devices(grads)


def actor_priorities(actor_params: Any, items: dict, network: QNetwork, double_q: bool) -> jax.Array:
    """|TD error| + epsilon under the actor's own parameters; 0 for items of an unfilled window."""
    errors, _ = td_errors(actor_params, actor_params, items, network, double_q)
    return (jnp.abs(errors) + PRIORITY_EPSILON) * items["valid"]


def gated(ready: jax.Array, learned: ApexLearner, inserted: ApexLearner) -> ApexLearner:
    """The learned state once learning may start, else the inserted one; the replay's items are the same in both
    (only the sum tree is chosen): a select over the whole buffer would copy it."""
    train_state, target_params, learner_updates, sum_tree = select_tree(
        ready, (learned.train_state, learned.target_params, learned.learner_updates,
                learned.replay_state.sum_tree_state),
        (inserted.train_state, inserted.target_params, inserted.learner_updates, inserted.replay_state.sum_tree_state))
    replay_state = inserted.replay_state.replace(sum_tree_state=sum_tree)
    return ApexLearner(train_state, target_params, replay_state, learner_updates)


@register_algorithm("apex", config=ApexConfig)
def make_apex(config: ApexConfig, env: Any, env_params: Any) -> Algorithm:
    num_envs = config.num_actors * config.envs_per_actor
    epsilons = np.asarray(actor_epsilons(config.num_actors, config.actor_epsilon, config.actor_alpha))
    env_epsilons = jnp.repeat(jnp.asarray(epsilons), config.envs_per_actor)  # actor i owns envs i*E .. i*E+E-1
    network = make_q_network(config, env)
    stats_env = EpisodeStatistics(env)
    reset_envs = jax.vmap(stats_env.reset, in_axes=(0, None))
    step_envs = jax.vmap(stats_env.step, in_axes=(0, 0, 0, None))
    replay = prioritized_replay(env, num_envs, config.buffer_size, config.batch_size, config.n_step, config.discount,
                                config.priority_alpha)
    optimizer = clipped_adam(config.max_grad_norm)

    # the actor part: a fixed epsilon per env, n-step items (or frame steps) with the priorities of the items their
    # windows complete, under the actor's parameters
    act = lambda params, obs, epsilons, uniforms: actor.act(network, params, obs, epsilons, uniforms)

    def observe(actor_params: Any, window: NStepWindow, step: dict) -> tuple[NStepWindow, dict, jax.Array]:
        window, items = actor.record(window, step["obs"], step["action"], step["reward"], step["terminated"],
                                     step["truncated"], step["final_obs"], config.n_step, config.discount,
                                     step.get("acted"))
        return window, replay.record(items, step), actor_priorities(actor_params, items, network, config.double_q)

    # the learner part: prioritised replay (a row per env), rounds of importance-weighted batches
    def learner_init(key: jax.Array, obs: jax.Array) -> ApexLearner:
        params = network.init(key, obs)
        return ApexLearner(TrainState.create(apply_fn=network.apply, params=params, tx=optimizer), params,
                           replay.init(obs), jnp.int32(0))

    def insert(learner: ApexLearner, items: dict, priorities: jax.Array) -> ApexLearner:
        return learner.replace(replay_state=replay.add(learner.replay_state, items, priorities))

    def learner_step(carry: tuple, uniforms: jax.Array) -> tuple[tuple, dict]:
        """One prioritised batch: importance-weighted Huber loss, then new priorities |TD error|."""
        train_state, target_params, replay_state, learner_updates, step_size = carry
        items, indices, probabilities = replay.sample(replay_state, uniforms)
        weights = importance_weights(probabilities, annealed_beta(config, learner_updates))

        (loss, (errors, chosen)), grads = learner_gradients(
            train_state.params, target_params, items, weights, network, config.double_q)
        train_state = apply_gradients(train_state, grads, step_size)
        # slots without a complete transition keep priority 0, so they are never drawn again
        new_priorities = (jnp.abs(errors) + PRIORITY_EPSILON) * items["valid"]
        replay_state = replay.set_priorities(replay_state, indices, new_priorities)
        learner_updates = learner_updates + 1
        copy = learner_updates % config.target_update_period == 0
        target_params = select_tree(copy, train_state.params, target_params)
        stats = {"loss": loss, "q_mean": chosen.mean(),
                 "is_weight_min": weights.min(), "is_weight_mean": weights.mean()}
        return (train_state, target_params, replay_state, learner_updates, step_size), stats

    def learn(learner: ApexLearner, key: jax.Array, env_steps: jax.Array) -> tuple[ApexLearner, dict]:
        # the decay follows the seed's env steps over all of its learners, as total_env_steps counts them
        step_size = decayed_learning_rate(config.learning_rate, config.lr_final_fraction, config.lr_decay_env_steps,
                                          env_steps * num_learners())
        carry = (learner.train_state, learner.target_params, learner.replay_state, learner.learner_updates, step_size)
        # every batch's stratum positions at once: one draw site, not one per learner step
        stratum_uniforms = jax.random.uniform(key, (config.learner_updates_per_iteration, config.batch_size))
        (train_state, target_params, replay_state, learner_updates, _), stats = jax.lax.scan(
            learner_step, carry, stratum_uniforms)
        metrics = {"train/loss": stats["loss"].mean(), "train/q_mean": stats["q_mean"].mean(),
                   "train/learning_rate": step_size, "replay/is_weight_min": stats["is_weight_min"].min(),
                   "replay/is_weight_mean": stats["is_weight_mean"].mean()}
        return ApexLearner(train_state, target_params, replay_state, learner_updates), metrics

    def init(key: jax.Array) -> ApexState:
        key, net_key, reset_key = jax.random.split(key, 3)
        # one network init per seed, shared by its learners; envs, actors and sampling differ per device
        key, reset_key = (jax.random.fold_in(k, device_index()) for k in (key, reset_key))
        obs, env_state = reset_envs(jax.random.split(reset_key, num_envs), env_params)
        learner = learner_init(net_key, obs)
        return ApexState(learner, learner.train_state.params, env_state, obs, empty_window(obs, config.n_step),
                         jnp.int32(0), key)

    def actor_step(carry: tuple, draws: tuple[jax.Array, jax.Array]) -> tuple[tuple, tuple]:
        """Every env of every actor steps once; the oldest n-step transitions get their priorities."""
        actor_params, env_state, obs, window = carry
        action_uniforms, env_keys = draws
        actions = act(actor_params, obs, env_epsilons, action_uniforms)
        next_obs, env_state, reward, terminated, truncated, info = step_envs(env_keys, env_state, actions, env_params)
        window, items, priorities = observe(actor_params, window, {
            "obs": obs, "action": actions, "reward": reward, "terminated": terminated, "truncated": truncated,
            "final_obs": info["final_observation"]})
        return (actor_params, env_state, next_obs, window), (items, priorities, info["returned_episode_return"])

    def update(state: ApexState) -> tuple[ApexState, dict]:
        """The actor part over `rollout_length` steps of every env, then the learner part: one insert, one round."""
        key, rollout_key, learn_key = jax.random.split(state.key, 3)
        carry = (state.actor_params, state.env_state, state.obs, state.window)
        (_, env_state, obs, window), (items, priorities, episode_returns) = jax.lax.scan(
            actor_step, carry, rollout_draws(rollout_key, config.rollout_length, num_envs))
        inserted = insert(state.learner, items, priorities)
        env_steps = state.env_steps + num_envs * config.rollout_length
        learned, learn_metrics = learn(inserted, learn_key, env_steps)
        ready = env_steps >= jnp.maximum(config.learning_starts, config.batch_size)
        learner = gated(ready, learned, inserted)
        updates = learner.learner_updates
        refresh = updates // config.actor_sync_period > state.learner.learner_updates // config.actor_sync_period
        actor_params = select_tree(refresh, learner.train_state.params, state.actor_params)

        returns_per_actor = episode_returns[-1].reshape(config.num_actors, config.envs_per_actor).mean(axis=1)
        not_yet = lambda name: jnp.where(ready, learn_metrics[name], jnp.nan)
        metrics = {
            "train/loss": not_yet("train/loss"),
            "train/q_mean": not_yet("train/q_mean"),
            "train/beta": annealed_beta(config, updates),
            "train/learning_rate": learn_metrics["train/learning_rate"],
            "train/episode_return": episode_returns[-1].mean(),
            "learner/updates": updates.astype(jnp.float32),
            "replay/size": jnp.minimum(env_steps, config.buffer_size).astype(jnp.float32),
            "replay/is_weight_min": not_yet("replay/is_weight_min"),
            "replay/is_weight_mean": not_yet("replay/is_weight_mean"),
            **{f"actors/return_eps_{float(eps):.3g}": returns_per_actor[i] for i, eps in enumerate(epsilons)},
        }
        return ApexState(learner, actor_params, env_state, obs, window, env_steps, key), metrics

    def replay_metrics(state: ApexState) -> dict:
        """Mean and max raw priority |delta| over the stored items (a pass over every leaf: once per chunk)."""
        priorities = replay.stored_priorities(state.learner.replay_state)
        stored = priorities > 0
        return {"replay/priority_mean": priorities.sum() / jnp.maximum(stored.sum(), 1),
                "replay/priority_max": priorities.max()}

    def policy(state: ApexState) -> Any:
        return state.learner.train_state.params

    def greedy(params: Any, obs: jax.Array, key: jax.Array) -> jax.Array:
        return jnp.argmax(network.apply(params, obs), axis=-1).astype(jnp.int32)

    parts = ActorLearner(
        num_envs=num_envs, block_steps=config.rollout_length,
        learning_starts=max(config.learning_starts, config.batch_size),
        actor_init=lambda obs: empty_window(obs, config.n_step, host=True), epsilons=lambda _: env_epsilons,
        act=act, observe=observe, learner_init=learner_init, insert=insert, learn=learn,
        updates_per_learn=config.learner_updates_per_iteration,
        samples_per_learn=config.learner_updates_per_iteration * config.batch_size,
        actor_params=lambda learner: learner.train_state.params, learner_steps=lambda learner: learner.learner_updates,
        sync_period=config.actor_sync_period)
    return Algorithm(init, update, policy, greedy, env_steps_per_update=num_envs * config.rollout_length,
                     parallel_learners=True, counters=("learner/updates",),
                     health_metrics=("train/loss", "train/q_mean"), learner_steps="learner/updates",
                     state_metrics=replay_metrics,
                     headline_metrics=(("train/episode_return", "train return"), ("train/loss", "loss")),
                     actor_learner=parts, memory=Memory("replay", "algo.buffer_size", config.buffer_size))
