"""DQN: the DQN family (algorithms/common/dqn_family.py) with uniform replay and a linear epsilon schedule.

One update = `train_every` env steps over `num_envs` vectorized envs, their n-step transitions
added to replay, then `updates_per_train` gradient steps once `learning_starts` is reached.
Terminations never bootstrap; truncations bootstrap from the final observation.
"""
import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp

from lightspeed.algorithms.common.dqn_family import Exploration, FamilySettings, dqn_family_parts, greedy_act
from lightspeed.algorithms.common.networks import check_network_config, make_q_network
from lightspeed.algorithms.common.optimizer import check_learning_rate_config, decayed_learning_rate
from lightspeed.algorithms.common.replays import replay_learning_start, uniform_replay
from lightspeed.algorithms.common.targets import huber, squared
from lightspeed.framework.core.algorithm import Algorithm, Memory
from lightspeed.framework.core.errors import check, check_choice, check_number, check_positive_int
from lightspeed.framework.core.registry import register_algorithm

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

    name: str = "dqn"  # the registered name of the algorithm that algo=dqn chooses
    num_envs: int = 8  # envs per seed, stepped together
    buffer_size: int = 50_000  # replay capacity in n-step transitions, per seed
    batch_size: int = 128  # transitions per gradient step
    learning_starts: int = 1_000  # env steps before the first gradient step
    train_every: int = 256  # env steps (over all envs) between training rounds; a multiple of num_envs
    updates_per_train: int = 16  # gradient steps (batches) per training round
    learning_rate: float = 3e-3  # Adam's step size, at the start of the decay
    lr_decay_env_steps: int = 0  # env steps of a linear decay to lr_final_fraction * learning_rate; 0: constant
    lr_final_fraction: float = 0.0  # the learning rate at the decay's end, as a fraction of learning_rate
    max_grad_norm: float = 10.0  # the gradient's global norm is clipped to this
    discount: float = 0.99  # per-step discount (gamma)
    n_step: int = 3  # rewards summed in a transition's return before it bootstraps
    double_q: bool = True  # the online network picks the bootstrap action, the target network values it
    dueling: bool = False  # dueling head: a value plus the advantages minus their mean
    loss: str = "huber"  # the TD error's loss: huber or mse
    # mlp torso: units of each Dense layer
    hidden_sizes: list[int] = dataclasses.field(default_factory=lambda: [64, 64])
    activation: str = "relu"  # relu, tanh, gelu, silu or elu
    layer_norm: bool = False  # LayerNorm between each hidden Dense and its activation
    torso: Optional[str] = None  # mlp, conv or nature; null: nature for [H, W, C] images >= 36x36, conv for smaller
    conv_channels: list[int] = dataclasses.field(default_factory=lambda: [16])  # conv torso: 3x3 filters per layer
    conv_dense: int = 128  # conv torso: units of its dense layer
    target_update_period: int = 64  # gradient steps between hard target copies (tau = 1)
    tau: float = 1.0  # < 1: Polyak averaging at every gradient step instead
    epsilon_start: float = 1.0  # exploration epsilon at env step 0, the same for every env
    epsilon_end: float = 0.04  # epsilon after epsilon_decay_steps, kept to the end of training
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

    learning_start = replay_learning_start


def linear_epsilon(config: DQNConfig, env_steps: jax.Array) -> jax.Array:
    fraction = jnp.clip(env_steps / config.epsilon_decay_steps, 0.0, 1.0)
    return config.epsilon_start + fraction * (config.epsilon_end - config.epsilon_start)


@register_algorithm("dqn", config=DQNConfig)
def make_dqn(config: DQNConfig, env: Any, env_params: Any) -> Algorithm:
    network = make_q_network(config, env)
    settings = FamilySettings(
        num_envs=config.num_envs, block_steps=config.train_every // config.num_envs,
        learning_starts=config.learning_starts, n_step=config.n_step, discount=config.discount,
        updates_per_learn=config.updates_per_train, batch_size=config.batch_size,
        learning_rate=lambda env_steps: decayed_learning_rate(config.learning_rate, config.lr_final_fraction,
                                                              config.lr_decay_env_steps, env_steps),
        max_grad_norm=config.max_grad_norm, double_q=config.double_q, td_loss=LOSSES[config.loss],
        target_update_period=config.target_update_period, tau=config.tau, sync_period=config.actor_sync_period,
        prioritized=None, average_over_devices=False)
    # every env explores alike, on a linear schedule over the seed's env steps
    exploration = Exploration(epsilon=lambda index, env_steps: linear_epsilon(config, env_steps),
                              metrics=lambda epsilons, returns: {"train/epsilon": epsilons[0]})
    replay = uniform_replay(env, config.num_envs, config.buffer_size, config.batch_size, config.n_step, config.discount)
    parts = dqn_family_parts(settings, network, replay, exploration)
    return Algorithm(init=None, update=None, policy=None, act=greedy_act(network),
                     env_steps_per_update=config.train_every,
                     health_metrics=("train/loss", "train/q_mean"), learner_steps="learner/updates",
                     headline_metrics=(("train/episode_return", "train return"), ("train/loss", "loss")),
                     actor_learner=parts, memory=Memory("replay", "algo.buffer_size", config.buffer_size))
