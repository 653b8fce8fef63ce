"""The actor side of a host run (framework/sebulba/trainer.py): the jitted programs both sides call, the chain of
round keys the single program draws, and one actor thread's loop over its share of every seed's envs.

An actor thread steps its host vector env and makes one jitted call per vector step: record the step into the
n-step windows and act on the next observations, every seed's parameters vmapped. Thread k owns columns k,
k + K, ... of every seed's envs, so Ape-X's actor i of seed s keeps its envs and epsilon whatever the thread
count, and draws the single program's action uniforms for those columns.
"""
import dataclasses
import sys
import time
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from framework.core.algorithm import ActorLearner, Algorithm
from framework.core.devices import DEVICE_AXIS
from framework.core.host_env import HostEnvError, derived_seed
from framework.core.keys import rollout_draws, run_keys


def with_device_axis(fn: Callable) -> Callable:
    """`fn` as one learner on a device axis of size one (Ape-X's learner averages over that axis). The inputs stay
    unmapped: giving every leaf a leading axis of one made XLA copy the whole replay at each call (4x slower)."""
    on_axis = jax.vmap(fn, in_axes=None, axis_size=1, axis_name=DEVICE_AXIS)
    return lambda *args: jax.tree.map(lambda x: x[0], on_axis(*args))


class HostPrograms(NamedTuple):
    """The jitted functions of a host run, each over all seeds (vmapped)."""

    learner_init: Callable  # (keys [S], obs [S, N, ...]) -> learner state
    actor_init: Callable  # obs [S, n, ...] -> windows
    next_round: Callable  # round keys [S] -> (the next round's, its actors' rollout keys, its learner's keys)
    round_uniforms: Callable  # (rollout keys [S], columns [n]) -> a round's action uniforms [S, T, n]
    first_actions: Callable  # (params, obs [S, n, ...], columns [n], env steps, uniforms [S, T, n], t) -> [S, n]
    record_and_act: Callable  # (params, windows, step, columns, env steps, uniforms, t) -> (windows, items, prios,
    #                            actions): record a vector step, act on its next observations with uniforms[:, t]
    insert: Callable  # (learner, every thread's items [S, T, n, ...], their priorities) -> learner (donated)
    learn: Callable  # (learner, keys [S], round, env steps [S]) -> (learner, metrics) (donated)
    snapshot: Callable  # learner -> a copy of the actors' parameters (the learner's next call donates its own)
    stack: Callable  # per-step trees [S, n, ...] -> one block [S, T, n, ...]
    greedy: Callable  # (params [S, ...], obs [S, E, ...]) -> actions [S, E]


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
    def act(params, obs, columns, env_steps, uniforms, t):
        """Every seed's envs in `columns` act with their epsilon at `env_steps` (a seed's, all threads') and the
        round's uniforms of step t (clipped: a block's last step acts for nothing, the next block acts anew)."""
        epsilons = jnp.broadcast_to(parts.epsilons(env_steps), (parts.num_envs,))[columns]
        step_uniforms = jax.lax.dynamic_index_in_dim(uniforms, jnp.minimum(t, parts.block_steps - 1), 1, False)
        return seeds(parts.act, in_axes=(0, 0, None, 0))(params, obs, epsilons, step_uniforms)

    def record_and_act(params, windows, step, columns, env_steps, uniforms, t):
        windows, items, priorities = seeds(parts.observe)(params, windows, step)
        return windows, items, priorities, act(params, step["next_obs"], columns, env_steps, uniforms, t)

    def insert(learner, thread_items, thread_priorities):
        """One round: every thread's block, its columns joined back into env order, into replay (one call: the
        joins as eager ops held the learner thread's GIL ~4 ms a round)."""
        join = lambda blocks: jax.tree.map(lambda *parts: jnp.concatenate(parts, axis=2)[:, :, unshuffle], *blocks)
        priorities = None if thread_priorities is None else join(thread_priorities)
        return seeds(with_device_axis(parts.insert))(learner, join(thread_items), priorities)

    def round_uniforms(rollout_keys, columns):
        """The single program's draws for a round (its env keys serve JAX envs only), this thread's columns."""
        draws = jax.vmap(lambda key: rollout_draws(key, parts.block_steps, parts.num_envs)[0])(rollout_keys)
        return draws[:, :, columns]

    return HostPrograms(
        learner_init=jax.jit(seeds(parts.learner_init)), actor_init=jax.jit(seeds(parts.actor_init)),
        next_round=jax.jit(next_round_keys), round_uniforms=jax.jit(round_uniforms),
        first_actions=jax.jit(act), record_and_act=jax.jit(record_and_act, donate_argnums=1),
        insert=jax.jit(insert, donate_argnums=0),
        learn=jax.jit(seeds(with_device_axis(parts.learn)), donate_argnums=0),
        snapshot=jax.jit(lambda learner: jax.tree.map(jnp.copy, seeds(parts.actor_params)(learner))),
        stack=jax.jit(lambda steps: jax.tree.map(lambda *step: jnp.stack(step, axis=1), *steps)),
        greedy=greedy_program(algorithm))


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
        self.open_envs(env_seed)
        self.meter = Meter()
        self.finished = [[] for _ in range(num_seeds)]  # returns of the episodes that ended, per seed
        self.staleness: list[int] = []

    def open_envs(self, env_seed: int) -> None:
        """This thread's envs, reset from `env_seed`, and empty n-step windows."""
        self.envs = self.env.vector_env(self.num_seeds * self.width, self.timeout_s)
        self.obs = self.shaped(self.envs.reset(seed=env_seed))
        self.windows = self.programs.actor_init(self.obs)
        # what a frame replay needs to know of the stream: which observations begin an episode (their stack
        # starts empty) and that this one begins a stream of its own (nothing before it continues into it)
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
              ) -> tuple[Any, Any]:
        """`block_steps` vector steps from a seed's `env_steps`: items and priorities [S, T, n, ...].
        `parameters()` gives the (params, version) to act with, asked again after every step."""
        params, version = parameters()
        self.round_keys, rollout_keys, _ = self.programs.next_round(self.round_keys)
        uniforms = self.programs.round_uniforms(rollout_keys, self.columns)
        next_actions = self.programs.first_actions(params, self.obs, self.columns, np.int32(env_steps), uniforms,
                                                   np.int32(0))
        items, priorities = [], []
        for t in range(self.parts.block_steps):
            start = time.perf_counter()
            actions, step = np.asarray(next_actions), None
            for attempt in range(MAX_RESTARTS_IN_A_ROW + 1):
                try:
                    step = self.envs.step(actions.reshape(-1))
                    break
                except HostEnvError as error:
                    if self.env.config.on_error != "restart" or attempt == MAX_RESTARTS_IN_A_ROW:
                        raise
                    self.restart_envs(error)  # and the step again, from the new envs' first observations
                    actions = np.asarray(self.programs.first_actions(params, self.obs, self.columns,
                                                                     np.int32(env_steps), uniforms, np.int32(t)))
            transition = {"obs": self.obs, "action": actions, "reward": self.shaped(step.reward),
                          "terminated": self.shaped(step.terminated), "truncated": self.shaped(step.truncated),
                          "final_obs": self.shaped(step.final_obs), "acted": self.shaped(step.acted),
                          "start": self.started, "fresh": np.full(self.started.shape, self.fresh),
                          "next_obs": self.shaped(step.obs)}
            self.started, self.fresh = self.shaped(step.started), False
            for seed, column in zip(*np.nonzero(self.shaped(step.ended)), strict=True):
                self.finished[seed].append(float(self.shaped(step.episode_return)[seed, column]))
            self.windows, item, priority, next_actions = self.programs.record_and_act(
                params, self.windows, transition, self.columns, np.int32(env_steps + (t + 1) * self.parts.num_envs),
                uniforms, np.int32(t + 1))
            self.obs = transition["next_obs"]
            items.append(item)
            priorities.append(priority)
            self.staleness.append(learner_version() - version)
            self.meter.busy += time.perf_counter() - start
            self.meter.count += 1
            params, version = parameters()
        return self.programs.stack(items), None if priorities[0] is None else self.programs.stack(priorities)

    def prefetch(self, parameters: Callable[[], tuple[Any, int]]) -> None:
        """Nothing: a thread acts its block when asked (a Ray slot asks its process ahead)."""

    def recent_returns(self) -> list[Optional[float]]:
        """Each seed's mean return over its last 10 finished episodes (None before the first)."""
        return [float(np.mean(returns[-10:])) if returns else None for returns in self.finished]

    def close(self) -> None:
        self.envs.close()


def greedy_program(algorithm: Algorithm) -> Callable:
    """(params [S, ...], obs [S, E, ...]) -> greedy actions [S, E], jitted."""
    return jax.jit(jax.vmap(lambda params, obs: algorithm.act(params, obs, jax.random.key(0))))
