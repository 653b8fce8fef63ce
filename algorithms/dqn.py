"""DQN: Flax Q-network, Optax optimizer, uniform replay on Flashbax, n-step double-Q targets.

One update = `train_every` env steps over `num_envs` vectorized envs, their n-step transitions
added to replay, then `updates_per_train` gradient steps once `learning_starts` is reached.
Terminations never bootstrap; truncations bootstrap from the final observation. An update's
randomness is drawn in bulk before its loops (see algorithms/common/exploration.rollout_draws).
"""
import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax
from flax import struct
from flax.training.train_state import TrainState

from algorithms.common import actor
from algorithms.common.networks import QNetwork, check_network_config, make_q_network, select_tree
from algorithms.common.nstep import NStepWindow, empty_window
from algorithms.common.optimizer import apply_gradients, check_learning_rate_config, clipped_adam, decayed_learning_rate
from algorithms.common.replays import uniform_replay
from algorithms.common.targets import huber, squared, td_errors
from framework.core.algorithm import ActorLearner, Algorithm, Memory
from framework.core.env import EpisodeStatistics
from framework.core.errors import check, check_choice, check_number, check_positive_int
from framework.core.keys import rollout_draws
from framework.core.registry import register_algorithm

LOSSES = {"huber": huber, "mse": squared}


@dataclasses.dataclass
class DQNConfig:
    """DQN's keys and their defaults: what `algo=dqn` runs (conf/algo_env/dqn_<env>.yaml retunes a few keys
    for one env).

    Double-Q, 3-step returns, Huber loss, uniform Flashbax replay, hard target copies. A training
    round of 16 batches of 128 every 256 env steps (8 samples per env step) at lr 3e-3, the target
    copied every 64 batches (every 4th round): GridWorld (one-hot) 10 of 10 seeds by 20k env steps at
    seed=0/1/2.
    """

    name: str = "dqn"
    num_envs: int = 8
    buffer_size: int = 50_000
    batch_size: int = 128
    learning_starts: int = 1_000  # env steps before the first gradient step
    train_every: int = 256  # env steps (over all envs) between training rounds; a multiple of num_envs
    updates_per_train: int = 16
    learning_rate: float = 3e-3
    lr_decay_env_steps: int = 0  # env steps of a linear decay to lr_final_fraction * learning_rate; 0: constant
    lr_final_fraction: float = 0.0
    max_grad_norm: float = 10.0
    discount: float = 0.99
    n_step: int = 3
    double_q: bool = True
    dueling: bool = False
    loss: str = "huber"
    hidden_sizes: list[int] = dataclasses.field(default_factory=lambda: [64, 64])
    activation: str = "relu"
    layer_norm: bool = False
    torso: Optional[str] = None  # mlp, conv or nature; null: nature for [H, W, C] images >= 36x36, conv for smaller
    conv_channels: list[int] = dataclasses.field(default_factory=lambda: [16])  # conv torso: 3x3 filters per layer
    conv_dense: int = 128  # conv torso: units of its dense layer
    target_update_period: int = 64  # gradient steps between hard target copies (tau = 1)
    tau: float = 1.0  # < 1: Polyak averaging at every gradient step instead
    epsilon_start: float = 1.0
    epsilon_end: float = 0.04
    epsilon_decay_steps: int = 8_000  # env steps of the linear decay
    # host envs: learner updates between refreshes of the actors' parameters (the single program acts with
    # the newest every round; a host actor takes a published copy, so 1 keeps them as close as the runtime can)
    actor_sync_period: int = 1

    def validate(self) -> None:
        for key in ("num_envs", "buffer_size", "batch_size", "train_every", "updates_per_train",
                    "n_step", "target_update_period", "epsilon_decay_steps", "actor_sync_period"):
            check_positive_int(f"algo.{key}", getattr(self, key))
        check_positive_int("algo.learning_starts", self.learning_starts, minimum=0)
        check(self.train_every % self.num_envs == 0, "algo.train_every", self.train_every,
              f"a multiple of algo.num_envs ({self.num_envs})", "every env steps the same number of times")
        check(self.batch_size <= self.buffer_size, "algo.batch_size", self.batch_size,
              f"at most algo.buffer_size ({self.buffer_size})", "a batch cannot be larger than the buffer")
        check_learning_rate_config(self.learning_rate, self.lr_decay_env_steps, self.lr_final_fraction)
        check_number("algo.max_grad_norm", self.max_grad_norm, 0, low_inclusive=False)
        check_number("algo.discount", self.discount, 0, 1)
        check_choice("algo.loss", self.loss, tuple(LOSSES))
        check_network_config(self)
        check_number("algo.tau", self.tau, 0, 1, low_inclusive=False)
        check_number("algo.epsilon_start", self.epsilon_start, 0, 1)
        check_number("algo.epsilon_end", self.epsilon_end, 0, 1)


@struct.dataclass
class DQNLearner:
    train_state: TrainState
    target_params: Any
    replay_state: Any
    gradient_steps: jax.Array


@struct.dataclass
class DQNState:
    learner: DQNLearner
    env_state: Any
    obs: jax.Array
    window: NStepWindow
    env_steps: jax.Array
    key: jax.Array


def linear_epsilon(config: DQNConfig, env_steps: jax.Array) -> jax.Array:
    fraction = jnp.clip(env_steps / config.epsilon_decay_steps, 0.0, 1.0)
    return config.epsilon_start + fraction * (config.epsilon_end - config.epsilon_start)


def dqn_loss(params: Any, target_params: Any, batch: dict, network: QNetwork, double_q: bool,
             td_loss=huber) -> tuple[jax.Array, jax.Array]:
    """Mean TD loss over the valid items (the first n-1 steps of a run fill no window), and mean Q."""
    errors, chosen = td_errors(params, target_params, batch, network, double_q)
    weights = batch["valid"]
    return (weights * td_loss(errors)).sum() / jnp.maximum(weights.sum(), 1.0), chosen.mean()


@register_algorithm("dqn", config=DQNConfig)
def make_dqn(config: DQNConfig, env: Any, env_params: Any) -> Algorithm:
    num_envs, n = config.num_envs, config.n_step
    steps_per_update = config.train_every // num_envs
    network = make_q_network(config, env)
    stats_env = EpisodeStatistics(env)
    reset_envs = jax.vmap(stats_env.reset, in_axes=(0, None))
    step_envs = jax.vmap(stats_env.step, in_axes=(0, 0, 0, None))
    replay = uniform_replay(env, num_envs, config.buffer_size, config.batch_size, n, config.discount)
    optimizer = clipped_adam(config.max_grad_norm)
    learning_rate = lambda env_steps: decayed_learning_rate(
        config.learning_rate, config.lr_final_fraction, config.lr_decay_env_steps, env_steps)
    td_loss = LOSSES[config.loss]

    # the actor part: epsilon-greedy on a linear schedule, n-step items or frame steps (no actor-side priorities)
    epsilons = lambda env_steps: linear_epsilon(config, env_steps)
    act = lambda params, obs, epsilons, uniforms: actor.act(network, params, obs, epsilons, uniforms)

    def observe(params: Any, window: NStepWindow, step: dict) -> tuple[NStepWindow, dict, None]:
        window, item = actor.record(window, step["obs"], step["action"], step["reward"], step["terminated"],
                                    step["truncated"], step["final_obs"], n, config.discount, step.get("acted"))
        return window, replay.record(item, step), None

    # the learner part: uniform replay, rounds of `updates_per_train` double-Q batches
    def learner_init(key: jax.Array, obs: jax.Array) -> DQNLearner:
        params = network.init(key, obs)
        train_state = TrainState.create(apply_fn=network.apply, params=params, tx=optimizer)
        return DQNLearner(train_state, params, replay.init(obs), jnp.int32(0))

    def insert(learner: DQNLearner, items: dict, priorities: None) -> DQNLearner:
        return learner.replace(replay_state=replay.add(learner.replay_state, items, None))

    def gradient_step(carry: tuple, random_bits: jax.Array) -> tuple[tuple, tuple]:
        train_state, target_params, replay_state, gradient_steps, step_size = carry
        batch, _, _ = replay.sample(replay_state, random_bits)
        (loss, q_mean), grads = jax.value_and_grad(dqn_loss, has_aux=True)(
            train_state.params, target_params, batch, network, config.double_q, td_loss)
        train_state = apply_gradients(train_state, grads, step_size)
        gradient_steps = gradient_steps + 1
        if config.tau < 1.0:
            target_params = optax.incremental_update(train_state.params, target_params, config.tau)
        else:
            copy = gradient_steps % config.target_update_period == 0
            target_params = select_tree(copy, train_state.params, target_params)
        return (train_state, target_params, replay_state, gradient_steps, step_size), (loss, q_mean)

    def learn(learner: DQNLearner, key: jax.Array, env_steps: jax.Array) -> tuple[DQNLearner, dict]:
        step_size = learning_rate(env_steps)
        carry = (learner.train_state, learner.target_params, learner.replay_state, learner.gradient_steps, step_size)
        sample_bits = jax.random.bits(key, (config.updates_per_train, config.batch_size), jnp.uint32)
        (train_state, target_params, _, gradient_steps, _), (losses, q_means) = jax.lax.scan(
            gradient_step, carry, sample_bits)
        metrics = {"train/loss": losses.mean(), "train/q_mean": q_means.mean(), "train/learning_rate": step_size}
        return DQNLearner(train_state, target_params, learner.replay_state, gradient_steps), metrics

    def init(key: jax.Array) -> DQNState:
        key, net_key, reset_key = jax.random.split(key, 3)
        obs, env_state = reset_envs(jax.random.split(reset_key, num_envs), env_params)
        return DQNState(learner_init(net_key, obs), env_state, obs, empty_window(obs, n), jnp.int32(0), key)

    def env_step(carry: tuple, draws: tuple[jax.Array, jax.Array]) -> tuple[tuple, dict]:
        """Every env acts epsilon-greedily once; the window's oldest transition becomes an item."""
        params, env_state, obs, window, env_steps = carry
        action_uniforms, env_keys = draws
        actions = act(params, obs, epsilons(env_steps), action_uniforms)
        next_obs, env_state, reward, terminated, truncated, info = step_envs(env_keys, env_state, actions, env_params)
        window, item, _ = observe(params, window, {"obs": obs, "action": actions, "reward": reward,
                                                   "terminated": terminated, "truncated": truncated,
                                                   "final_obs": info["final_observation"]})
        carry = (params, env_state, next_obs, window, env_steps + num_envs)
        return carry, {**item, "episode_return": info["returned_episode_return"]}

    def update(state: DQNState) -> tuple[DQNState, dict]:
        """The actor part over `train_every` env steps, then the learner part: one insert, one round."""
        key, rollout_key, sample_key = jax.random.split(state.key, 3)
        carry = (state.learner.train_state.params, state.env_state, state.obs, state.window, state.env_steps)
        (_, env_state, obs, window, env_steps), items = jax.lax.scan(
            env_step, carry, rollout_draws(rollout_key, steps_per_update, num_envs))
        episode_returns = items.pop("episode_return")
        inserted = insert(state.learner, items, None)
        learned, learn_metrics = learn(inserted, sample_key, env_steps)
        # the buffer holds a batch's worth of items (one per env step) and learning may start
        ready = (env_steps >= config.batch_size) & (env_steps >= config.learning_starts)
        learner = select_tree(ready, learned, inserted)

        metrics = {
            "train/loss": jnp.where(ready, learn_metrics["train/loss"], jnp.nan),
            "train/q_mean": jnp.where(ready, learn_metrics["train/q_mean"], jnp.nan),
            "train/epsilon": linear_epsilon(config, env_steps),
            "train/learning_rate": learn_metrics["train/learning_rate"],
            "train/episode_return": episode_returns[-1].mean(),
            "train/gradient_steps": learner.gradient_steps.astype(jnp.float32),
            "replay/size": jnp.minimum(env_steps, config.buffer_size).astype(jnp.float32),
        }
        return DQNState(learner, env_state, obs, window, env_steps, key), metrics

    def policy(state: DQNState) -> Any:
        return state.learner.train_state.params

    def greedy(params: Any, obs: jax.Array, key: jax.Array) -> jax.Array:
        return jnp.argmax(network.apply(params, obs), axis=-1).astype(jnp.int32)

    parts = ActorLearner(
        num_envs=num_envs, block_steps=steps_per_update, learning_starts=config.learning_starts,
        actor_init=lambda obs: empty_window(obs, n, host=True), epsilons=epsilons, act=act, observe=observe,
        learner_init=learner_init, insert=insert, learn=learn,
        updates_per_learn=config.updates_per_train,
        samples_per_learn=config.updates_per_train * config.batch_size,
        actor_params=lambda learner: learner.train_state.params, learner_steps=lambda learner: learner.gradient_steps,
        sync_period=config.actor_sync_period)
    return Algorithm(init, update, policy, greedy, env_steps_per_update=config.train_every,
                     health_metrics=("train/loss", "train/q_mean"), learner_steps="train/gradient_steps",
                     headline_metrics=(("train/episode_return", "train return"), ("train/loss", "loss")),
                     actor_learner=parts, memory=Memory("replay", "algo.buffer_size", config.buffer_size))
