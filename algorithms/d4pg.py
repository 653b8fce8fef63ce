"""D4PG (Barth-Maron et al., 2018) and Ape-X DPG (Horgan et al., 2018): deterministic policy gradients for Box
actions, with Ape-X's distributed design: a population of actors on a ladder of Gaussian exploration noise writing
n-step transitions with their own initial priorities into prioritised replay; the learner trains a critic (D4PG: a
categorical distribution on `num_atoms` atoms from v_min to v_max; `distributional=false`, Ape-X DPG: one value)
and a policy that climbs the critic's mean, with target networks for both.

    actor    a = scale(clip(tanh(pi(s)) + noise, -1, 1)), noise sigma_i * N(0, 1) (Gaussian) or an Ornstein-
             Uhlenbeck process driven by it (`noise=ou`: correlated in time, zeroed where an episode starts), in units
             of the half range, so one sigma means the same on every dimension; actor i's sigma on a geometric ladder
    learner  critic: cross-entropy to the projected n-step target distribution (or squared TD error), importance-
             weighted; policy: -Q(s, pi(s)); priorities |E[target] - E[Z(s, a)]|; Polyak or periodic targets
"""
import dataclasses
from typing import Any, Callable, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from flax.training.train_state import TrainState

from lightspeed.algorithms.common.continuous_actions import (
    NOISES,
    Bounds,
    action_bounds,
    next_noise,
    sigma_ladder,
    with_noise,
)
from lightspeed.algorithms.common.distributional import atoms, mean, n_step_target
from lightspeed.algorithms.common.dqn_family import PRIORITY_EPSILON, Prioritized, annealed_beta
from lightspeed.algorithms.common.networks import select_tree
from lightspeed.algorithms.common.nstep import NStepWindow, empty_window, oldest_transition, push
from lightspeed.algorithms.common.optimizer import (
    apply_gradients,
    check_learning_rate_config,
    clipped_adam,
    decayed_learning_rate,
)
from lightspeed.algorithms.common.prioritized_replay import importance_weights, priority_metrics
from lightspeed.algorithms.common.replays import (
    ReplayItems,
    check_actor_replay_sizes,
    count_filled,
    prioritized_replay,
    replay_learning_start,
)
from lightspeed.algorithms.common.transition import Transition
from lightspeed.framework.core.algorithm import ActorLearner, ActorStep, Algorithm, Memory, Metrics
from lightspeed.framework.core.errors import check, check_choice, check_number, check_positive_int
from lightspeed.framework.core.registry import register_algorithm
from lightspeed.framework.core.spaces import BOX

MAX_WIDTH = 8192


@dataclasses.dataclass
class D4PGConfig:
    """D4PG's keys and their defaults: what `algo=d4pg` runs (conf/algo_env/d4pg_<env>.yaml retunes a few per env).

    Sources: Acme's D4PGConfig (n_step 5, discount 0.99, 51 atoms, sigma 0.3, batches of 256, target copies every
    100 updates, LayerNorm MLPs: a first layer with LayerNorm and tanh, ELU after), the D4PG paper (prioritised
    replay with alpha 0.6 and beta 0.4, as Ape-X), Ape-X (actor-side priorities, a ladder across actors). The sizes
    are a laptop's: 4 actors of 1 env, hidden layers of 256 (Acme: 256x3 policy, 512x512x256 critic), lr 3e-4 for
    both nets (Acme 1e-4; TD3's and SAC's 3e-4 learns Pendulum's short runs faster), one batch per env step.
    """

    name: str = "d4pg"  # the registered name of the algorithm that algo=d4pg chooses
    num_actors: int = 4  # actors per seed, each at its own rung of the noise ladder (sigma_max down to sigma_min)
    envs_per_actor: int = 1  # envs each actor steps together
    rollout_length: int = 4  # steps of every env per iteration
    # actor i's Gaussian noise (in half ranges) is sigma_max * (sigma_min / sigma_max)^(i / (num_actors - 1)): the
    # continuous twin of Ape-X's epsilon ladder (from Acme's single sigma 0.3 down to a nearly greedy actor)
    sigma_max: float = 0.3
    sigma_min: float = 0.05  # the last actor's noise sigma (in half ranges)
    # gaussian: independent at each step (Acme's); ou: x' = x - ou_theta x ou_dt + sigma sqrt(ou_dt) N(0, 1), kept in
    # the actor state and zeroed at episode starts (SB3's OrnsteinUhlenbeckActionNoise, theta 0.15, dt 0.01: rl-zoo's
    # TD3 on MountainCarContinuous), whose stationary deviation is about sigma / sqrt(2 ou_theta)
    noise: str = "gaussian"
    ou_theta: float = 0.15  # noise=ou: the process's pull back towards 0
    ou_dt: float = 0.01  # noise=ou: the process's time step
    actor_sync_period: int = 1  # learner updates between refreshes of the actors' parameters
    n_step: int = 5  # rewards summed in a transition's return before it bootstraps
    discount: float = 0.99  # per-step discount (gamma)
    distributional: bool = True  # false: Ape-X DPG's critic, one value trained on the squared TD error
    num_atoms: int = 51  # distributional critic: atoms of its return distribution, from v_min to v_max
    v_min: float = -150.0  # the support of the critic's return distribution (Acme's control suite values)
    v_max: float = 150.0  # the support's upper end
    buffer_size: int = 100_000  # as batch_size, per seed
    batch_size: int = 256  # transitions per learner update
    learning_starts: int = 1_000  # transitions in replay before the learner starts
    learner_updates_per_iteration: int = 16  # one batch per env step at the defaults (4 envs x 4 steps)
    policy_learning_rate: float = 3e-4  # the policy's Adam step size, at the start of the decay
    critic_learning_rate: float = 3e-4  # the critic's Adam step size, at the start of the decay
    lr_decay_env_steps: int = 0  # env steps of a linear decay to lr_final_fraction of both rates; 0: constant
    lr_final_fraction: float = 0.0  # both learning rates at the decay's end, as a fraction of their start
    max_grad_norm: float = 40.0  # each network's gradient is clipped to this global norm
    priority_alpha: float = 0.6  # prioritised replay's exponent: items are sampled in proportion to priority^alpha
    beta_start: float = 0.4  # importance-sampling exponent at the first update; it rises to 1 over beta_steps
    beta_steps: int = 20_000  # learner updates over which beta rises linearly to 1
    target_update_period: int = 100  # learner updates between hard target copies (with tau 1)
    tau: float = 1.0  # < 1: Polyak averaging at every update instead (TD3's 0.005)
    # the policy's hidden layers: Dense, LayerNorm and tanh first, then Dense and ELU
    policy_hidden_sizes: list[int] = dataclasses.field(default_factory=lambda: [256, 256])
    # the critic's hidden layers (as the policy's), over the observation and the action
    critic_hidden_sizes: list[int] = dataclasses.field(default_factory=lambda: [256, 256])

    def validate(self) -> None:
        for key in ("num_actors", "envs_per_actor", "rollout_length", "actor_sync_period", "n_step", "buffer_size",
                    "batch_size", "learner_updates_per_iteration", "beta_steps", "target_update_period"):
            check_positive_int(f"algo.{key}", getattr(self, key))
        check_positive_int("algo.learning_starts", self.learning_starts, minimum=0)
        check_positive_int("algo.num_atoms", self.num_atoms, minimum=2)
        check_actor_replay_sizes(self)
        check_number("algo.sigma_max", self.sigma_max, 0)
        check_number("algo.sigma_min", self.sigma_min, 0)
        check(self.sigma_min <= self.sigma_max, "algo.sigma_min", self.sigma_min,
              f"a number <= algo.sigma_max (which is {self.sigma_max})", "the ladder runs from sigma_max down to it")
        check_choice("algo.noise", self.noise, NOISES)
        check_number("algo.ou_theta", self.ou_theta, 0, low_inclusive=False)
        check_number("algo.ou_dt", self.ou_dt, 0, low_inclusive=False)
        check(self.ou_theta * self.ou_dt <= 1, "algo.ou_dt", self.ou_dt, "a number with algo.ou_theta * algo.ou_dt "
              f"<= 1 (algo.ou_theta is {self.ou_theta})", "the process would swing from sign to sign, not decay")
        check_number("algo.discount", self.discount, 0, 1)
        check_number("algo.v_min", self.v_min)
        check_number("algo.v_max", self.v_max, self.v_min, low_inclusive=False)
        for key in ("policy_learning_rate", "critic_learning_rate"):
            check_number(f"algo.{key}", getattr(self, key), 0, low_inclusive=False)
        check_learning_rate_config(self.policy_learning_rate, self.lr_decay_env_steps, self.lr_final_fraction)
        check_number("algo.max_grad_norm", self.max_grad_norm, 0, low_inclusive=False)
        check_number("algo.priority_alpha", self.priority_alpha, 0, 1, low_inclusive=False)
        check_number("algo.beta_start", self.beta_start, 0, 1)
        check_number("algo.tau", self.tau, 0, 1, low_inclusive=False)
        for key in ("policy_hidden_sizes", "critic_hidden_sizes"):
            sizes = getattr(self, key)
            check(len(sizes) > 0 and all(isinstance(s, int) and 1 <= s <= MAX_WIDTH for s in sizes), f"algo.{key}",
                  list(sizes), f"a non-empty list of integers from 1 to {MAX_WIDTH}")

    learning_start = replay_learning_start


class LayerNormMLP(nn.Module):
    """Acme's LayerNormMLP: Dense, LayerNorm and tanh first (inputs of any scale), then Dense and ELU."""

    hidden_sizes: Sequence[int]

    @nn.compact
    def __call__(self, inputs: jax.Array) -> jax.Array:
        features = jnp.tanh(nn.LayerNorm()(nn.Dense(self.hidden_sizes[0])(inputs)))
        for size in self.hidden_sizes[1:]:
            features = nn.elu(nn.Dense(size)(features))
        return features


class Policy(nn.Module):
    """s -> tanh(...) in [-1, 1]^A: the action in half ranges around the bounds' middle."""

    action_size: int
    hidden_sizes: Sequence[int]

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        features = LayerNormMLP(self.hidden_sizes)(obs.reshape(*obs.shape[:-1], -1).astype(jnp.float32))
        return jnp.tanh(nn.Dense(self.action_size, kernel_init=nn.initializers.variance_scaling(
            1e-4, "fan_in", "uniform"))(features))  # a near-zero first policy: the middle of the bounds


class Critic(nn.Module):
    """(s, a in half ranges) -> logits over the atoms (distributional) or one value [..., 1]."""

    outputs: int
    hidden_sizes: Sequence[int]

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        inputs = jnp.concatenate([obs.astype(jnp.float32), action], axis=-1)
        return nn.Dense(self.outputs)(LayerNormMLP(self.hidden_sizes)(inputs))


class Critics(NamedTuple):
    """The critic's value and its loss and TD errors, whatever kind it is."""

    outputs: int
    value: Callable[[jax.Array], jax.Array]  # critic outputs [..., outputs] -> expected return [...]
    # (outputs [B, o], target outputs at s' [B, o], n-step returns [B], bootstrap discounts [B]) -> (loss [B], td [B])
    loss: Callable[..., tuple[jax.Array, jax.Array]]


def distributional_critic(support: jax.Array) -> Critics:
    """D4PG's: cross-entropy of the predicted logits to the projected target distribution."""
    def value(logits: jax.Array) -> jax.Array:
        return mean(jax.nn.softmax(logits), support)

    def loss(logits: jax.Array, target_logits: jax.Array, n_step_return: jax.Array, bootstrap_discount: jax.Array):
        target = jax.vmap(n_step_target, in_axes=(0, 0, 0, None))(
            n_step_return, bootstrap_discount, jax.nn.softmax(target_logits), support)
        target = jax.lax.stop_gradient(target)
        cross_entropy = -(target * jax.nn.log_softmax(logits)).sum(axis=-1)
        return cross_entropy, mean(target, support) - value(logits)

    return Critics(len(support), value, loss)


def plain_critic() -> Critics:
    """Ape-X DPG's: one value, squared TD error to the n-step target."""
    def loss(values: jax.Array, target_values: jax.Array, n_step_return: jax.Array, bootstrap_discount: jax.Array):
        td = jax.lax.stop_gradient(n_step_return + bootstrap_discount * target_values[:, 0]) - values[:, 0]
        return 0.5 * td ** 2, td

    return Critics(1, lambda values: values[..., 0], loss)


class ActorNoise(NamedTuple):
    """An env's actor state: its place in the seed (which rung of the noise ladder it is on) and its last noise
    (what an Ornstein-Uhlenbeck process remembers; zeros under Gaussian noise, which remembers nothing)."""

    index: jax.Array
    noise: jax.Array  # [action_size], in half ranges


class DPGParams(NamedTuple):
    """What actors act with (the policy) and score their items with (the critic, for initial priorities)."""

    policy: Any
    critic: Any


@struct.dataclass
class DPGLearner:
    policy_state: TrainState
    critic_state: TrainState
    target: DPGParams
    replay_state: Any
    updates: jax.Array
    filled: jax.Array  # items inserted, counted up to the learning start


def td_of_items(params: DPGParams, target: DPGParams, items: Transition, policy_net: Policy, critic_net: Critic,
                critics: Critics, bounds: Bounds) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(critic loss [B], TD error [B], Q [B]) of items against the target nets' n-step target."""
    outputs = critic_net.apply(params.critic, items.obs, bounds.to_normalised(items.action))
    next_actions = policy_net.apply(target.policy, items.bootstrap_obs)
    target_outputs = critic_net.apply(target.critic, items.bootstrap_obs, next_actions)
    loss, td = critics.loss(outputs, target_outputs, items.n_step_return, items.bootstrap_discount)
    return loss, td, critics.value(outputs)


@register_algorithm("d4pg", config=D4PGConfig, consumes=("vector",), acts=(BOX,))
def make_d4pg(config: D4PGConfig, env: Any, env_params: Any) -> Algorithm:
    space = env.action_space(env_params)
    bounds = action_bounds(space)
    action_size = int(np.prod(space.shape))
    num_envs = config.num_actors * config.envs_per_actor
    sigmas = sigma_ladder(config.num_actors, config.sigma_max, config.sigma_min)
    policy_net = Policy(action_size, tuple(config.policy_hidden_sizes))
    critics = (distributional_critic(atoms(config.v_min, config.v_max, config.num_atoms)) if config.distributional
               else plain_critic())
    critic_net = Critic(critics.outputs, tuple(config.critic_hidden_sizes))
    action_example = jax.ShapeDtypeStruct(tuple(space.shape), jnp.float32)
    replay = prioritized_replay(env, num_envs, config.buffer_size, config.batch_size, config.n_step, config.discount,
                                config.priority_alpha, action_example)
    prioritized = Prioritized(config.beta_start, config.beta_steps)
    optimizer = clipped_adam(config.max_grad_norm)
    block_units, learning_starts = num_envs * config.rollout_length, max(config.learning_starts, config.batch_size)

    def learning_rate(initial: float, env_steps: jax.Array) -> jax.Array:
        return decayed_learning_rate(initial, config.lr_final_fraction, config.lr_decay_env_steps, env_steps)

    # the actor part
    def act(params: DPGParams, state: ActorNoise, obs: jax.Array, start: jax.Array, key: jax.Array
            ) -> tuple[jax.Array, ActorNoise, tuple]:
        sigma = jnp.asarray(sigmas)[state.index // config.envs_per_actor]
        noise = next_noise(config.noise, state.noise, start, jax.random.normal(key, (action_size,)), sigma,
                           config.ou_theta, config.ou_dt)
        action = with_noise(policy_net.apply(params.policy, obs), noise)
        # Gaussian noise is not carried: its actor state stays zeros
        state = ActorNoise(state.index, noise) if config.noise == "ou" else state
        return bounds.to_env(action), state, ()

    def observe(params: DPGParams, window: NStepWindow, step: ActorStep) -> tuple[NStepWindow, ReplayItems]:
        window = push(window, {"obs": step.obs, "action": step.action, "reward": step.reward,
                               "terminated": step.terminated, "truncated": step.truncated,
                               "next_obs": step.final_obs, "acted": step.acted}, config.n_step)
        items = oldest_transition(window, config.discount)
        # initial priorities under the actor's own copy, which stands in for the targets too
        _, td, _ = td_of_items(params, params, items, policy_net, critic_net, critics, bounds)
        return window, ReplayItems(items, (jnp.abs(td) + PRIORITY_EPSILON) * items.valid)

    def actor_metrics(states: ActorNoise, returns: jax.Array) -> Metrics:
        per_actor = returns.reshape(config.num_actors, config.envs_per_actor).mean(axis=1)
        return {f"actors/return_sigma_{float(sigma):.3g}": per_actor[i] for i, sigma in enumerate(sigmas)}

    # the learner part
    def learner_init(key: jax.Array, obs: jax.Array) -> DPGLearner:
        policy_key, critic_key = jax.random.split(key)
        policy = policy_net.init(policy_key, obs[:1])
        critic = critic_net.init(critic_key, obs[:1], jnp.zeros((1, action_size)))
        return DPGLearner(TrainState.create(apply_fn=policy_net.apply, params=policy, tx=optimizer),
                          TrainState.create(apply_fn=critic_net.apply, params=critic, tx=optimizer),
                          DPGParams(policy, critic), replay.init(obs), jnp.int32(0), jnp.int32(0))

    def insert(learner: DPGLearner, items: ReplayItems) -> DPGLearner:
        return learner.replace(replay_state=replay.add(learner.replay_state, items.record, items.priority),
                               filled=count_filled(learner.filled, block_units, learning_starts))

    def critic_loss(critic: Any, policy: Any, target: DPGParams, batch: Transition, weights: jax.Array):
        losses, td, q = td_of_items(DPGParams(policy, critic), target, batch, policy_net, critic_net, critics, bounds)
        return (weights * batch.valid * losses).sum() / jnp.maximum(batch.valid.sum(), 1.0), (td, q)

    def policy_loss(policy: Any, critic: Any, batch: Transition) -> jax.Array:
        value = critics.value(critic_net.apply(critic, batch.obs, policy_net.apply(policy, batch.obs)))
        return -(batch.valid * value).sum() / jnp.maximum(batch.valid.sum(), 1.0)

    def learn(learner: DPGLearner, key: jax.Array, env_steps: jax.Array) -> tuple[DPGLearner, Metrics]:
        """A round of batches; only the sum tree goes through the loop (the items come out as they came in)."""
        policy_rate = learning_rate(config.policy_learning_rate, env_steps)
        critic_rate = learning_rate(config.critic_learning_rate, env_steps)
        with_tree = lambda tree: learner.replay_state.replace(sum_tree_state=tree)

        def one_batch(carry: tuple, draws: jax.Array) -> tuple[tuple, Metrics]:
            policy_state, critic_state, target, tree, updates = carry
            replay_state = with_tree(tree)
            batch, indices, probabilities = replay.sample(replay_state, draws)
            weights = importance_weights(probabilities, annealed_beta(prioritized, updates))
            (loss, (td, q)), critic_grads = jax.value_and_grad(critic_loss, has_aux=True)(
                critic_state.params, policy_state.params, target, batch, weights)
            # the policy climbs the critic as it was before this batch's step (DDPG's order)
            actor_loss, policy_grads = jax.value_and_grad(policy_loss)(policy_state.params, critic_state.params, batch)
            critic_state = apply_gradients(critic_state, critic_grads, critic_rate)
            policy_state = apply_gradients(policy_state, policy_grads, policy_rate)
            tree = replay.set_priorities(replay_state, indices, (jnp.abs(td) + PRIORITY_EPSILON) * batch.valid
                                         ).sum_tree_state
            updates = updates + 1
            online = DPGParams(policy_state.params, critic_state.params)
            if config.tau < 1.0:
                target = optax.incremental_update(online, target, config.tau)
            else:
                target = select_tree(updates % config.target_update_period == 0, online, target)
            stats = {"critic_loss": loss, "policy_loss": actor_loss, "q_mean": q.mean(),
                     "is_weight_min": weights.min()}
            return (policy_state, critic_state, target, tree, updates), stats

        draws = jax.random.uniform(key, (config.learner_updates_per_iteration, config.batch_size))
        carry = (learner.policy_state, learner.critic_state, learner.target, learner.replay_state.sum_tree_state,
                 learner.updates)
        (policy_state, critic_state, target, tree, updates), stats = jax.lax.scan(one_batch, carry, draws)
        metrics = {"train/critic_loss": stats["critic_loss"].mean(), "train/policy_loss": stats["policy_loss"].mean(),
                   "train/q_mean": stats["q_mean"].mean(), "train/beta": annealed_beta(prioritized, updates),
                   "train/critic_learning_rate": critic_rate, "replay/is_weight_min": stats["is_weight_min"].min()}
        return DPGLearner(policy_state, critic_state, target, with_tree(tree), updates, learner.filled), metrics

    def deterministic_act(params: DPGParams, state: Any, obs: jax.Array, start: jax.Array, key: jax.Array
                          ) -> tuple[jax.Array, Any]:
        """Evaluation's act: the policy's action, no noise."""
        return bounds.to_env(policy_net.apply(params.policy, obs)), state

    parts = ActorLearner(
        num_envs=num_envs, block_steps=config.rollout_length, block_units=block_units,
        actor_init=lambda index, env_steps: ActorNoise(index, jnp.zeros(action_size, jnp.float32)), act=act,
        record_init=lambda obs: empty_window(obs, config.n_step, host=True, action=action_example),
        observe=observe, learner_init=learner_init, insert=insert,
        ready=lambda learner: learner.filled >= learning_starts, learn=learn,
        updates_per_learn=config.learner_updates_per_iteration,
        learn_units=config.learner_updates_per_iteration * config.batch_size,
        actor_params=lambda learner: DPGParams(learner.policy_state.params, learner.critic_state.params),
        learner_steps=lambda learner: learner.updates, sync_period=config.actor_sync_period,
        actor_metrics=actor_metrics,
        learner_metrics=lambda learner: priority_metrics(replay.stored_priorities(learner.replay_state)))
    return Algorithm(init=None, update=None, policy=None, act=deterministic_act,
                     env_steps_per_update=num_envs * config.rollout_length, counters=("learner/updates",),
                     health_metrics=("train/critic_loss", "train/q_mean"), learner_steps="learner/updates",
                     headline_metrics=(("train/episode_return", "train return"),
                                       ("train/critic_loss", "critic loss")),
                     actor_learner=parts, memory=Memory("replay", "algo.buffer_size", config.buffer_size))
