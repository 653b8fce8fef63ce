"""The algorithm contract: pure functions of one seed's state, closed over config and env.

`check_fields` checks an algorithm when it is built, `check_outputs` what its functions return once the
trainer has traced them, both before anything compiles: a broken contract is a one-paragraph PluginError
naming the algorithm and the field, not a KeyError in the first chunk.
"""
import inspect
import numbers
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from lightspeed.framework.core.devices import with_device_axis
from lightspeed.framework.core.errors import PluginError

Metrics = dict[str, jax.Array]


class Memory(NamedTuple):
    """The part of a seed's state that a config key sizes (its replay): what a run too big for memory is told to
    lower, and what a host run describes as it starts."""

    path: str  # a name on the state's path to it (as jax.tree_util.keystr writes it), e.g. "replay"
    key: str  # the config key that sizes it, e.g. "algo.buffer_size"
    capacity: int  # items one seed's memory holds
    item: str = "transition"  # what one item is, e.g. "transition" or "sequence"


class ActorStep(NamedTuple):
    """One vector step of the envs an actor steps, as `observe` takes it: every field [num_envs, ...]."""

    obs: jax.Array  # the observations acted on
    action: jax.Array  # the actions the envs took (a Box action clipped to the space's bounds)
    raw_action: jax.Array  # the actions `act` returned, before clipping: a Gaussian sample's log-prob is of these
    extras: Any  # what `act` handed over with its actions (a log-prob, a value, Q-values); () when nothing
    reward: jax.Array
    terminated: jax.Array  # the episode ended: no bootstrap
    truncated: jax.Array  # the episode was cut (a time limit): bootstrap from final_obs
    final_obs: jax.Array  # the true next observation, before any reset
    acted: jax.Array  # False where a host engine spent the step on a reset (gymnasium's NEXT_STEP autoreset)
    start: jax.Array  # where obs begins an episode
    fresh: jax.Array  # where obs begins the actor's stream (its envs were just built: nothing before continues)
    actor_state: Any  # the actor state `act` was given at this step (before its reset where `start`)


class ActorLearner(NamedTuple):
    """An algorithm in an actor part and a learner part. The actor threads of framework/sebulba step host envs
    between them; for a JAX env the framework builds the single program's `init` and `update` from the same
    parts (framework/anakin/compose.py), so an algorithm written as parts runs in both shapes.

    `actor_init` and `act` are one env's (the framework vmaps them over envs and seeds): exploration is the
    algorithm's business (an epsilon ladder, Gaussian noise, none) and a recurrent state lives in the actor
    state, which `act` zeroes or keeps as `start` says. Every other function is one seed's (vmapped over seeds).
    """

    num_envs: int  # the envs of one seed
    block_steps: int  # vector steps of every env in one block of experience (the single program's rollout)
    # what one block of a seed hands the learner, counted in the rate limiter's unit (replay transitions, sequences)
    block_units: int
    # actor
    actor_init: Callable[[jax.Array, jax.Array], Any]  # (env index in its seed [], seed's env steps []) -> state
    # (params, actor state, obs, start, key) -> (action, actor state, extras): extras reach `observe` in the step
    act: Callable[..., tuple[jax.Array, Any, Any]]
    record_init: Callable[[jax.Array], Any]  # obs [num_envs, ...] -> recorder state (e.g. n-step windows)
    observe: Callable[..., tuple[Any, Any]]  # (params, recorder state, ActorStep) -> (recorder state, items)
    # learner
    learner_init: Callable[[jax.Array, jax.Array], Any]  # (key, obs [num_envs, ...]) -> learner state
    # (learner state, items [T, N, ...]) -> learner state; the items carry all the learner keeps (priorities too)
    insert: Callable[..., Any]
    # learner state -> bool []: whether `learn` may run (e.g. flashbax's can_sample: replay holds enough); until it
    # is, a round leaves the inserted state as it is
    ready: Callable[[Any], jax.Array]
    # (learner state, key, env steps) -> (learner state, metrics): a round. Return the replay's unchanged leaves
    # as they came in: until learning starts the single program keeps the state before the round, and a leaf
    # returned as it came in needs no select (a select would copy the whole buffer at every update)
    learn: Callable[..., tuple[Any, Metrics]]
    updates_per_learn: int  # learner updates (batches) of one `learn` round
    learn_units: int  # what one `learn` round consumes in the rate limiter's unit (batches x batch size)
    actor_params: Callable[[Any], Any]  # learner state -> the parameters actors act with and evaluation plays
    learner_steps: Callable[[Any], jax.Array]  # learner state -> its updates so far (the actors' sync clock)
    sync_period: int  # learner updates between two refreshes of the actors' parameters
    # (actor states [num_envs], last step's returns of finished episodes [num_envs]) -> metrics of a block
    actor_metrics: Optional[Callable[[Any, jax.Array], Metrics]] = None
    # learner state -> metrics over big arrays (the replay), computed once per chunk, not after every update
    learner_metrics: Optional[Callable[[Any], Metrics]] = None
    # True: on-policy, every block learned once, in order, by one round (`learn_units` == `block_units`), acted
    # with parameters at most runtime.max_policy_lag learner updates older than the learner's when it learns it
    on_policy: bool = False


class Algorithm(NamedTuple):
    """What an algorithm's registered factory, `factory(config, env, env_params) -> Algorithm`, returns: pure
    functions of one seed's state, closed over config and env; the trainer owns seeds, devices, env-step counting,
    evaluation, logging and early stopping. `init`, `update`, `policy`, `act` and `env_steps_per_update` are
    required (the first three may be None where `actor_learner` gives the parts); the rest have defaults. Checked
    when it is built and once its functions are traced, before anything compiles (a PluginError otherwise)."""

    # key -> the training state of one seed; the trainer vmaps it over seeds.
    init: Optional[Callable[[jax.Array], Any]]
    # One training iteration (act, step the envs, learn); jittable, no host work. None (with `init` and
    # `policy`): built by the framework from `actor_learner` and the JAX env (framework/anakin/compose.py).
    update: Optional[Callable[[Any], tuple[Any, Metrics]]]
    # The part of a seed's state its greedy policy reads (network parameters, a Q-table): what
    # evaluation plays, what the best policy keeps and what a saved policy holds.
    policy: Optional[Callable[[Any], Any]]
    # One evaluation episode's greedy action: (policy, policy state, obs, start, key) -> (action, policy state);
    # the framework vmaps it over episodes. Discrete actions are integers, Box actions floats of the space's shape.
    act: Callable[..., tuple[jax.Array, Any]]
    # Env transitions one `update` makes in one seed (all of its envs together).
    env_steps_per_update: int
    # Episode e's policy state as an evaluation (or a saved policy's caller) starts it: (e []) -> state, e.g. a
    # zero recurrent state; `act` zeroes or keeps it where `start` says. The default holds nothing.
    act_init: Callable[[jax.Array], Any] = lambda index: ()
    # True: the policy holds a population along the leading axis of every leaf (tabular Q's agents); episode e
    # follows member e mod size (its act_init says which), so one member alone acts too.
    population_policy: bool = False
    # Optional host-side outputs from the final states of all seeds, e.g. tables and plots.
    save_artifacts: Optional[Callable[[Any, Path], None]] = None
    # True: one learner per device averaging gradients with framework.core.devices.mean_over_devices;
    # init and update then run inside the device axis (framework.core.devices.device_index works).
    parallel_learners: bool = False
    # Cumulative metrics (e.g. "learner/updates") the trainer also logs as `"<name>_per_second"`.
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


def takes(fn: Callable, count: int) -> bool:
    """Whether `fn` accepts `count` positional arguments (a signature Python cannot read counts as yes)."""
    try:
        inspect.signature(fn).bind(*range(count))
    except TypeError:
        return False
    except ValueError:
        return True
    return True


def _names(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and all(isinstance(name, str) for name in value)


def check_fields(name: str, algorithm: Any) -> None:
    """The fields of what an algorithm's factory returned (PluginError otherwise)."""
    def require(condition: bool, problem: str, allowed: str) -> None:
        if not condition:
            raise PluginError("algorithm", name, problem, allowed)

    require(isinstance(algorithm, Algorithm), f"its factory returned a {type(algorithm).__name__}",
            "a framework.core.algorithm.Algorithm")
    built = [field for field in ("init", "update", "policy") if getattr(algorithm, field) is None]
    require(not built or (len(built) == 3 and isinstance(algorithm.actor_learner, ActorLearner)),
            f"{', '.join(built)}=None", "functions, or all three None with actor_learner given (the framework then "
            "builds the single program from the parts)")
    for field in ("init", "update", "policy", "act", "act_init"):
        value = getattr(algorithm, field)
        require(value is None and field in built or callable(value), f"{field}={value!r}",
                "a function (see the field's comment)")
    require(takes(algorithm.act, 5), "act takes fewer than 5 arguments (the contract before this release was "
            "act(policy, obs [E, ...], key) -> actions [E])",
            "act(policy, policy_state, obs, start, key) -> (action, policy_state), one episode's")
    parts = algorithm.actor_learner
    require(parts is None or isinstance(parts, ActorLearner), f"actor_learner={parts!r}",
            "None or a framework.core.algorithm.ActorLearner")
    if parts is not None:
        for field in ("actor_init", "act", "record_init", "observe", "learner_init", "insert", "ready", "learn",
                      "actor_params", "learner_steps"):
            require(callable(getattr(parts, field)), f"actor_learner.{field}={getattr(parts, field)!r}", "a function")
        require(takes(parts.act, 5), "actor_learner.act takes fewer than 5 arguments (the contract before this "
                "release was act(params, obs [N, ...], epsilons, uniforms) -> actions [N])",
                "act(params, actor_state, obs, start, key) -> (action, actor_state, extras), one env's")
        for field in ("num_envs", "block_steps", "block_units", "updates_per_learn", "learn_units", "sync_period"):
            value = getattr(parts, field)
            require(isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1,
                    f"actor_learner.{field}={value!r}", "a positive integer (see the field's comment)")
        require(isinstance(parts.on_policy, (bool, np.bool_)), f"actor_learner.on_policy={parts.on_policy!r}",
                "True or False")
        require(not parts.on_policy or parts.learn_units == parts.block_units,
                f"actor_learner.on_policy=True with learn_units={parts.learn_units} and block_units="
                f"{parts.block_units}", "learn_units equal to block_units: one learner round learns each block once")
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
    require(not algorithm.health_metrics or steps_metric is not None or built,  # composed: "learner/updates"
            f"health_metrics={tuple(algorithm.health_metrics)!r} with learner_steps=None",
            "learner_steps naming the metric that counts learner steps (health metrics may be NaN until it is "
            "above 0, and are checked from then on), or no health_metrics")


def check_outputs(name: str, algorithm: Algorithm, metrics: Any, seed_dims: tuple[int, ...], policy: Any,
                  observation: jax.ShapeDtypeStruct, action_space: Any) -> None:
    """What the traced functions return (shapes only, before compiling): `metrics`, a chunk's metrics over
    every seed (leading dims `seed_dims`), and `act` on one `observation` for one seed's abstract `policy`."""
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
    check_actions(name, "act", policy_actions(algorithm, policy, observation), action_space)


def policy_actions(algorithm: Algorithm, policy: Any, observation: jax.ShapeDtypeStruct) -> Any:
    """What evaluation's `act` returns for one episode's observation (traced only)."""
    def one(policy, obs):
        state = algorithm.act_init(jnp.int32(0))
        return algorithm.act(policy, state, obs, jnp.bool_(True), jax.random.key(0))
    return jax.eval_shape(one, policy, observation)


def check_actions(name: str, field: str, returned: Any, action_space: Any) -> None:
    """An `act`'s (action, state) for one episode or env against the env's action space (PluginError)."""
    action = returned[0] if isinstance(returned, tuple) and len(returned) == 2 else None
    wanted = (f"(action, state): an integer action [] for {action_space.describe()}" if action_space.kind == "discrete"
              else f"(action, state): a float action {list(action_space.shape)} for {action_space.describe()}")
    ok = isinstance(action, jax.ShapeDtypeStruct) and (
        (action_space.kind == "discrete" and action.shape == () and jnp.issubdtype(action.dtype, jnp.integer))
        or (action_space.kind == "box" and action.shape == tuple(action_space.shape)
            and jnp.issubdtype(action.dtype, jnp.floating)))
    if not ok:
        raise PluginError("algorithm", name, f"{field}(...) for one observation returned {returned!r}", wanted)


def check_parts(name: str, parts: ActorLearner, observation: jax.ShapeDtypeStruct, action_space: Any) -> None:
    """What an algorithm's actor and learner parts return, traced on one seed (nothing computed), in either shape
    before it compiles: act's (action, actor state, extras), observe's (recorder, items), ready's bool, learn's
    metrics; a PluginError naming the part otherwise. `observation`: one env's."""
    def require(condition: bool, problem: str, allowed: str) -> None:
        if not condition:
            raise PluginError("algorithm", name, problem, allowed)

    require(takes(parts.insert, 2) and not takes(parts.insert, 3),
            "actor_learner.insert takes 3 arguments (the contract before this release was insert(learner, items, "
            "priorities))", "insert(learner, items) -> learner: the items carry their priorities")
    num_envs, abstract = parts.num_envs, lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype)
    obs = abstract((num_envs, *observation.shape), observation.dtype)
    flags = abstract((num_envs,), jnp.bool_)
    key = jax.eval_shape(lambda: jax.random.key(0))
    keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), num_envs))
    # one learner on a device axis of size one: a parallel learner averages over it
    traced = lambda fn, *args: jax.eval_shape(with_device_axis(fn), *args)

    learner = traced(parts.learner_init, key, obs)
    params = traced(parts.actor_params, learner)
    actor_state = traced(jax.vmap(parts.actor_init, in_axes=(0, None)), abstract((num_envs,), jnp.int32),
                         abstract((), jnp.int32))
    acted = traced(jax.vmap(parts.act, in_axes=(None, 0, 0, 0, 0)), params, actor_state, obs, flags, keys)
    require(isinstance(acted, tuple) and len(acted) == 3,
            f"actor_learner.act returned {type(acted).__name__} of {len(acted) if isinstance(acted, tuple) else 1} "
            "(the contract before this release returned (action, actor_state))",
            "(action, actor_state, extras), one env's; extras () when it hands nothing to observe")
    action, _, extras = acted
    one_env = jax.tree.map(lambda x: abstract(x.shape[1:], x.dtype), (action, actor_state))
    check_actions(name, "actor_learner.act", one_env, action_space)
    rewards = abstract((num_envs,), jnp.float32)
    step = ActorStep(obs, action, action, extras, rewards, flags, flags, obs, flags, flags, flags, actor_state)
    recorder = traced(parts.record_init, obs)
    observed = traced(parts.observe, params, recorder, step)
    require(isinstance(observed, tuple) and len(observed) == 2,
            f"actor_learner.observe returned {len(observed) if isinstance(observed, tuple) else 1} values (the "
            "contract before this release returned (state, items, priorities))",
            "(recorder state, items): the items carry their priorities")
    block = jax.tree.map(lambda x: abstract((parts.block_steps, *x.shape), x.dtype), observed[1])
    inserted = traced(parts.insert, learner, block)
    ready = traced(parts.ready, inserted)
    require(isinstance(ready, jax.ShapeDtypeStruct) and ready.shape == () and ready.dtype == jnp.bool_,
            f"actor_learner.ready returned {ready!r}", "a bool [] per seed: whether learn may run")
    learned = traced(parts.learn, inserted, key, abstract((), jnp.int32))
    require(isinstance(learned, tuple) and len(learned) == 2 and isinstance(learned[1], dict)
            and all(isinstance(value, jax.ShapeDtypeStruct) and value.shape == () for value in learned[1].values()),
            f"actor_learner.learn returned {learned!r}", "(learner state, metrics): a flat dict of scalars")
    require(jax.tree.structure(learned[0]) == jax.tree.structure(inserted),
            "actor_learner.learn returned a learner state of another structure than it was given",
            "the state it was given, updated")
