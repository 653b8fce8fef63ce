"""Actors and learner apart, for envs stepped in Python (env=gymnasium): the Sebulba shape on one machine.

    actor threads   host envs <-> one jitted call per vector step (record the step, act on the next),
                    blocks of n-step items [seed, step, env] into a bounded queue per thread
    learner thread  inserts blocks into a device-resident replay and learns rounds as the rate limiter
                    grants them; publishes a parameter copy every `sync_period` learner updates
    main thread     evaluates parameter snapshots taken at exact env-step boundaries, logs, writes results

Every seed's envs step as one batch with its parameters vmapped, as in the single program; the actor
threads' loop and the programs both sides call are in framework/sebulba/actor.py. The rate limiter
(framework/sebulba/runtime.py) holds learner samples per inserted item to `runtime.samples_per_insert`.
`runtime.mode=lockstep` runs the same parts in one thread: block k is acted with the parameters
published after learner round k-1, then its share of samples is drawn, so a run is reproducible.
Reproducibility in free mode is not promised: the thread schedule decides which parameters an action used.
"""
import dataclasses
import threading
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from lightspeed.framework.core.algorithm import ActorLearner, Algorithm, Memory, check_parts
from lightspeed.framework.core.config import TrainConfig
from lightspeed.framework.core.errors import HostRunError, check
from lightspeed.framework.core.evaluation import HostEpisodesAct
from lightspeed.framework.core.host_env import SEED_SPACE, HostEnvError, derived_seed, host_evaluate
from lightspeed.framework.run.common import StopRequest, open_run_dir
from lightspeed.framework.run.loop import RunLoop
from lightspeed.framework.run.progress import ProgressBar, print_line
from lightspeed.framework.run.protocol import BestPolicies
from lightspeed.framework.run.resources import GIB, check_fits
from lightspeed.framework.sebulba.actor import Actor, Meter, column_order, first_round_keys, host_programs
from lightspeed.framework.sebulba.runtime import (
    NOT_READY,
    BoundedQueue,
    ParameterStore,
    RateLimiter,
    RuntimeStopped,
    StopSignal,
)


def check_host_run(train: TrainConfig, parts: Optional[ActorLearner], algo_name: str) -> None:
    """What this path does not do, refused before anything starts."""
    check(parts is not None, "algo", algo_name,
          "an algorithm with an actor part and a learner part (Algorithm.actor_learner)",
          f"env={train.env.name} steps its envs on the host, which algo={algo_name} cannot learn from")
    check(train.num_devices in (None, 1), "num_devices", train.num_devices, "null or 1",
          "the host-env runtime runs one learner on one device")
    check(train.distributed.num_processes == 1, "distributed.num_processes", train.distributed.num_processes, "1",
          "the host-env runtime runs on one machine")
    key, slots = actor_slots(train)
    check(parts.num_envs % slots == 0, key, slots, f"a divisor of the {parts.num_envs} envs of a seed",
          "every actor owns as many env columns")
    check(not parts.on_policy or train.runtime.samples_per_insert == "auto", "runtime.samples_per_insert",
          train.runtime.samples_per_insert, "auto",
          f"algo={algo_name} is on-policy: each block is learned exactly once, by one learner round")


def samples_per_insert(train: TrainConfig, parts: ActorLearner) -> Optional[float]:
    """Learner samples per inserted item: the single program's ratio by default; None: free running."""
    spi = train.runtime.samples_per_insert
    if spi == "auto":
        return parts.learn_units / parts.block_units
    return None if spi is None else float(spi)


def actor_slots(train: TrainConfig) -> tuple[str, int]:
    """(its key, how many) shares of every seed's env columns act apart: actor threads, or Ray actor processes."""
    if train.actors == "ray":
        return "ray.num_actors", train.ray.num_actors
    return "runtime.num_actor_threads", train.runtime.num_actor_threads


@dataclasses.dataclass(frozen=True)
class HostCounters:
    """Where a host run's learner stands: what a checkpoint keeps beside its state (as JSON) to resume from."""

    rounds_inserted: int  # rounds of every actor's blocks inserted into replay
    rounds_learned: int  # learner rounds done
    learner_updates: int  # learner updates (batches) so far
    learns_since_insert: int  # learner rounds since the last insert: folded into the round's learner key
    inserts: int  # the rate limiter's inserted units
    samples: int  # the rate limiter's sampled units
    sampling_from: int  # the rate limiter's inserts when the learner was first ready (NOT_READY: not yet)


class Report(NamedTuple):
    """What the learner hands the main thread at an env-step boundary."""

    env_steps: int  # per seed
    params: Any  # a copy of every seed's parameters at exactly these env steps
    metrics: dict  # the learner's last round's metrics (host values per seed)
    last: bool  # the run's last round, or the round after a stop was requested
    checkpoint: Optional[tuple[Any, HostCounters]] = None  # (host copy of the learner state, counters) at a quiet point


class HostRun:
    """A host run's actors, learner, limiter and parameter store; `run_free` or `run_lockstep` trains it."""

    def __init__(self, train: TrainConfig, env: Any, algorithm: Algorithm,
                 fits: Optional[Callable[[Any], None]] = None):
        """`fits(abstract learner state)`: a check that it fits in memory (and on disk), run before allocating."""
        self.train, self.env, self.algorithm = train, env, algorithm
        self.parts = parts = algorithm.actor_learner
        self.num_seeds = train.num_seeds
        self.columns = column_order(parts.num_envs, actor_slots(train)[1])
        self.programs = host_programs(algorithm, self.columns)
        self.round_env_steps = parts.block_steps * parts.num_envs  # one seed's env steps of a round, all threads
        self.num_rounds = max(1, -(-train.total_env_steps // self.round_env_steps))
        self.spi = samples_per_insert(train, parts)
        self.timeout = train.runtime.timeout_s
        # the single program's keys: a chain of round keys, each split into the round's actor and learner keys
        self.round_keys, network_keys = first_round_keys(train.seed, self.num_seeds)
        self.learn_keys, self.learns_since_insert = self.round_keys, 0
        # the network's init reads the observations' shape and dtype only
        obs = np.zeros((self.num_seeds, parts.num_envs, *env.observation_shape), env.observation_dtype)
        if fits is not None:
            fits(jax.eval_shape(self.programs.learner_init, network_keys, obs))
        self.learner = self.programs.learner_init(network_keys, obs)
        # the bound must hold a whole round of samples and a whole round of inserts
        error_buffer = max(parts.learn_units, (self.spi or 0.0) * parts.block_units)
        # no sample before the learner says it is ready (`ready`); the ratio counts from the inserts it was ready at
        self.limiter = RateLimiter(self.spi, NOT_READY, error_buffer)
        self.store = ParameterStore()
        self.rounds_inserted = self.rounds_learned = self.learner_updates = 0
        self.learn_metrics: dict = {}
        self.learner_metrics = None if parts.learner_metrics is None else jax.jit(jax.vmap(parts.learner_metrics))
        self.actor_metrics = None if parts.actor_metrics is None else jax.jit(jax.vmap(parts.actor_metrics))
        self.env_order = np.argsort(self.columns.reshape(-1))  # slots' columns one after another -> env order
        self.learner_meter = Meter()
        # on-policy: rounds by which a block's parameters may trail the learner's; each block's measured lag
        self.lag_rounds = train.runtime.max_policy_lag // parts.updates_per_learn
        self.policy_lags: list[int] = []
        self.actors: list[Actor] = []  # or framework.sebulba.ray.actors.RaySlot, with the same contract
        self.fleet = None  # actors=ray: framework.sebulba.ray.actors.RayFleet
        self.first_round = self.first_updates = 0  # where this process started (a resumed run: its checkpoint)
        self.stop_requested = False  # set by the main thread on a signal: the learner ends after its round

    def checkpoint_state(self) -> dict:
        """The device state a checkpoint holds (its shapes are the restore's template)."""
        return {"learner": self.learner, "round_keys": self.round_keys, "learn_keys": self.learn_keys}

    def counters(self) -> HostCounters:
        return HostCounters(rounds_inserted=self.rounds_inserted, rounds_learned=self.rounds_learned,
                            learner_updates=self.learner_updates, learns_since_insert=self.learns_since_insert,
                            inserts=self.limiter.inserts, samples=self.limiter.samples,
                            sampling_from=self.limiter.min_inserts)

    def restore(self, state: dict, counters: HostCounters) -> None:
        """A checkpoint's learner, replay and counters; blocks that were in flight when it was taken are gone."""
        self.learner, self.round_keys, self.learn_keys = state["learner"], state["round_keys"], state["learn_keys"]
        self.rounds_inserted, self.rounds_learned = counters.rounds_inserted, counters.rounds_learned
        self.learner_updates, self.learns_since_insert = counters.learner_updates, counters.learns_since_insert
        self.limiter.inserts, self.limiter.samples = counters.inserts, counters.samples
        self.limiter.min_inserts = counters.sampling_from

    def start_actors(self) -> None:
        """Every thread's envs, reset from the run's seed and the env step it starts at (so a resumed run
        steps new episodes, not a replay of the first ones), and the first published parameters."""
        self.first_round, self.first_updates = self.rounds_inserted, self.learner_updates
        start = self.rounds_inserted * self.round_env_steps
        seeds = [derived_seed(self.train.seed, k, start) for k in range(len(self.columns))]
        try:
            if self.train.actors == "ray":
                self.start_ray_slots(seeds)
            else:
                for k, env_seed in enumerate(seeds):
                    self.actors.append(Actor(k, self.env, self.programs, self.parts, self.num_seeds,
                                             self.columns[k], env_seed, self.round_keys, self.timeout))
        except BaseException:
            self.close()
            raise
        self.store.publish(self.programs.snapshot(self.learner), self.learner_updates)
        self.store.rounds_done(self.rounds_inserted)

    def start_ray_slots(self, seeds: list[int]) -> None:
        """actors=ray: the cluster, a Ray actor process per slot (started at once), each slot opened in its own."""
        from lightspeed.framework.sebulba.ray.actors import RayFleet, RaySlot

        self.fleet = RayFleet(self.train, self.timeout)
        # on-policy: a slot asks for its next block only once the parameters it must act with are out
        in_flight = (1 if self.train.runtime.mode == "lockstep" or self.parts.on_policy
                     else self.train.ray.blocks_in_flight)
        processes = self.fleet.start_processes(len(seeds))
        for k, (process, env_seed) in enumerate(zip(processes, seeds, strict=True)):
            self.actors.append(RaySlot(self.fleet, process, k, env_seed, self.round_keys, self.rounds_inserted,
                                       self.num_rounds, self.round_env_steps, self.parts.block_steps,
                                       self.programs.next_round, in_flight))

    # the learner side

    def insert(self, blocks: list[Any], versions: Optional[list[int]] = None) -> None:
        """One round: every thread's block of items into the learner; sampling opens once it is ready. `versions`:
        the parameter versions each block was acted with (on-policy: its lag is measured when it is learned)."""
        if self.parts.on_policy and versions is not None:
            self.policy_lags.append(self.learner_updates - min(versions))
        self.limiter.insert(self.parts.block_units)  # the algorithm's units
        self.learner = self.programs.insert(self.learner, blocks)
        if self.limiter.min_inserts == NOT_READY and bool(np.all(self.programs.ready(self.learner))):
            self.limiter.start_sampling()
        self.round_keys, _, self.learn_keys = self.programs.next_round(self.round_keys)
        self.learns_since_insert = 0
        self.rounds_inserted += 1

    def learn_round(self) -> None:
        """One granted learner round; a parameter copy published when the updates cross a sync period."""
        env_steps = jnp.full(self.num_seeds, self.rounds_inserted * self.round_env_steps, jnp.int32)
        # the round's learner key (the single program's); more rounds on the same inserts fold in their count
        keys = self.learn_keys if not self.learns_since_insert else jax.vmap(jax.random.fold_in, in_axes=(0, None))(
            self.learn_keys, self.learns_since_insert)
        self.learns_since_insert += 1
        self.learner, self.learn_metrics = self.programs.learn(self.learner, keys, env_steps)
        # wait for the round here, not in an actor that reads its parameters: the waits are counted where they are
        jax.block_until_ready(self.learn_metrics)
        self.rounds_learned += 1
        before, self.learner_updates = self.learner_updates, self.learner_updates + self.parts.updates_per_learn
        if self.learner_updates // self.parts.sync_period > before // self.parts.sync_period:
            self.store.publish(self.programs.snapshot(self.learner), self.learner_updates)

    def round_done(self) -> None:
        """On-policy: actors waiting to act the next block learn that this round is done (with parameters newer than
        the published ones, if any)."""
        if not self.parts.on_policy:
            return
        if self.store.version < self.learner_updates:
            self.store.publish(self.programs.snapshot(self.learner), self.learner_updates)
        self.store.rounds_done(self.rounds_inserted)

    def learn_granted(self, blocks_ready: Callable[[], bool]) -> None:
        """Every round the limiter grants now; free running (no ratio), rounds until `blocks_ready()`."""
        while self.limiter.try_sample(self.parts.learn_units):
            start = time.perf_counter()
            self.learn_round()
            self.learner_meter.busy += time.perf_counter() - start
            self.learner_meter.count += 1
            if self.spi is None and blocks_ready():
                return

    def boundary_report(self, previous: int, reports: BoundedQueue, timeout: float) -> bool:
        """A report (parameters copied now) when the env steps cross a log, eval or checkpoint boundary, end the
        run or follow a stop request; True when it was the last."""
        now = self.rounds_inserted * self.round_env_steps
        last = self.rounds_inserted == self.num_rounds or self.stop_requested
        crossed = lambda every: every > 0 and now // every > previous // every
        checkpoint = crossed(self.train.checkpoint.every) or (last and bool(self.train.checkpoint.every)) or (
            self.stop_requested)
        if crossed(self.train.log_every) or crossed(self.train.eval_every) or last or checkpoint:
            # the actors' episodes as of this boundary (in lockstep, the same in every run)
            metrics = {"train/episode_return": self.recent_return(), "learner/updates": float(self.learner_updates),
                       **{name: np.asarray(value) for name, value in self.learn_metrics.items()}}
            if self.learner_metrics is not None:  # the replay's statistics, at report boundaries only
                metrics.update({name: np.asarray(value) for name, value in self.learner_metrics(self.learner).items()})
            metrics.update(self.actor_side_metrics())
            # a quiet point: no learner call runs, so the state is whole (its host copy outlives the donation)
            saved = (jax.device_get(self.checkpoint_state()), self.counters()) if checkpoint else None
            reports.put(Report(now, self.programs.snapshot(self.learner), metrics, last, saved), timeout=timeout)
        return last

    # the two shapes

    def run_free(self, reports: BoundedQueue, stop: StopSignal) -> None:
        """Actor threads and this learner thread at once; returns once the last round is learned."""
        timeout = self.train.runtime.timeout_s
        queues = [BoundedQueue(self.train.runtime.queue_blocks) for _ in self.actors]
        stop.register(*queues, self.limiter, self.store)
        threads = [threading.Thread(target=stop.guarded(f"actor thread {k}", self.act_freely, actor, out, timeout),
                                    name=f"actor-{k}", daemon=True)
                   for k, (actor, out) in enumerate(zip(self.actors, queues, strict=True))]
        for thread in threads:
            thread.start()
        try:
            last = False
            while not last:
                previous = self.rounds_inserted * self.round_env_steps
                start = time.perf_counter()
                blocks, versions = zip(*[incoming.get(timeout=timeout) for incoming in queues], strict=True)
                self.learner_meter.waiting += time.perf_counter() - start
                with stop.progress.busy():  # the learner's calls (their first compiles too) are the run moving
                    self.insert(list(blocks), list(versions))
                    # free running learns on until every thread's next block is in (after the last one: one round)
                    done = self.rounds_inserted == self.num_rounds
                    self.learn_granted(lambda done=done: done or all(incoming.qsize() for incoming in queues))
                    self.round_done()
                last = self.boundary_report(previous, reports, timeout)
        finally:  # normally every actor has handed over its last block; else the stop ends their waits
            for incoming in queues:
                incoming.stop("the learner stopped")
            if self.fleet is not None:
                self.fleet.stopped.set()
            for thread in threads:
                thread.join(timeout)

    def act_freely(self, actor: Actor, out: BoundedQueue, timeout: float) -> None:
        """Blocks into `out` with the parameter version each began with; on-policy, each acted with one version
        throughout, at most `lag_rounds` learner rounds older than the learner's when it learns the block."""
        for round_index in range(self.first_round, self.num_rounds):
            parameters = self.store.latest
            if self.parts.on_policy:
                start = time.perf_counter()
                fixed = self.store.wait_for_rounds(round_index - self.lag_rounds, timeout)
                actor.meter.waiting += time.perf_counter() - start
                parameters = lambda fixed=fixed: fixed
            version = parameters()[1]
            block = actor.block(round_index * self.round_env_steps, parameters, lambda: self.store.version)
            start = time.perf_counter()
            out.put((block, version), timeout=timeout)
            actor.meter.waiting += time.perf_counter() - start

    def run_lockstep(self, reports: BoundedQueue, stop: StopSignal) -> None:
        """Block k acted with the parameters after learner round k-1, then its share of samples drawn."""
        timeout = self.train.runtime.timeout_s
        last = False
        while not last and not stop.stopped:
            previous = self.rounds_inserted * self.round_env_steps
            fixed = self.store.latest()
            acted_with = lambda fixed=fixed: fixed
            for actor in self.actors:  # Ray actor processes act their blocks at once
                actor.prefetch(acted_with)
            blocks = [actor.block(previous, acted_with, lambda: self.store.version) for actor in self.actors]
            with stop.progress.busy():
                self.insert(blocks, [fixed[1]] * len(blocks))
                self.learn_granted(lambda: True)
                self.round_done()
            last = self.boundary_report(previous, reports, timeout)

    def runtime_metrics(self, seconds: float) -> dict:
        """The actor and learner side of the system: rates, waits, staleness, samples per insert."""
        staleness = [s for actor in self.actors for s in actor.staleness[-1000:]]
        return {
            "runtime/actor_env_steps_per_second": (self.num_seeds * (self.rounds_inserted - self.first_round)
                                                   * self.round_env_steps / seconds),
            "runtime/learner_updates": self.learner_updates,
            "runtime/learner_batches_per_second": (self.learner_updates - self.first_updates) / seconds,
            "runtime/samples_per_insert": self.limiter.measured_samples_per_insert,
            "runtime/staleness": float(np.mean(staleness)) if staleness else 0.0,
            "runtime/actor_wait_fraction": float(np.mean([actor.meter.wait_fraction() for actor in self.actors])),
            "runtime/learner_wait_fraction": self.learner_meter.wait_fraction(),
            "runtime/env_restarts": sum(actor.restarts for actor in self.actors),
            **({} if not self.parts.on_policy else {
                "runtime/policy_lag": float(np.mean(self.policy_lags[-1000:])) if self.policy_lags else 0.0,
                "runtime/policy_lag_max": float(max(self.policy_lags, default=0))}),
            **({} if self.fleet is None else {"runtime/actor_restarts": self.fleet.actor_restarts,
                                               "runtime/blocks_dropped": self.fleet.blocks_dropped,
                                               "runtime/actor_processes": len(self.fleet.live),
                                               "runtime/actor_nodes": len(set(self.fleet.live.values()))}),
        }

    def actor_side_metrics(self) -> dict:
        """The algorithm's actor metrics (e.g. a return per exploration rate) over every slot's envs, per seed;
        nothing before every slot has acted its first block."""
        inputs = [actor.metric_inputs() for actor in self.actors]
        if self.actor_metrics is None or not inputs or any(found is None for found in inputs):
            return {}
        in_env_order = lambda *slots: np.concatenate(slots, axis=1)[:, self.env_order]
        states = jax.tree.map(in_env_order, *[state for state, _ in inputs])
        returns = in_env_order(*[last for _, last in inputs])
        return {name: np.asarray(value) for name, value in self.actor_metrics(states, returns).items()}

    def recent_return(self) -> float:
        per_seed = [r for actor in self.actors for r in actor.recent_returns() if r is not None]
        return float(np.mean(per_seed)) if per_seed else float("nan")

    def close(self) -> None:
        for actor in self.actors:
            actor.close()
        if self.fleet is not None:
            self.fleet.close()


def greedy_returns(env: Any, algorithm: Algorithm, params: Any, num_seeds: int, num_episodes: int,
                   first_seed: int, seeds: Optional[Sequence[int]] = None) -> np.ndarray:
    """Every seed's `num_episodes` greedy returns [S, episodes] in envs of their own; seed s's episode e is
    reset with `first_seed + s * num_episodes + e` (framework.tools.evaluate replays them). `seeds`: only these
    seeds play (params [S, ...] still hold every seed's), their returns [len(seeds), episodes]."""
    seeds = list(range(num_seeds)) if seeds is None else list(seeds)
    if len(seeds) < num_seeds:
        params = jax.tree.map(lambda x: x[np.array(seeds)], params)

    episode_seeds = [first_seed + s * num_episodes + e for s in seeds for e in range(num_episodes)]
    episodes_act = HostEpisodesAct(algorithm, (len(seeds),), num_episodes)
    by_seed = lambda x: np.reshape(x, (len(seeds), num_episodes, *np.shape(x)[1:]))
    episodes = by_seed(np.asarray(episode_seeds, np.int64) % 2**32)

    def act(obs: np.ndarray, start: np.ndarray) -> np.ndarray:
        actions = episodes_act(params, by_seed(obs), by_seed(start), episodes)
        return actions.reshape(len(episode_seeds), *actions.shape[2:])

    returns = host_evaluate(env.evaluation_env, act, episode_seeds, len(episode_seeds), evaluation_epsilon(env))
    return returns.reshape(len(seeds), num_episodes)


def evaluation_epsilon(env: Any) -> float:
    """The env's epsilon of evaluation (Atari's eval_epsilon: a greedy policy can stall a game); 0: greedy."""
    return float(getattr(env, "eval_epsilon", 0.0))


def same_policy_seeds(params: Any, other: Any, num_seeds: int) -> np.ndarray:
    """[S] bool: where a seed's parameters in `params` and `other` are equal, leaf by leaf."""
    leaves = zip(jax.tree.leaves(jax.device_get(params)), jax.tree.leaves(other), strict=True)
    return np.all([[np.array_equal(a[s], b[s]) for s in range(num_seeds)] for a, b in leaves], axis=0)


EPISODES_APART = 100_000  # episode seeds of two evaluations of a run never meet below this many episodes per seed


def evaluation_seed(seed: int, num_seeds: int, evaluation: int) -> int:
    """The first episode seed of a run's evaluation number `evaluation` (the final one: -1): each evaluation of a
    run has a block of its own, every episode seed below 2**32 (blocks wrap around after 2**32 / block)."""
    block = num_seeds * EPISODES_APART
    return (seed * 7919 + evaluation + 1) % max(1, SEED_SPACE // block) * block


def check_and_describe_memory(abstract_learner: Any, run_dir: Path, checkpoints_kept: int, memory: Optional[Memory],
                              num_seeds: int) -> None:
    """The learner state fits in memory and its checkpoints on disk (else a ConfigError); a line on its memory."""
    check_fits(abstract_learner, run_dir, checkpoints_kept, jax.default_backend() == "cpu", memory)
    if memory is None:
        return
    leaves = jax.tree_util.tree_leaves_with_path(abstract_learner)
    held = sum(leaf.size * leaf.dtype.itemsize for path, leaf in leaves if memory.path in jax.tree_util.keystr(path))
    per_item = held / num_seeds / memory.capacity
    print_line(f"{memory.path}: {memory.capacity:,} {memory.item}s per seed, {per_item:,.0f} bytes each, "
               f"{held / GIB:.2f} GiB for {num_seeds} seed{'s' * (num_seeds > 1)}")


def failure_message(error: BaseException, env_id: str, env_steps: int) -> str:
    what = str(error) if isinstance(error, HostEnvError) else f"{type(error).__name__}: {error}"
    return (f"The run stopped at env step {env_steps:,} of {env_id}: {what}. Every actor thread and env worker "
            "was stopped; nothing after the last evaluation was kept.")


def start_learner(run: HostRun, reports: BoundedQueue, stop: StopSignal) -> threading.Thread:
    """The learner (and, in free mode, the actor threads it starts) on a thread of its own."""
    shape = run.run_lockstep if run.train.runtime.mode == "lockstep" else run.run_free
    stop.register(reports)  # the driver's exit or failure ends the learner's wait to report at once
    thread = threading.Thread(target=stop.guarded("the learner", shape, reports, stop), name="learner", daemon=True)
    thread.start()
    return thread


def wait_for_report(reports: BoundedQueue, stop: StopSignal, learner: threading.Thread,
                    signalled: Callable[[], bool]) -> Optional[Report]:
    """The learner's next report, or None at once when `signalled()` (a Ctrl-C or SIGTERM to pass on to it); the
    first failure of any thread re-raised. No deadline here: every wait of the actors and the learner has one."""
    while True:
        stop.raise_if_failed()
        if signalled():
            return None
        try:
            return reports.get(timeout=0.2, patient=False)  # back to check for a signal every 0.2 s
        except RuntimeStopped:
            stop.raise_if_failed()
            raise HostRunError("the learner stopped before its last report") from None
        except TimeoutError:
            if not learner.is_alive() and reports.qsize() == 0:
                stop.raise_if_failed()
                raise HostRunError("the learner thread ended before its last report") from None


def train_host(train: TrainConfig, cfg: Any, env: Any, algorithm: Algorithm, run_dir: Path,
               seconds: Callable[[], float], sweep_group: Optional[str]) -> dict:
    """The host-env counterpart of framework.anakin.trainer.train_single_program's loop: the same logs, checkpoints,
    summary, policies and plots. A checkpoint is taken at a quiet point of the learner (after a round); resuming
    restores the learner, its replay, the counters and the history, drops the blocks that were in flight and reseeds
    the envs from the seed and the env step: the run continues, but not bit-identically to one that never stopped."""
    check_host_run(train, algorithm.actor_learner, train.algo.name)
    check_parts(train.algo.name, algorithm.actor_learner,
                jax.ShapeDtypeStruct(env.observation_shape, env.observation_dtype), env.action_space())
    checkpointer = open_run_dir(train, cfg, run_dir)
    keep = train.checkpoint.keep if train.checkpoint.every else 0
    run = HostRun(train, env, algorithm, lambda abstract: check_and_describe_memory(
        abstract, run_dir, keep, algorithm.memory, train.num_seeds))
    best = BestPolicies(jax.device_get(run.programs.snapshot(run.learner)), seed_axis=0)
    loop = RunLoop(train, cfg, run_dir, env, algorithm, seconds, sweep_group, checkpointer, best)
    state, counters = loop.resume(run.checkpoint_state())
    if counters is not None:
        run.restore(state, HostCounters(**counters))  # the checkpoint's JSON keeps them as a dict
    progress, history = loop.progress, loop.history
    reports, stop_signal = BoundedQueue(4), StopSignal()
    summary, interrupted_by, learner, final_params = None, None, None, None
    trained_before, start = progress.train_seconds, time.time()

    def evaluate(params: Any, episodes: int, evaluation: int, seeds: Optional[np.ndarray] = None) -> np.ndarray:
        with stop_signal.progress.busy():  # whole games can take minutes while the learner waits to report
            return greedy_returns(env, run.algorithm, params, run.num_seeds, episodes,
                                  evaluation_seed(train.seed, run.num_seeds, evaluation), seeds)

    with loop.logging():
        try:
            run.start_actors()  # an env that fails to start is the run's one-paragraph error too
            with StopRequest() as stop, ProgressBar(run.num_rounds * run.round_env_steps, train.progress) as bar:
                latest_eval = loop.latest_eval
                done = run.rounds_inserted >= run.num_rounds  # resumed at or past total_env_steps: results only
                learner = None if done else start_learner(run, reports, stop_signal)
                final_params = run.programs.snapshot(run.learner) if done else None
                while not done:
                    # a signal: the learner ends after its round with a checkpoint, and the run with its results
                    report = wait_for_report(reports, stop_signal, learner,
                                             lambda: stop.requested and not run.stop_requested)
                    if report is None:
                        run.stop_requested = True
                        continue
                    progress.train_seconds = trained_before + time.time() - start
                    rate = run.num_seeds * (report.env_steps - run.first_round * run.round_env_steps) / max(
                        time.time() - start, 1e-9)
                    progress.env_steps = report.env_steps
                    record = loop.record(report.env_steps, report.metrics, rate)
                    record.update(run.runtime_metrics(time.time() - start))
                    every = train.eval_every
                    if report.last or report.env_steps // every > (report.env_steps - run.round_env_steps) // every:
                        returns = evaluate(report.params, train.eval_episodes, progress.evaluations)
                        loop.evaluated(record, returns.mean(axis=-1),
                                       lambda params=report.params: jax.device_get(params))
                        latest_eval = record["eval/return"]
                    loop.log(record)
                    bar.update(report.env_steps, rate, latest_eval)
                    final_params = report.params
                    if report.checkpoint is not None:
                        state, counters = report.checkpoint
                        with stop_signal.progress.busy():  # a replay of gigabytes takes its time to write
                            loop.checkpoint(report.env_steps, state, dataclasses.asdict(counters))
                    if report.last or history.all_solved:
                        if run.stop_requested and run.rounds_inserted < run.num_rounds:
                            interrupted_by = stop.signal.name
                        done = True
            stop_signal.raise_if_failed()
            if final_params is None:
                final_params = run.store.latest()[0]
            final_params = loop.final_policies(jax.device_get(final_params))
            final_returns = evaluate(final_params, train.final_eval_episodes, -1)
            # a seed whose best policy is its final one has its returns already: the same greedy policy on the
            # same seeded episodes (host episodes are the costly part of a run's end)
            best_returns = final_returns.copy()
            played = np.flatnonzero(~same_policy_seeds(final_params, best.policies, run.num_seeds))
            if len(played):
                best_returns[played] = evaluate(best.policies, train.final_eval_episodes, -1, played)
            summary = loop.summarize(final_returns, best_returns, 0.0, 1, interrupted_by)
            summary["runtime"] = {"mode": train.runtime.mode, "samples_per_insert_target": run.spi,
                                  **run.runtime_metrics(max(time.time() - start, 1e-9))}
        except (HostEnvError, RuntimeStopped, TimeoutError) as error:
            cause = stop_signal.error or error
            raise HostRunError(failure_message(cause, env.name, progress.env_steps)) from None
        finally:  # no thread, env or worker outlives the run, whatever stopped it
            stop_signal.stop("the run ended")
            if learner is not None:
                learner.join(train.runtime.timeout_s)
            run.close()
            loop.close()

    loop.write_results(summary, final_params, best.policies)
    loop.closing_lines(summary)
    return summary
