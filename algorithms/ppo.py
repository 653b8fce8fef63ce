"""PPO (Schulman et al., 2017) as actor and learner parts, on-policy: every block of experience is learned once.

    actor    samples from the policy (a Categorical over Discrete actions, a diagonal Gaussian over a Box's) and
             hands its log-prob and value to `observe` as extras; `observe` adds the value of the true next
             observation (a truncated episode bootstraps from its final observation) and the observations as the
             network reads them (normalised with the actors' statistics)
    learner  keeps the latest block; a round is GAE(lambda) over it, then `update_epochs` passes of
             `num_minibatches` minibatches of the clipped surrogate, the (optionally clipped) value loss and an
             entropy bonus, the gradient's norm clipped, the learning rate annealed over the env steps

A Box action is the Gaussian's sample as it is: the framework clips it to the bounds for the env, the log-prob is
of the unclipped sample (CleanRL's and Stable-Baselines3's choice; `ActorStep.raw_action` is that sample).
"""
import dataclasses
from typing import Any, NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from flax.training.train_state import TrainState

from lightspeed.algorithms.common.advantages import gae
from lightspeed.algorithms.common.advantages import normalized as normalized_advantages
from lightspeed.algorithms.common.distributions import Categorical, DiagonalGaussian
from lightspeed.algorithms.common.networks import NATURE_MIN_SIZE, check_network_config, torso_features
from lightspeed.algorithms.common.normalization import empty_stats, normalized, scaled, updated
from lightspeed.algorithms.common.optimizer import apply_gradients, check_learning_rate_config, decayed_learning_rate
from lightspeed.algorithms.common.policy_losses import (
    approx_kl,
    clipped_surrogate,
    masked_mean,
    outside_clip_range,
    value_errors,
)
from lightspeed.framework.core.algorithm import ActorLearner, ActorStep, Algorithm, Metrics
from lightspeed.framework.core.errors import check, check_number, check_positive_int
from lightspeed.framework.core.registry import register_algorithm
from lightspeed.framework.core.spaces import BOX, DISCRETE, clip_actions


@dataclasses.dataclass
class PPOConfig:
    """PPO's keys and their defaults: PureJaxRL's CartPole-v1 PPO (4 envs x 128 steps per block, 4 epochs of 4
    minibatches, lr 2.5e-4 annealed to 0, gamma 0.99, GAE lambda 0.95, clip 0.2, entropy 0.01, value 0.5, gradient
    norm 0.5, tanh MLPs of 64 x 64 for the actor and the critic apart, Adam's epsilon 1e-5), which CleanRL's
    ppo.py shares. conf/algo_env/ppo_<env>.yaml retunes a few keys for one env (rl-zoo's settings for
    continuous control: observation normalisation and reward scaling)."""

    name: str = "ppo"  # the registered name of the algorithm that algo=ppo chooses
    num_envs: int = 4  # a seed's envs
    rollout_length: int = 128  # steps of every env per block (PureJaxRL's num_steps)
    update_epochs: int = 4  # passes over each block
    num_minibatches: int = 4  # per pass; each holds num_envs x rollout_length / num_minibatches steps
    discount: float = 0.99  # per-step discount (gamma) of the returns and advantages
    gae_lambda: float = 0.95  # GAE's lambda: 0 one-step TD advantages, 1 Monte Carlo returns
    clip_eps: float = 0.2  # the ratio's clip range (and the value's, with clip_value)
    clip_value: bool = True  # the value loss clipped around the acting value by clip_eps (PureJaxRL, CleanRL)
    entropy_coef: float = 0.01  # the entropy bonus's weight in the loss
    value_coef: float = 0.5  # the value loss's weight
    max_grad_norm: float = 0.5  # the gradient's global norm is clipped to this
    learning_rate: float = 2.5e-4  # Adam's, at the start of the decay
    # env steps of a linear decay to lr_final_fraction * learning_rate; 0: constant. conf/algo/ppo.yaml sets
    # ${total_env_steps} (PureJaxRL's anneal_lr over the whole run)
    lr_decay_env_steps: int = 500_000
    lr_final_fraction: float = 0.0  # the learning rate at the decay's end, as a fraction of learning_rate
    adam_eps: float = 1e-5  # Adam's epsilon (PureJaxRL, CleanRL; optax's default is 1e-8)
    normalize_advantages: bool = True  # per minibatch, as CleanRL
    normalize_observations: bool = False  # running mean and variance of the observations (VecNormalize)
    scale_rewards: bool = False  # rewards over the running std of the discounted return (VecNormalize)
    log_std_init: float = 0.0  # a Box policy's state-independent log standard deviation at the start
    hidden_sizes: list[int] = dataclasses.field(default_factory=lambda: [64, 64])  # the actor's and the critic's
    activation: str = "tanh"  # relu, tanh, gelu, silu or elu
    layer_norm: bool = False  # LayerNorm between each hidden Dense and its activation
    torso: Optional[str] = None  # mlp, conv or nature; null: nature for [H, W, C] images >= 36x36, conv for smaller
    conv_channels: list[int] = dataclasses.field(default_factory=lambda: [16])  # conv torso: 3x3 filters per layer
    conv_dense: int = 128  # conv torso: units of its dense layer

    def validate(self) -> None:
        for key in ("num_envs", "rollout_length", "update_epochs", "num_minibatches"):
            check_positive_int(f"algo.{key}", getattr(self, key))
        block = self.num_envs * self.rollout_length
        check(block % self.num_minibatches == 0, "algo.num_minibatches", self.num_minibatches,
              f"a divisor of num_envs x rollout_length ({block})", "every minibatch holds as many steps")
        for key in ("discount", "gae_lambda"):
            check_number(f"algo.{key}", getattr(self, key), 0, 1)
        check_number("algo.clip_eps", self.clip_eps, 0, low_inclusive=False)
        for key in ("entropy_coef", "value_coef"):
            check_number(f"algo.{key}", getattr(self, key), 0)
        check_number("algo.max_grad_norm", self.max_grad_norm, 0, low_inclusive=False)
        check_learning_rate_config(self.learning_rate, self.lr_decay_env_steps, self.lr_final_fraction)
        check_number("algo.adam_eps", self.adam_eps, 0, low_inclusive=False)
        check_number("algo.log_std_init", self.log_std_init, -20, 5)
        check_network_config(self)

    @property
    def updates_per_block(self) -> int:
        return self.update_epochs * self.num_minibatches


class ActorCritic(nn.Module):
    """Policy head and value head; the actor and the critic have torsos of their own, except for images, whose
    convolutional torso they share (CleanRL's Atari PPO). Heads initialised orthogonally (policy 0.01, value 1)."""

    action_size: int
    continuous: bool
    log_std_init: float
    hidden_sizes: tuple = (64, 64)
    activation: str = "tanh"
    layer_norm: bool = False
    torso: str = "mlp"
    conv_channels: tuple = (16,)
    conv_dense: int = 128
    observation_ndim: int = 1

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, Optional[jax.Array], jax.Array]:
        """(logits or mean [..., A], log std [A] or None, value [...])."""
        torso = lambda name: Torso(self.hidden_sizes, self.activation, self.layer_norm, self.torso, self.conv_channels,
                                   self.conv_dense, self.observation_ndim, name=name)
        actor_features = torso("actor_torso")(obs)
        critic_features = actor_features if self.torso != "mlp" else torso("critic_torso")(obs)
        head = nn.Dense(self.action_size, kernel_init=nn.initializers.orthogonal(0.01), name="policy_head")
        value = nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0), name="value_head")(critic_features)[..., 0]
        log_std = (self.param("log_std", nn.initializers.constant(self.log_std_init), (self.action_size,))
                   if self.continuous else None)
        return head(actor_features), log_std, value


class Torso(nn.Module):
    """The Q-networks' torsos (algorithms/common/networks.py), as a module of its own."""

    hidden_sizes: tuple
    activation: str
    layer_norm: bool
    torso: str
    conv_channels: tuple
    conv_dense: int
    observation_ndim: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        return torso_features(self, obs)


class PPOParams(NamedTuple):
    """What actors act with and evaluation plays: the network and the observation statistics it reads with."""

    network: Any
    obs_stats: Any  # RunningStats, or () without observation normalisation


class PPOExtras(NamedTuple):
    """What `act` hands `observe`: the sample's log-prob and the value at the observation."""

    log_prob: jax.Array
    value: jax.Array


class PPOStep(NamedTuple):
    """One env step as the learner keeps it (every field [..., per step])."""

    obs: jax.Array  # as the network reads it (normalised with the actors' statistics)
    action: jax.Array  # the sampled action, unclipped
    log_prob: jax.Array
    value: jax.Array
    next_value: jax.Array  # the value of the true next observation (its final one where the episode ended)
    reward: jax.Array
    terminated: jax.Array
    done: jax.Array  # terminated or truncated: the advantages' chain is cut after this step
    acted: jax.Array  # False: the engine spent the step on a reset (no transition)
    discounted_return: Any  # the env's running discounted return (reward scaling's statistic), or ()
    raw_obs: Any  # the observations unnormalised (their statistic), or ()


@struct.dataclass
class PPOLearner:
    train_state: TrainState
    block: PPOStep  # the latest block [T, N, ...]
    obs_stats: Any
    return_stats: Any
    updates: jax.Array
    blocks: jax.Array  # blocks inserted


def make_network(config: PPOConfig, env: Any, continuous: bool, action_size: int) -> ActorCritic:
    shape = tuple(env.observation_shape)
    image = len(shape) == 3
    torso = config.torso or ("mlp" if not image else "nature" if min(shape[:2]) >= NATURE_MIN_SIZE else "conv")
    check(torso == "mlp" or image, "algo.torso", torso, "mlp (or null) for these observations",
          f"a {torso} torso needs [H, W, C] images, env {env.name} gives {list(shape)}")
    return ActorCritic(action_size, continuous, config.log_std_init, tuple(config.hidden_sizes), config.activation,
                       config.layer_norm, torso, tuple(config.conv_channels), config.conv_dense, max(len(shape), 1))


def ppo_parts(config: PPOConfig, network: ActorCritic, space: Any, obs_shape: tuple[int, ...]) -> ActorLearner:
    """PPO's actor and learner parts."""
    c = config
    continuous = space.kind == BOX
    action_shape = tuple(space.shape) if continuous else ()
    num_envs = c.num_envs
    optimizer = optax.chain(optax.clip_by_global_norm(c.max_grad_norm), optax.scale_by_adam(eps=c.adam_eps))

    def distribution(network_params: Any, obs: jax.Array) -> tuple[Any, jax.Array]:
        """One observation's action distribution and value."""
        head, log_std, value = network.apply(network_params, obs)
        return (DiagonalGaussian(head, log_std) if continuous else Categorical(head)), value

    def network_input(params: PPOParams, obs: jax.Array) -> jax.Array:
        return normalized(params.obs_stats, obs) if c.normalize_observations else obs

    def as_env_action(flat: jax.Array) -> jax.Array:
        return flat.reshape(action_shape) if continuous else flat

    # the actor part
    def act(params: PPOParams, state: tuple, obs: jax.Array, start: jax.Array, key: jax.Array
            ) -> tuple[jax.Array, tuple, PPOExtras]:
        dist, value = distribution(params.network, network_input(params, obs))
        sample = dist.sample(key)
        return as_env_action(sample), state, PPOExtras(dist.log_prob(sample), value)

    def observe(params: PPOParams, running_return: Any, step: ActorStep) -> tuple[Any, PPOStep]:
        """The step as the learner keeps it; the recorder carries each env's discounted return (reward scaling)."""
        values = jax.vmap(lambda obs: distribution(params.network, network_input(params, obs))[1])
        done = step.terminated | step.truncated
        if c.scale_rewards:
            discounted = running_return * c.discount + step.reward
            running_return = jnp.where(done | ~step.acted, 0.0, discounted)
        # the sample as act drew it, flattened per env (an actor thread observes its share of a seed's envs)
        sampled = step.raw_action.reshape(step.reward.shape[0], -1) if continuous else step.raw_action
        item = PPOStep(
            obs=jax.vmap(lambda obs: network_input(params, obs))(step.obs), action=sampled.astype(
                jnp.float32 if continuous else jnp.int32),
            log_prob=step.extras.log_prob, value=step.extras.value, next_value=values(step.final_obs),
            reward=step.reward.astype(jnp.float32), terminated=step.terminated.astype(jnp.float32), done=done,
            acted=step.acted, discounted_return=discounted if c.scale_rewards else (),
            raw_obs=step.obs.astype(jnp.float32) if c.normalize_observations else ())
        return running_return, item

    # the learner part
    def learner_init(key: jax.Array, obs: jax.Array) -> PPOLearner:
        network_params = network.init(key, obs[:1])
        train_state = TrainState.create(apply_fn=network.apply, params=network_params, tx=optimizer)
        example = jax.eval_shape(lambda: observe(
            PPOParams(network_params, empty_stats(obs_shape) if c.normalize_observations else ()),
            jnp.zeros(num_envs), example_step(obs))[1])
        block = jax.tree.map(lambda leaf: jnp.zeros((c.rollout_length, *leaf.shape), leaf.dtype), example)
        return PPOLearner(train_state, block, empty_stats(obs_shape) if c.normalize_observations else (),
                          empty_stats(()) if c.scale_rewards else (), jnp.int32(0), jnp.int32(0))

    def example_step(obs: jax.Array) -> ActorStep:
        flags = jnp.zeros(obs.shape[:1], bool)
        action = jnp.zeros((obs.shape[0], *action_shape), jnp.float32 if continuous else jnp.int32)
        extras = PPOExtras(jnp.zeros(obs.shape[:1]), jnp.zeros(obs.shape[:1]))
        return ActorStep(obs, action, action, extras, jnp.zeros(obs.shape[:1]), flags, flags, obs, flags, flags,
                         flags, ())

    def insert(learner: PPOLearner, block: PPOStep) -> PPOLearner:
        """The block replaces the last one; the running statistics take its steps in."""
        acted = block.acted.reshape(-1)
        flat = lambda x: x.reshape(-1, *x.shape[2:])
        obs_stats = (updated(learner.obs_stats, flat(block.raw_obs), acted) if c.normalize_observations
                     else learner.obs_stats)
        return_stats = (updated(learner.return_stats, flat(block.discounted_return), acted) if c.scale_rewards
                        else learner.return_stats)
        return learner.replace(block=block, obs_stats=obs_stats, return_stats=return_stats,
                               blocks=learner.blocks + 1)

    def loss(network_params: Any, batch: PPOStep, advantages: jax.Array, targets: jax.Array
             ) -> tuple[jax.Array, Metrics]:
        dist, value = jax.vmap(distribution, in_axes=(None, 0))(network_params, batch.obs)
        log_prob = jax.vmap(type(dist).log_prob)(dist, batch.action)
        entropy = jax.vmap(type(dist).entropy)(dist)
        mask = batch.acted.astype(jnp.float32)
        if c.normalize_advantages:
            advantages = normalized_advantages(advantages, mask)
        log_ratio = log_prob - batch.log_prob
        ratio = jnp.exp(log_ratio)
        surrogate = clipped_surrogate(ratio, advantages, c.clip_eps)
        errors = value_errors(value, batch.value, targets, c.clip_eps if c.clip_value else None)
        policy_loss, value_loss = -masked_mean(surrogate, mask), 0.5 * masked_mean(errors, mask)
        entropy = masked_mean(entropy, mask)
        total = policy_loss + c.value_coef * value_loss - c.entropy_coef * entropy
        return total, {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy,
                       "approx_kl": masked_mean(approx_kl(log_ratio), mask),
                       "clip_fraction": masked_mean(outside_clip_range(ratio, c.clip_eps), mask)}

    def learn(learner: PPOLearner, key: jax.Array, env_steps: jax.Array) -> tuple[PPOLearner, Metrics]:
        """A round: GAE over the block, then epochs x minibatches of updates (the block comes out as it came in)."""
        block = learner.block
        rewards = scaled(learner.return_stats, block.reward) if c.scale_rewards else block.reward
        advantages, targets = gae(rewards, block.value, block.next_value, block.terminated, block.done, block.acted,
                                  c.discount, c.gae_lambda)
        steps = c.rollout_length * block.reward.shape[1]
        flat = lambda x: x.reshape(steps, *x.shape[2:])
        data = jax.tree.map(flat, (block, advantages, targets))
        step_size = decayed_learning_rate(c.learning_rate, c.lr_final_fraction, c.lr_decay_env_steps, env_steps)

        def minibatch(train_state: TrainState, indices: jax.Array) -> tuple[TrainState, Metrics]:
            batch, batch_advantages, batch_targets = jax.tree.map(lambda x: x[indices], data)
            (total, stats), grads = jax.value_and_grad(loss, has_aux=True)(
                train_state.params, batch, batch_advantages, batch_targets)
            return apply_gradients(train_state, grads, step_size), {"loss": total, **stats}

        def epoch(train_state: TrainState, epoch_key: jax.Array) -> tuple[TrainState, Metrics]:
            order = jax.random.permutation(epoch_key, steps).reshape(c.num_minibatches, -1)
            return jax.lax.scan(minibatch, train_state, order)

        train_state, stats = jax.lax.scan(epoch, learner.train_state, jax.random.split(key, c.update_epochs))
        metrics = {f"train/{name}": value.mean() for name, value in stats.items()}
        metrics.update({"train/learning_rate": step_size, "train/value_target_mean": masked_mean(
            targets, block.acted.astype(jnp.float32))})
        return learner.replace(train_state=train_state, updates=learner.updates + c.updates_per_block), metrics

    return ActorLearner(
        num_envs=num_envs, block_steps=c.rollout_length, block_units=num_envs * c.rollout_length,
        actor_init=lambda index, env_steps: (), act=act,
        record_init=lambda obs: jnp.zeros(obs.shape[:1], jnp.float32), observe=observe,
        learner_init=learner_init, insert=insert, ready=lambda learner: learner.blocks > 0, learn=learn,
        updates_per_learn=c.updates_per_block, learn_units=num_envs * c.rollout_length,
        actor_params=lambda learner: PPOParams(learner.train_state.params, learner.obs_stats),
        learner_steps=lambda learner: learner.updates, sync_period=c.updates_per_block, on_policy=True)


def policy_mode_act(network: ActorCritic, config: PPOConfig, space: Any):
    """Evaluation's act: the policy's mode (argmax, or the Gaussian's mean clipped to the finite bounds)."""
    continuous = space.kind == BOX

    def act(params: PPOParams, state: Any, obs: jax.Array, start: jax.Array, key: jax.Array) -> tuple[jax.Array, Any]:
        obs = normalized(params.obs_stats, obs) if config.normalize_observations else obs
        head, _, _ = network.apply(params.network, obs)
        if not continuous:
            return jnp.argmax(head).astype(jnp.int32), state
        return clip_actions(space, head.reshape(space.shape)).astype(jnp.float32), state
    return act


@register_algorithm("ppo", config=PPOConfig, acts=(DISCRETE, BOX))
def make_ppo(config: PPOConfig, env: Any, env_params: Any) -> Algorithm:
    space = env.action_space(env_params)
    continuous = space.kind == BOX
    action_size = int(np.prod(space.shape)) if continuous else env.num_actions
    network = make_network(config, env, continuous, action_size)
    check(not config.normalize_observations or len(env.observation_shape) <= 1, "algo.normalize_observations",
          True, "false for image observations", f"env {env.name}'s observations are images of shape "
          f"{list(env.observation_shape)}: their scale is known (bytes), and normalising them per pixel is not PPO's")
    parts = ppo_parts(config, network, space, tuple(env.observation_shape))
    return Algorithm(init=None, update=None, policy=None, act=policy_mode_act(network, config, space),
                     env_steps_per_update=config.num_envs * config.rollout_length, counters=("learner/updates",),
                     health_metrics=("train/loss", "train/value_loss"), learner_steps="learner/updates",
                     headline_metrics=(("train/episode_return", "train return"), ("train/entropy", "entropy")),
                     actor_learner=parts)
