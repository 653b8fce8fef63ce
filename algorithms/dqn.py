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

from algorithms.common.exploration import epsilon_greedy, rollout_draws
from algorithms.common.networks import QNetwork, check_network_config, make_q_network, select_tree
from algorithms.common.nstep import NStepWindow, empty_window, oldest_transition, push
from algorithms.common.optimizer import apply_gradients, check_learning_rate_config, clipped_adam, decayed_learning_rate
from algorithms.common.targets import huber, squared, td_errors
from algorithms.common.uniform_replay import make_uniform_replay
from framework.algorithm import Algorithm
from framework.env import EpisodeStatistics
from framework.errors import check, check_choice, check_number, check_positive_int
from framework.registry import register_algorithm

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
    torso: Optional[str] = None  # mlp or conv; null: conv for [H, W, C] observations, else mlp
    conv_channels: list[int] = dataclasses.field(default_factory=lambda: [16])  # conv torso: 3x3 filters per layer
    conv_dense: int = 128  # conv torso: units of its dense layer
    target_update_period: int = 64  # gradient steps between hard target copies (tau = 1)
    tau: float = 1.0  # < 1: Polyak averaging at every gradient step instead
    epsilon_start: float = 1.0
    epsilon_end: float = 0.04
    epsilon_decay_steps: int = 8_000  # env steps of the linear decay

    def validate(self) -> None:
        for key in ("num_envs", "buffer_size", "batch_size", "train_every", "updates_per_train",
                    "n_step", "target_update_period", "epsilon_decay_steps"):
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
class DQNState:
    train_state: TrainState
    target_params: Any
    replay_state: Any
    env_state: Any
    obs: jax.Array
    window: NStepWindow
    env_steps: jax.Array
    gradient_steps: jax.Array
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
    replay = make_uniform_replay(config.buffer_size, config.batch_size)
    optimizer = clipped_adam(config.max_grad_norm)
    learning_rate = lambda env_steps: decayed_learning_rate(
        config.learning_rate, config.lr_final_fraction, config.lr_decay_env_steps, env_steps)
    td_loss = LOSSES[config.loss]

    def init(key: jax.Array) -> DQNState:
        key, net_key, reset_key = jax.random.split(key, 3)
        obs, env_state = reset_envs(jax.random.split(reset_key, num_envs), env_params)
        params = network.init(net_key, obs)
        train_state = TrainState.create(apply_fn=network.apply, params=params, tx=optimizer)
        window = empty_window(obs, n)
        example = jax.tree.map(lambda x: x[0], oldest_transition(window, config.discount))
        return DQNState(train_state, params, replay.init(example), env_state, obs, window,
                        jnp.int32(0), jnp.int32(0), key)

    def env_step(carry: tuple, draws: tuple[jax.Array, jax.Array]) -> tuple[tuple, dict]:
        """Every env acts epsilon-greedily once; the window's oldest transition becomes an item."""
        params, env_state, obs, window, env_steps = carry
        action_uniforms, env_keys = draws
        q_values = network.apply(params, obs)
        actions = epsilon_greedy(q_values, linear_epsilon(config, env_steps), action_uniforms)
        next_obs, env_state, reward, terminated, truncated, info = step_envs(env_keys, env_state, actions, env_params)
        window = push(window, {"obs": obs, "action": actions, "reward": reward, "terminated": terminated,
                               "truncated": truncated, "next_obs": info["final_observation"]}, n)
        item = oldest_transition(window, config.discount)
        carry = (params, env_state, next_obs, window, env_steps + num_envs)
        return carry, {**item, "episode_return": info["returned_episode_return"]}

    def gradient_step(carry: tuple, random_bits: jax.Array) -> tuple[tuple, tuple]:
        train_state, target_params, replay_state, gradient_steps, step_size = carry
        batch = replay.sample(replay_state, random_bits)
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

    def update(state: DQNState) -> tuple[DQNState, dict]:
        key, rollout_key, sample_key = jax.random.split(state.key, 3)
        carry = (state.train_state.params, state.env_state, state.obs, state.window, state.env_steps)
        (_, env_state, obs, window, env_steps), items = jax.lax.scan(
            env_step, carry, rollout_draws(rollout_key, steps_per_update, num_envs))
        episode_returns = items.pop("episode_return")
        # [steps, envs, ...] -> one sequence of items for the buffer
        items = jax.tree.map(lambda x: x.reshape(1, -1, *x.shape[2:])[0], items)
        replay_state = replay.add(state.replay_state, items)

        step_size = learning_rate(env_steps)
        learn_carry = (state.train_state, state.target_params, replay_state, state.gradient_steps, step_size)
        sample_bits = jax.random.bits(sample_key, (config.updates_per_train, config.batch_size), jnp.uint32)
        learned, (losses, q_means) = jax.lax.scan(gradient_step, learn_carry, sample_bits)
        ready = replay.can_sample(replay_state) & (env_steps >= config.learning_starts)
        train_state, target_params, _, gradient_steps, _ = select_tree(ready, learned, learn_carry)

        metrics = {
            "train/loss": jnp.where(ready, losses.mean(), jnp.nan),
            "train/q_mean": jnp.where(ready, q_means.mean(), jnp.nan),
            "train/epsilon": linear_epsilon(config, env_steps),
            "train/learning_rate": step_size,
            "train/episode_return": episode_returns[-1].mean(),
            "train/gradient_steps": gradient_steps.astype(jnp.float32),
            "replay/size": jnp.minimum(env_steps, config.buffer_size).astype(jnp.float32),
        }
        new_state = DQNState(train_state, target_params, replay_state, env_state, obs, window,
                             env_steps, gradient_steps, key)
        return new_state, metrics

    def policy(state: DQNState) -> Any:
        return state.train_state.params

    def act(params: Any, obs: jax.Array, key: jax.Array) -> jax.Array:
        return jnp.argmax(network.apply(params, obs), axis=-1).astype(jnp.int32)

    return Algorithm(init, update, policy, act, env_steps_per_update=config.train_every,
                     health_metrics=("train/loss", "train/q_mean"), learner_steps="train/gradient_steps",
                     headline_metrics=(("train/episode_return", "train return"), ("train/loss", "loss")))
