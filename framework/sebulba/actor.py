"""The actor side of a host run (framework/sebulba/trainer.py): the jitted programs both sides call, the chain of
round keys the single program draws, and one actor thread's loop over its share of every seed's envs.

An actor thread steps its host vector env and makes one jitted call per vector step: record the step (`observe`)
and act on the next observations, each env with its actor state, every seed's parameters vmapped. Thread k owns
columns k, k + K, ... of every seed's envs, so Ape-X's actor i of seed s keeps its envs and epsilon whatever the
thread count, and takes the single program's act keys of those columns.
"""
import dataclasses
import sys
import time
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from lightspeed.framework.core.algorithm import ActorLearner, ActorStep, Algorithm
from lightspeed.framework.core.devices import with_device_axis
from lightspeed.framework.core.host_env import HostEnvError, derived_seed
from lightspeed.framework.core.keys import rollout_draws, run_keys
from lightspeed.framework.core.spaces import clip_actions


class HostPrograms(NamedTuple):
    """The jitted functions of a host run, each over all seeds (vmapped)."""

    learner_init: Callable  # (keys [S], obs [S, N, ...]) -> learner state
    actor_init: Callable  # (columns [n], env steps [S]) -> actor states [S, n, ...]
    record_init: Callable  # obs [S, n, ...] -> recorder states (n-step windows)
    next_round: Callable  # round keys [S] -> (the next round's, its actors' rollout keys, its learner's keys)
    round_keys: Callable  # (rollout keys [S], columns [n]) -> a round's act keys [S, T, n]
    first_actions: Callable  # (params, actor states, obs [S, n, ...], start [S, n], act keys, t) -> (actions,
    #                           actor states, extras)
    record_and_act: Callable  # (acted with, params, recorders, ActorStep, next obs, actor states, start, keys, t) ->
    #                            (recorders, items, actions, actor states, extras): record a vector step, act on its
    #                            next observations
    insert: Callable  # (learner, every thread's items [S, T, n, ...]) -> learner (donated)
    ready: Callable  # learner -> [S] bool: whether each seed's learner may learn
    learn: Callable  # (learner, keys [S], round, env steps [S]) -> (learner, metrics) (donated)
    snapshot: Callable  # learner -> a copy of the actors' parameters (the learner's next call donates its own)
    stack: Callable  # per-step trees [S, n, ...] -> one block [S, T, n, ...]


def first_round_keys(seed: int, num_seeds: int) -> tuple[jax.Array, jax.Array]:
    """Every seed's (round-0 key, network key), split as the single program's `init` splits its seed key (the
    third key resets a JAX env there)."""
    keys = jax.vmap(lambda key: jax.random.split(key, 3))(run_keys(np.uint32(seed), 0, num_seeds)[0])
    return keys[:, 0], keys[:, 1]


def next_round_keys(keys: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Round k's keys [S] -> (round k + 1's, round k's actors' rollout keys, its learner's): the single program's
    split of its state's key at every update, so a lockstep run draws what it draws."""
    split = jax.vmap(lambda key: jax.random.split(key, 3))(keys)
    return split[:, 0], split[:, 1], split[:, 2]


def host_programs(algorithm: Algorithm, columns: np.ndarray) -> HostPrograms:
    """The programs of a run whose actor threads own `columns` [threads, n] of every seed's envs."""
    parts = algorithm.actor_learner
    unshuffle = np.argsort(columns.reshape(-1))  # the threads' columns, joined, back to env order
    seeds = jax.vmap
    envs_act = jax.vmap(parts.act, in_axes=(None, 0, 0, 0, 0))  # a seed's envs act with its parameters

    def act(params, actor_states, obs, start, keys, t):
        """Every seed's envs act with the round's keys of step t (clipped: a block's last step acts for nothing,
        the next block acts anew)."""
        step_keys = jax.lax.dynamic_index_in_dim(keys, jnp.minimum(t, parts.block_steps - 1), 1, False)
        return seeds(envs_act)(params, actor_states, obs, start, step_keys)

    def record_and_act(acted_with, params, recorders, step, next_obs, actor_states, start, keys, t):
        """`observe` sees the parameters the step's actions were chosen with (None: `params`, which the next
        actions use: one copy of the parameters to pass, a call's cost on a host actor)."""
        observed_with = params if acted_with is None else acted_with
        recorders, items = seeds(parts.observe)(observed_with, recorders, step)
        actions, actor_states, extras = act(params, actor_states, next_obs, start, keys, t)
        return recorders, items, actions, actor_states, extras

    def insert(learner, thread_items):
        """One round: every thread's block, its columns joined back into env order, into replay (one call: the
        joins as eager ops held the learner thread's GIL ~4 ms a round)."""
        join = lambda blocks: jax.tree.map(lambda *parts: jnp.concatenate(parts, axis=2)[:, :, unshuffle], *blocks)
        return seeds(with_device_axis(parts.insert))(learner, join(thread_items))

    def round_keys(rollout_keys, columns):
        """The single program's act keys for a round (its env keys serve JAX envs only), this thread's columns."""
        keys = jax.vmap(lambda key: rollout_draws(key, parts.block_steps, parts.num_envs)[0])(rollout_keys)
        return keys[:, :, columns]

    env_actor_init = jax.vmap(parts.actor_init, in_axes=(0, None))  # the envs of `columns`, one seed
    return HostPrograms(
        learner_init=jax.jit(seeds(parts.learner_init)),
        actor_init=jax.jit(seeds(env_actor_init, in_axes=(None, 0))),
        record_init=jax.jit(seeds(parts.record_init)),
        next_round=jax.jit(next_round_keys), round_keys=jax.jit(round_keys),
        first_actions=jax.jit(act), record_and_act=jax.jit(record_and_act, donate_argnums=2),
        insert=jax.jit(insert, donate_argnums=0), ready=jax.jit(seeds(parts.ready)),
        learn=jax.jit(seeds(with_device_axis(parts.learn)), donate_argnums=0),
        snapshot=jax.jit(lambda learner: jax.tree.map(jnp.copy, seeds(parts.actor_params)(learner))),
        stack=jax.jit(lambda steps: jax.tree.map(lambda *step: jnp.stack(step, axis=1), *steps)))


def column_order(num_envs: int, threads: int) -> np.ndarray:
    """[threads, num_envs / threads]: thread k owns columns k, k + threads, ... of every seed."""
    return np.arange(num_envs).reshape(-1, threads).T.copy()


@dataclasses.dataclass
class Meter:
    """Busy and waiting seconds of one side, and its count of work items."""

    busy: float = 0.0
    waiting: float = 0.0
    count: int = 0

    def wait_fraction(self) -> float:
        return self.waiting / max(self.busy + self.waiting, 1e-9)


MAX_RESTARTS_IN_A_ROW = 3  # env.on_error=restart: envs that fail again at once are not restarted forever


class Actor:
    """One thread's share of the envs: columns `columns` of every seed, stepped as one host vector env."""

    def __init__(self, index: int, env: Any, programs: HostPrograms, parts: ActorLearner, num_seeds: int,
                 columns: np.ndarray, env_seed: int, round_keys: jax.Array, timeout_s: float):
        self.programs, self.parts, self.columns = programs, parts, columns
        self.num_seeds, self.width = num_seeds, len(columns)
        self.env, self.env_seed, self.timeout_s = env, env_seed, timeout_s
        self.restarts = 0
        self.round_keys = round_keys  # every thread walks the same chain of round keys as the learner
        self.actor_states = None  # what `act` is given at the current observations; set by the first block
        self.open_envs(env_seed)
        self.meter = Meter()
        self.finished = [[] for _ in range(num_seeds)]  # returns of the episodes that ended, per seed
        # each env's last ended episode's return (0 before one ends): the single program's returned_episode_return
        self.last_returns = np.zeros((num_seeds, self.width), np.float32)
        self.staleness: list[int] = []

    def open_envs(self, env_seed: int) -> None:
        """This thread's envs, reset from `env_seed`, and empty recorders (n-step windows). The actor states are
        kept: the new envs' first observations begin episodes (`start`), where `act` resets what it needs to."""
        self.envs = self.env.vector_env(self.num_seeds * self.width, self.timeout_s)
        self.obs = self.shaped(self.envs.reset(seed=env_seed))
        self.recorders = self.programs.record_init(self.obs)
        # which observations begin an episode (a recurrent state or a frame stack starts empty there) and that
        # this one begins a stream of its own (nothing stored before it continues into it)
        self.started, self.fresh = np.ones(self.obs.shape[:2], bool), True

    def restart_envs(self, error: HostEnvError) -> None:
        """env.on_error=restart: new envs (a vector env that raised is unusable), reseeded apart from every start."""
        self.restarts += 1
        print(f"warning: {error} Restarting this actor thread's envs (restart {self.restarts}; env.on_error=restart)",
              file=sys.stderr, flush=True)
        self.envs.close()
        self.open_envs(derived_seed(self.env_seed, self.restarts))

    def shaped(self, x: np.ndarray) -> np.ndarray:
        return x.reshape(self.num_seeds, self.width, *x.shape[1:])

    def block(self, env_steps: int, parameters: Callable[[], tuple[Any, int]], learner_version: Callable[[], int]
              ) -> Any:
        """`block_steps` vector steps from a seed's `env_steps`: their items [S, T, n, ...].
        `parameters()` gives the (params, version) to act with, asked again after every step."""
        if self.actor_states is None:  # the first block: a resumed run's clock goes on from its env steps
            self.actor_states = self.programs.actor_init(self.columns, np.full(self.num_seeds, env_steps, np.int32))
        params, version = parameters()
        self.round_keys, rollout_keys, _ = self.programs.next_round(self.round_keys)
        keys = self.programs.round_keys(rollout_keys, self.columns)
        # the state `act` is given at the current observations (kept with the step), and the one it returned
        next_actions, next_states, next_extras = self.programs.first_actions(
            params, self.actor_states, self.obs, self.started, keys, np.int32(0))
        items = []
        space = self.env.action_space()
        for t in range(self.parts.block_steps):
            start = time.perf_counter()
            acted_with = params
            actions, step = clip_actions(space, np.asarray(next_actions)), None
            for attempt in range(MAX_RESTARTS_IN_A_ROW + 1):
                try:
                    step = self.envs.step(actions.reshape(-1))
                    break
                except HostEnvError as error:
                    if self.env.config.on_error != "restart" or attempt == MAX_RESTARTS_IN_A_ROW:
                        raise
                    self.restart_envs(error)  # and the step again, from the new envs' first observations
                    next_actions, next_states, next_extras = self.programs.first_actions(
                        params, self.actor_states, self.obs, self.started, keys, np.int32(t))
                    actions = clip_actions(space, np.asarray(next_actions))
            transition = ActorStep(obs=self.obs, action=actions, raw_action=next_actions, extras=next_extras,
                                   reward=self.shaped(step.reward),
                                   terminated=self.shaped(step.terminated), truncated=self.shaped(step.truncated),
                                   final_obs=self.shaped(step.final_obs), acted=self.shaped(step.acted),
                                   start=self.started, fresh=np.full(self.started.shape, self.fresh),
                                   actor_state=self.actor_states)
            self.started, self.fresh = self.shaped(step.started), False
            for seed, column in zip(*np.nonzero(self.shaped(step.ended)), strict=True):
                self.finished[seed].append(float(self.shaped(step.episode_return)[seed, column]))
                self.last_returns[seed, column] = self.finished[seed][-1]
            self.obs, self.actor_states = self.shaped(step.obs), next_states
            self.staleness.append(learner_version() - version)
            params, version = parameters()  # the newest for the next actions; the step is observed with its own
            observed_with = None if acted_with is params else acted_with  # None: the same, passed once
            self.recorders, item, next_actions, next_states, next_extras = self.programs.record_and_act(
                observed_with, params, self.recorders, transition, self.obs, self.actor_states, self.started, keys,
                np.int32(t + 1))
            items.append(item)
            self.meter.busy += time.perf_counter() - start
            self.meter.count += 1
        return self.programs.stack(items)

    def prefetch(self, parameters: Callable[[], tuple[Any, int]]) -> None:
        """Nothing: a thread acts its block when asked (a Ray slot asks its process ahead)."""

    def recent_returns(self) -> list[Optional[float]]:
        """Each seed's mean return over its last 10 finished episodes (None before the first)."""
        return [float(np.mean(returns[-10:])) if returns else None for returns in self.finished]

    def metric_inputs(self) -> Optional[tuple[Any, np.ndarray]]:
        """What ActorLearner.actor_metrics reads of this thread's envs, as host values: (actor states [S, width,
        ...], each env's last ended episode's return [S, width]); None before the first block."""
        if self.actor_states is None:
            return None
        return jax.device_get(self.actor_states), self.last_returns.copy()

    def close(self) -> None:
        self.envs.close()
