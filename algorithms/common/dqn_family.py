"""The DQN family as actor and learner parts: DQN (algorithms/dqn.py) and Ape-X (algorithms/apex.py) are two
settings of this one module; the framework runs the parts in one program on JAX envs and in actor threads on host
envs (framework/anakin/compose.py, framework/sebulba).

    actor    each env acts epsilon-greedily with the epsilon its `Exploration` gives (a schedule over the seed's
             env steps, or its rung of a ladder), and pushes its steps through an n-step window into items,
             with initial priorities |TD error| under the actor's parameters when replay is prioritised
    learner  uniform or prioritised replay; rounds of double-Q batches (importance-weighted when prioritised,
             which writes |TD error| back), hard target copies or Polyak averaging
"""
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax
from flax import struct
from flax.training.train_state import TrainState

from lightspeed.algorithms.common.exploration import epsilon_greedy
from lightspeed.algorithms.common.networks import QNetwork, select_tree
from lightspeed.algorithms.common.nstep import NStepWindow, empty_window, oldest_transition, push
from lightspeed.algorithms.common.optimizer import apply_gradients, clipped_adam
from lightspeed.algorithms.common.prioritized_replay import importance_weights, priority_metrics
from lightspeed.algorithms.common.replays import Replay, ReplayItems, count_filled
from lightspeed.algorithms.common.targets import td_errors
from lightspeed.algorithms.common.transition import Transition
from lightspeed.framework.core.algorithm import ActorLearner, ActorStep, Metrics
from lightspeed.framework.core.devices import mean_over_devices

PRIORITY_EPSILON = 1e-6  # keeps every stored transition sampleable


class Prioritized(NamedTuple):
    """Prioritised replay's importance-sampling correction: beta rises linearly to 1."""

    beta_start: float
    beta_steps: int  # learner updates over which beta reaches 1


class FamilySettings(NamedTuple):
    """What a DQN-family algorithm is, beyond its network and replay."""

    num_envs: int  # a seed's envs (all of its actors')
    block_steps: int  # steps of every env between two learner rounds
    learning_starts: int  # items in replay before the first round
    n_step: int
    discount: float
    updates_per_learn: int  # batches per round
    batch_size: int
    learning_rate: Callable[[jax.Array], jax.Array]  # the seed's env steps -> step size
    max_grad_norm: float
    double_q: bool
    td_loss: Callable[[jax.Array], jax.Array]  # TD errors -> losses (Huber, squared)
    target_update_period: int  # updates between hard target copies (tau = 1)
    tau: float  # < 1: Polyak averaging at every update instead
    sync_period: int  # learner updates between refreshes of the actors' parameters
    prioritized: Optional[Prioritized]  # None: uniform replay
    average_over_devices: bool  # one learner per device, gradients averaged (Ape-X's parallel learners)


class Exploration(NamedTuple):
    """An env's epsilon: (its index in the seed, the seed's env steps) -> epsilon; and what a block reports."""

    epsilon: Callable[[jax.Array, jax.Array], jax.Array]
    metrics: Callable[[jax.Array, jax.Array], Metrics]  # (epsilons [num_envs], block's last returns) -> metrics


class ActorClock(NamedTuple):
    """An env's actor state: its place in the seed and the seed's env steps when it next acts."""

    index: jax.Array
    env_steps: jax.Array


@struct.dataclass
class QLearner:
    train_state: TrainState
    target_params: Any
    replay_state: Any
    updates: jax.Array  # learner updates so far (batches)
    filled: jax.Array  # items inserted, counted up to the learning start


def weighted_td_loss(params: Any, target_params: Any, batch: Transition, weights: jax.Array, network: QNetwork,
                     double_q: bool, td_loss: Callable) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """Mean weighted TD loss over the valid items (an unfilled window's are not), with the TD errors and Q."""
    errors, chosen = td_errors(params, target_params, batch, network, double_q)
    valid = batch.valid
    return (weights * valid * td_loss(errors)).sum() / jnp.maximum(valid.sum(), 1.0), (errors, chosen)


def actor_priorities(actor_params: Any, items: Transition, network: QNetwork, double_q: bool) -> jax.Array:
    """|TD error| + epsilon under the actor's own parameters; 0 for items of an unfilled window."""
    errors, _ = td_errors(actor_params, actor_params, items, network, double_q)
    return (jnp.abs(errors) + PRIORITY_EPSILON) * items.valid


def annealed_beta(prioritized: Prioritized, updates: jax.Array) -> jax.Array:
    return prioritized.beta_start + (1.0 - prioritized.beta_start) * jnp.minimum(updates / prioritized.beta_steps, 1.0)


def dqn_family_parts(settings: FamilySettings, network: QNetwork, replay: Replay,
                     exploration: Exploration) -> ActorLearner:
    """The actor and learner parts of one DQN-family algorithm."""
    s = settings
    optimizer = clipped_adam(s.max_grad_norm)
    prioritized = s.prioritized
    block_units, learning_starts = s.num_envs * s.block_steps, max(s.learning_starts, s.batch_size)

    # the actor part
    def actor_init(index: jax.Array, env_steps: jax.Array) -> ActorClock:
        return ActorClock(index, env_steps)

    def act(params: Any, clock: ActorClock, obs: jax.Array, start: jax.Array, key: jax.Array
            ) -> tuple[jax.Array, ActorClock, tuple]:
        """Epsilon-greedy from one uniform (ties broken with it too); the clock moves by the seed's vector step."""
        epsilon = exploration.epsilon(clock.index, clock.env_steps)
        action = epsilon_greedy(network.apply(params, obs), epsilon, jax.random.uniform(key))
        return action, clock._replace(env_steps=clock.env_steps + s.num_envs), ()

    def observe(params: Any, window: NStepWindow, step: ActorStep) -> tuple[NStepWindow, ReplayItems]:
        """Push the step into every env's window; the item that starts at each window's oldest step."""
        window = push(window, {"obs": step.obs, "action": step.action, "reward": step.reward,
                               "terminated": step.terminated, "truncated": step.truncated,
                               "next_obs": step.final_obs, "acted": step.acted}, s.n_step)
        items = oldest_transition(window, s.discount)
        priorities = None if prioritized is None else actor_priorities(params, items, network, s.double_q)
        return window, ReplayItems(replay.record(items, step._asdict()), priorities)

    def actor_metrics(clocks: ActorClock, returns: jax.Array) -> Metrics:
        return exploration.metrics(jax.vmap(exploration.epsilon)(clocks.index, clocks.env_steps), returns)

    # the learner part
    def learner_init(key: jax.Array, obs: jax.Array) -> QLearner:
        params = network.init(key, obs)
        return QLearner(TrainState.create(apply_fn=network.apply, params=params, tx=optimizer), params,
                        replay.init(obs), jnp.int32(0), jnp.int32(0))

    def insert(learner: QLearner, items: ReplayItems) -> QLearner:
        return learner.replace(replay_state=replay.add(learner.replay_state, items.record, items.priority),
                               filled=count_filled(learner.filled, block_units, learning_starts))

    def learn(learner: QLearner, key: jax.Array, env_steps: jax.Array) -> tuple[QLearner, Metrics]:
        """A round of `updates_per_learn` batches. Only the sum tree (prioritised) goes through the loop: the
        replay's items come out as they came in (the single program then never copies the buffer)."""
        step_size = s.learning_rate(env_steps)
        with_tree = lambda tree: (learner.replay_state if tree is None
                                  else learner.replay_state.replace(sum_tree_state=tree))

        def one_batch(carry: tuple, draws: jax.Array) -> tuple[tuple, Metrics]:
            train_state, target_params, tree, updates = carry
            replay_state = with_tree(tree)
            batch, indices, probabilities = replay.sample(replay_state, draws)
            weights = (jnp.ones(s.batch_size) if prioritized is None
                       else importance_weights(probabilities, annealed_beta(prioritized, updates)))
            (loss, (errors, chosen)), grads = jax.value_and_grad(weighted_td_loss, has_aux=True)(
                train_state.params, target_params, batch, weights, network, s.double_q, s.td_loss)
            if s.average_over_devices:
                grads = mean_over_devices(grads)
            train_state = apply_gradients(train_state, grads, step_size)
            if prioritized is not None:  # slots without a complete transition keep priority 0: never drawn again
                new_priorities = (jnp.abs(errors) + PRIORITY_EPSILON) * batch.valid
                tree = replay.set_priorities(replay_state, indices, new_priorities).sum_tree_state
            updates = updates + 1
            if s.tau < 1.0:
                target_params = optax.incremental_update(train_state.params, target_params, s.tau)
            else:
                target_params = select_tree(updates % s.target_update_period == 0, train_state.params, target_params)
            stats = {"loss": loss, "q_mean": chosen.mean()}
            if prioritized is not None:  # uniform replay's weights are all 1: nothing to report
                stats.update(is_weight_min=weights.min(), is_weight_mean=weights.mean())
            return (train_state, target_params, tree, updates), stats

        shape = (s.updates_per_learn, s.batch_size)
        # every batch's draws at once: one draw site per round, not one per batch
        draws = (jax.random.bits(key, shape, jnp.uint32) if prioritized is None
                 else jax.random.uniform(key, shape))
        tree = None if prioritized is None else learner.replay_state.sum_tree_state
        carry = (learner.train_state, learner.target_params, tree, learner.updates)
        (train_state, target_params, tree, updates), stats = jax.lax.scan(one_batch, carry, draws)
        metrics = {"train/loss": stats["loss"].mean(), "train/q_mean": stats["q_mean"].mean(),
                   "train/learning_rate": step_size}
        if prioritized is not None:
            metrics.update({"train/beta": annealed_beta(prioritized, updates),
                            "replay/is_weight_min": stats["is_weight_min"].min(),
                            "replay/is_weight_mean": stats["is_weight_mean"].mean()})
        return QLearner(train_state, target_params, with_tree(tree), updates, learner.filled), metrics

    def learner_metrics(learner: QLearner) -> Metrics:
        """Mean and max raw priority |delta| over the stored items (a pass over every leaf: once per chunk)."""
        return priority_metrics(replay.stored_priorities(learner.replay_state))

    return ActorLearner(
        num_envs=s.num_envs, block_steps=s.block_steps, block_units=block_units,
        actor_init=actor_init, act=act, record_init=lambda obs: empty_window(obs, s.n_step, host=True),
        observe=observe, learner_init=learner_init, insert=insert,
        ready=lambda learner: learner.filled >= learning_starts, learn=learn,
        updates_per_learn=s.updates_per_learn, learn_units=s.updates_per_learn * s.batch_size,
        actor_params=lambda learner: learner.train_state.params, learner_steps=lambda learner: learner.updates,
        sync_period=s.sync_period, actor_metrics=actor_metrics,
        learner_metrics=None if replay.stored_priorities is None else learner_metrics)


def greedy_act(network: QNetwork) -> Callable:
    """Evaluation's act: the argmax action, no state."""
    def act(params: Any, state: Any, obs: jax.Array, start: jax.Array, key: jax.Array) -> tuple[jax.Array, Any]:
        return jnp.argmax(network.apply(params, obs), axis=-1).astype(jnp.int32), state
    return act
