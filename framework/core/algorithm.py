"""The algorithm contract: pure functions of one seed's state, closed over config and env.

`check_fields` checks an algorithm when it is built, `check_outputs` what its functions return once the
trainer has traced them, both before anything compiles: a broken contract is a one-paragraph PluginError
naming the algorithm and the field, not a KeyError in the first chunk.
"""
import numbers
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from framework.core.errors import PluginError

Metrics = dict[str, jax.Array]


class Memory(NamedTuple):
    """The part of a seed's state that a config key sizes (its replay): what a run too big for memory is told to
    lower, and what a host run describes as it starts."""

    path: str  # a name on the state's path to it (as jax.tree_util.keystr writes it), e.g. "replay"
    key: str  # the config key that sizes it, e.g. "algo.buffer_size"
    capacity: int  # items one seed's memory holds
    item: str = "transition"  # what one item is, e.g. "transition" or "sequence"


class ActorLearner(NamedTuple):
    """An algorithm in two parts, for actors that step host envs (framework/sebulba/trainer.py). Every function is
    one seed's (the driver vmaps them); the single-program `update` runs the same parts with a JAX env between.

    A step, as `observe` takes it: {"obs", "action", "reward", "terminated", "truncated", "final_obs", "acted",
    "start", "fresh"}, each [num_envs, ...]; `final_obs` is the true next observation, `acted` False on an
    engine's reset step, `start` where `obs` begins an episode, `fresh` where it begins the actor's stream (its
    envs were just built: nothing stored before continues into it).
    """

    num_envs: int  # the envs of one seed
    block_steps: int  # vector steps of every env in one block of experience (the single program's rollout)
    learning_starts: int  # items of a seed in replay before its first learner round
    # actor
    actor_init: Callable[[jax.Array], Any]  # obs [num_envs, ...] -> actor state (its n-step windows)
    epsilons: Callable[[jax.Array], jax.Array]  # the seed's env steps -> its exploration rate, or one per env
    act: Callable[..., jax.Array]  # (params, obs [N, ...], epsilons, uniforms [N]) -> actions [N]
    observe: Callable[..., tuple[Any, dict, Any]]  # (params, actor state, step) -> (actor state, items, priorities)
    # learner
    learner_init: Callable[[jax.Array, jax.Array], Any]  # (key, obs [num_envs, ...]) -> learner state
    insert: Callable[..., Any]  # (learner state, items [T, N, ...], priorities [T, N] or None) -> learner state
    learn: Callable[..., tuple[Any, Metrics]]  # (learner state, key, env steps) -> (learner state, metrics): a round
    updates_per_learn: int  # learner updates (batches) of one `learn` round
    samples_per_learn: int  # items one `learn` round samples (batches x batch size): the rate limiter's unit
    actor_params: Callable[[Any], Any]  # learner state -> the parameters actors act with and evaluation plays
    learner_steps: Callable[[Any], jax.Array]  # learner state -> its updates so far (the actors' sync clock)
    sync_period: int  # learner updates between two refreshes of the actors' parameters


class Algorithm(NamedTuple):
    # key -> the training state of one seed; the trainer vmaps it over seeds.
    init: Callable[[jax.Array], Any]
    # One training iteration (act, step the envs, learn); jittable, no host work.
    update: Callable[[Any], tuple[Any, Metrics]]
    # The part of a seed's state its greedy policy reads (network parameters, a Q-table): what
    # evaluation plays, what the best policy keeps and what a saved policy holds.
    policy: Callable[[Any], Any]
    # Greedy actions for a batch of evaluation episodes: (policy, obs[E, ...], key) -> actions[E].
    act: Callable[[Any, jax.Array, jax.Array], jax.Array]
    # Env transitions one `update` makes in one seed (all of its envs together).
    env_steps_per_update: int
    # True: the policy holds a population along the leading axis of every leaf (tabular Q's agents);
    # `act` spreads a batch over its members (row e: member e mod size), so one member alone acts too.
    population_policy: bool = False
    # Optional host-side outputs from the final states of all seeds, e.g. tables and plots.
    save_artifacts: Optional[Callable[[Any, Path], None]] = None
    # True: one learner per device averaging gradients with framework.core.devices.mean_over_devices;
    # init and update then run inside the device axis (framework.core.devices.device_index works).
    parallel_learners: bool = False
    # Cumulative metrics (e.g. "learner/updates") the trainer also logs as "<name>_per_second".
    counters: tuple[str, ...] = ()
    # Metrics that must stay finite (loss, Q-values) once the metric `learner_steps` is > 0:
    # before learning starts they may be NaN ("not yet"). Checked per seed with `nan_policy`.
    health_metrics: tuple[str, ...] = ()
    learner_steps: Optional[str] = None
    # Optional metrics of a seed's state alone (state -> metrics), computed once per chunk from its
    # final state instead of after every update: for statistics over big arrays, e.g. the replay.
    state_metrics: Optional[Callable[[Any], Metrics]] = None
    # The metrics a log line shows after the evaluation, as (metric, label) pairs, e.g.
    # (("train/episode_return", "train return"), ("train/loss", "loss")); all go to metrics.jsonl anyway.
    headline_metrics: tuple[tuple[str, str], ...] = ()
    # The same algorithm in an actor part and a learner part, for host envs; None: JAX envs only.
    actor_learner: Optional[ActorLearner] = None
    # The part of the state a config key sizes (a replay buffer), named when a run does not fit; None: none.
    memory: Optional[Memory] = None


def _names(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and all(isinstance(name, str) for name in value)


def check_fields(name: str, algorithm: Any) -> None:
    """The fields of what an algorithm's factory returned (PluginError otherwise)."""
    def require(condition: bool, problem: str, allowed: str) -> None:
        if not condition:
            raise PluginError("algorithm", name, problem, allowed)

    require(isinstance(algorithm, Algorithm), f"its factory returned a {type(algorithm).__name__}",
            "a framework.core.algorithm.Algorithm")
    for field in ("init", "update", "policy", "act"):
        value = getattr(algorithm, field)
        require(callable(value), f"{field}={value!r}", "a function (see the field's comment)")
    for field in ("save_artifacts", "state_metrics"):
        value = getattr(algorithm, field)
        require(value is None or callable(value), f"{field}={value!r}", "None or a function")
    memory = algorithm.memory
    require(memory is None or (isinstance(memory, Memory) and all(isinstance(v, str) for v in (memory.path, memory.key))
                               and isinstance(memory.capacity, numbers.Integral) and memory.capacity >= 1),
            f"memory={memory!r}", "None or a framework.core.algorithm.Memory(path, key, capacity >= 1)")
    steps = algorithm.env_steps_per_update
    require(isinstance(steps, numbers.Integral) and not isinstance(steps, bool) and steps >= 1,
            f"env_steps_per_update={steps!r}", "a positive integer: the env transitions one update makes in one seed")
    for field in ("population_policy", "parallel_learners"):
        value = getattr(algorithm, field)
        require(isinstance(value, (bool, np.bool_)), f"{field}={value!r}", "True or False")
    for field in ("counters", "health_metrics"):
        value = getattr(algorithm, field)
        require(_names(value), f"{field}={value!r}", "a tuple of metric names, e.g. (\"train/loss\",)")
    headline = algorithm.headline_metrics
    require(isinstance(headline, (tuple, list)) and all(_names(pair) and len(pair) == 2 for pair in headline),
            f"headline_metrics={headline!r}",
            "a tuple of (metric, label) pairs, e.g. ((\"train/loss\", \"loss\"),)")
    steps_metric = algorithm.learner_steps
    require(steps_metric is None or isinstance(steps_metric, str), f"learner_steps={steps_metric!r}",
            "None or a metric name")
    require(not algorithm.health_metrics or steps_metric is not None,
            f"health_metrics={tuple(algorithm.health_metrics)!r} with learner_steps=None",
            "learner_steps naming the metric that counts learner steps (health metrics may be NaN until it is "
            "above 0, and are checked from then on), or no health_metrics")


def check_outputs(name: str, algorithm: Algorithm, metrics: Any, seed_dims: tuple[int, ...], policy: Any,
                  observation: jax.ShapeDtypeStruct, num_episodes: int) -> None:
    """What the traced functions return (shapes only, before compiling): `metrics`, a chunk's metrics over
    every seed (leading dims `seed_dims`), and `act` on a batch of `num_episodes` observations for one
    seed's abstract `policy`."""
    def require(condition: bool, problem: str, allowed: str) -> None:
        if not condition:
            raise PluginError("algorithm", name, problem, allowed)

    require(isinstance(metrics, dict) and all(isinstance(key, str) for key in metrics),
            f"update returned metrics of type {type(metrics).__name__}", "a flat dict of metric name -> scalar")
    for key, value in metrics.items():
        require(tuple(value.shape) == seed_dims, f"the metric {key!r} has shape {tuple(value.shape[len(seed_dims):])} "
                "per seed", "a scalar per seed (a mean, a count): update and state_metrics return one seed's metrics")
    named = {"counters": tuple(algorithm.counters), "health_metrics": tuple(algorithm.health_metrics),
             "learner_steps": (algorithm.learner_steps,) if algorithm.learner_steps else (),
             "headline_metrics": tuple(metric for metric, _ in algorithm.headline_metrics)}
    for field, wanted in named.items():
        missing = [metric for metric in wanted if metric not in metrics]
        require(not missing, f"{field} names {', '.join(map(repr, missing))}, which update and state_metrics "
                "do not return", f"names of the metrics they return: {', '.join(sorted(metrics))}")
    batch = jax.ShapeDtypeStruct((num_episodes, *observation.shape), observation.dtype)
    actions = jax.eval_shape(lambda policy, obs: algorithm.act(policy, obs, jax.random.key(0)), policy, batch)
    require(isinstance(actions, jax.ShapeDtypeStruct) and actions.shape == (num_episodes,)
            and jnp.issubdtype(actions.dtype, jnp.integer),
            f"act(policy, obs [{num_episodes}, ...], key) returned {actions!r}",
            f"[{num_episodes}] integer actions, one per observation of the batch")
