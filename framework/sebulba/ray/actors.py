"""actors=ray: the actor slots of a host run (framework/sebulba/trainer.py) step their envs in Ray actor processes
anywhere in the cluster; the learner, the replay and the evaluations stay in the driver.

    ActorProcess  a Ray actor: the run's env and algorithm rebuilt from its config, a jitted CPU policy, and the
                  framework.sebulba.actor.Actor of each slot it holds (one; more once a lost node's slots move to it)
    RaySlot       the driver's stand-in for one slot's Actor (same `block` call, meters and episode returns): it
                  asks its process for the next `ray.blocks_in_flight` blocks ahead and waits for the oldest
    RayFleet      the cluster, the live processes and the parameters: one `ray.put` per published version

Slot k owns the env columns an actor thread k would (framework.sebulba.actor.column_order), so Ape-X's actor i of
seed s keeps its envs and epsilon. A slot whose process dies is reopened, up to `ray.max_restarts` times, in a new
process or, when none starts within `ray.start_timeout_s` (its node is gone), in a live one: its blocks in flight
are dropped and counted, and its envs are reseeded from (seed, slot, env step, restart count). The learner asks
the same rounds of it again, so the run still ends after `total_env_steps`.
"""
import collections
import sys
import threading
import time
from typing import Any, Callable, NamedTuple, Optional

import jax
import numpy as np

from lightspeed.framework.core.errors import HostRunError
from lightspeed.framework.core.host_env import derived_seed
from lightspeed.framework.sebulba.actor import Actor, Meter, column_order, host_programs
from lightspeed.framework.sebulba.ray.cluster import first_line
from lightspeed.framework.sebulba.runtime import RuntimeStopped, RuntimeWaitTimeout

# one XLA and one OpenMP thread per actor process: actors beside the learner leave its cores (and GPU) alone
ACTOR_ENV_VARS = {"JAX_PLATFORMS": "cpu", "OMP_NUM_THREADS": "1",
                  "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}
POLL_SECONDS = 0.5  # a waiting slot looks at the run's stop this often
CLOSE_SECONDS = 10.0  # for the actor processes to close their envs before they are killed


class RayBlock(NamedTuple):
    """One block of a slot as its actor process returns it to the driver: host values only (Ray pickles it)."""

    items: Any  # the block's items [S, T, n, ...] (with their priorities), as an Actor's `block` returns them
    episodes: list[list[float]]  # per seed, the returns of the episodes the block ended
    busy: float  # seconds the slot's Actor was busy with the block
    env_restarts: int  # envs the slot restarted during the block (env.on_error=restart)
    metric_inputs: Any  # the slot's Actor.metric_inputs() after the block


class ActorProcess:
    """The body of a Ray actor process (wrapped by `ray.remote` in RayFleet): the envs of its slots."""

    def __init__(self, train: Any, driver_versions: dict):
        from lightspeed.framework.core import registry
        from lightspeed.framework.core.devices import use_compilation_cache, use_matmul_precision
        from lightspeed.framework.sebulba.ray.cluster import versions

        mine = versions()
        if mine != driver_versions:
            raise RuntimeError(f"this Ray actor process runs {mine}, the driver {driver_versions}: every node of "
                               "the cluster needs the driver's lightspeed, jax and Python")
        use_compilation_cache(train.compilation_cache)  # a restarted actor skips most of its compile
        use_matmul_precision(train.matmul_precision)  # the driver's products, in this process too
        self.train = train
        self.env, _, algorithm = registry.build(train.env, train.algo)
        self.parts = algorithm.actor_learner
        self.columns = column_order(self.parts.num_envs, train.ray.num_actors)
        self.programs = host_programs(algorithm, self.columns)
        self.slots: dict[int, Actor] = {}
        self.params, self.version = None, None

    def where(self) -> str:
        """The id of the Ray node this process runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def open_slot(self, slot: int, env_seed: int, round_key_data: np.ndarray) -> None:
        """Slot `slot`'s envs reset from `env_seed`, its chain of round keys at the round it acts next."""
        if slot in self.slots:
            self.slots.pop(slot).close()
        self.slots[slot] = Actor(slot, self.env, self.programs, self.parts, self.train.num_seeds, self.columns[slot],
                                 env_seed, jax.random.wrap_key_data(round_key_data), self.train.runtime.timeout_s)

    def block(self, slot: int, env_steps: int, params: Any, version: int) -> RayBlock:
        """One block of `slot` acted with `params` (a host copy, put on this process's device once per version):
        its items, the episodes it ended and the seconds it took, all as host values."""
        if version != self.version:
            self.params, self.version = jax.device_put(params), version
        actor = self.slots[slot]
        ended_before = [len(returns) for returns in actor.finished]
        busy_before, env_restarts_before = actor.meter.busy, actor.restarts
        fixed = (self.params, self.version)
        items = actor.block(env_steps, lambda: fixed, lambda: version)
        return RayBlock(items=jax.device_get(items),
                        episodes=[returns[start:] for returns, start in zip(actor.finished, ended_before, strict=True)],
                        busy=actor.meter.busy - busy_before, env_restarts=actor.restarts - env_restarts_before,
                        metric_inputs=actor.metric_inputs())

    def close(self) -> None:
        for actor in self.slots.values():
            actor.close()
        self.slots.clear()


class RayFleet:
    """The driver's side of the cluster: the Ray actor processes of a run and the parameters they act with."""

    def __init__(self, train: Any, timeout_s: float):
        from lightspeed.framework.sebulba.ray.cluster import connect, versions

        self.train, self.config, self.timeout_s = train, train.ray, timeout_s
        self.ray, self.head = connect(self.config, self.config.start_timeout_s)
        self.remote = self.ray.remote(ActorProcess).options(
            num_cpus=self.config.num_cpus_per_actor, resources=dict(self.config.actor_resources), max_restarts=0,
            scheduling_strategy="SPREAD", runtime_env={"env_vars": ACTOR_ENV_VARS})
        self.driver_versions = versions()
        self.lock = threading.Lock()
        self.live: dict[Any, str] = {}  # process handle -> its node id
        self.stopped = threading.Event()
        self.params_ref: tuple[int, Any] = (-2, None)
        self.blocks_dropped = self.actor_restarts = 0

    def start_processes(self, count: int) -> list[Optional[Any]]:
        """`count` new actor processes, started at once, each once it is up (its node id known), or None where
        none started within `ray.start_timeout_s` (no node has the resources it asks for)."""
        handles = [self.remote.remote(self.train, self.driver_versions) for _ in range(count)]
        futures = [handle.where.remote() for handle in handles]
        ready, _ = self.ray.wait(futures, num_returns=count, timeout=self.config.start_timeout_s)
        started = []
        for handle, future in zip(handles, futures, strict=True):
            if future not in ready:
                self.ray.kill(handle)  # still waiting for a node: give it up
                started.append(None)
                continue
            try:
                node = self.ray.get(future)
            except self.ray.exceptions.RayActorError as error:
                for other in handles:
                    self.ray.kill(other)
                raise HostRunError(f"a Ray actor process failed to start: {cause_of(error)}") from None
            with self.lock:
                self.live[handle] = node
            started.append(handle)
        return started

    def room_for_one(self) -> bool:
        """Whether the cluster's free resources hold one more actor process (not once a lost node took them)."""
        free = self.ray.available_resources()
        wanted = {"CPU": self.config.num_cpus_per_actor, **self.config.actor_resources}
        return all(free.get(name, 0.0) >= amount for name, amount in wanted.items())

    def lost(self, handle: Any) -> None:
        with self.lock:
            self.live.pop(handle, None)

    def any_live(self) -> Any:
        """A live process to take a slot whose process could not be replaced: one on a node Ray still counts alive
        (a lost node's other processes are not yet known dead)."""
        alive = self.nodes_alive()
        with self.lock:
            for handle, node in list(self.live.items()):
                if not alive.get(node, False):
                    self.live.pop(handle)
            if len(self.live) < self.config.min_actors:
                raise HostRunError(f"only {len(self.live)} of the {self.config.num_actors} Ray actor processes are "
                                   f"left, fewer than ray.min_actors={self.config.min_actors}")
            return next(iter(self.live))

    def put_params(self, params: Any, version: int) -> Any:
        """The object-store reference of `version`'s parameters: one `ray.put` per version, shared by every slot."""
        with self.lock:
            if self.params_ref[0] != version:
                self.params_ref = (version, self.ray.put(jax.device_get(params)))
            return self.params_ref[1]

    def result(self, future: Any, what: str) -> Any:
        """`future`'s value, waited for in short polls so a stopped run ends the wait; RuntimeWaitTimeout after
        `runtime.timeout_s` of silence, the remote error itself (unwrapped) if the task raised one."""
        start = time.monotonic()
        while not self.ray.wait([future], timeout=POLL_SECONDS)[0]:
            if self.stopped.is_set():
                raise RuntimeStopped("the learner stopped")
            if time.monotonic() - start > self.timeout_s:
                raise RuntimeWaitTimeout(f"{what} answered nothing for {self.timeout_s:.0f} s (runtime.timeout_s)")
        try:
            return self.ray.get(future)
        except self.ray.exceptions.RayTaskError as error:
            cause = error.cause if isinstance(error.cause, BaseException) else error
            raise cause from None

    def nodes_alive(self) -> dict:
        return {node["NodeID"]: node["Alive"] for node in self.ray.nodes()}

    def close(self) -> None:
        """Every actor process's envs closed (env worker processes end with them), the processes killed and, if
        this run started it, the local head stopped."""
        self.stopped.set()
        with self.lock:
            handles, self.live = list(self.live), {}
        if handles:
            closing = [handle.close.remote() for handle in handles]
            self.ray.wait(closing, num_returns=len(closing), timeout=CLOSE_SECONDS)
        for handle in handles:
            self.ray.kill(handle)
        self.ray.shutdown()
        if self.head is not None:
            self.head.stop()


def cause_of(error: BaseException) -> str:
    """A Ray error's first line and, when its text carries a remote traceback, the exception that ended it."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    last = f" ... {lines[-1]}" if len(lines) > 1 else ""
    return f"{type(error).__name__}: {first_line(error)}{last}"


class RaySlot:
    """Slot `index` of a run, acted in a Ray actor process; `block` has framework.sebulba.actor.Actor's contract."""

    def __init__(self, fleet: RayFleet, process: Optional[Any], index: int, env_seed: int, round_keys: jax.Array,
                 first_round: int, num_rounds: int, round_env_steps: int, block_steps: int, next_round: Callable,
                 in_flight: int):
        self.fleet, self.index, self.env_seed, self.block_steps = fleet, index, env_seed, block_steps
        self.num_rounds, self.round_env_steps, self.next_round = num_rounds, round_env_steps, next_round
        self.in_flight = in_flight
        self.meter = Meter()
        self.finished: list[list[float]] = [[] for _ in range(fleet.train.num_seeds)]
        self.staleness: list[int] = []
        self.inputs = None  # the last block's Actor.metric_inputs()
        self.restarts = 0  # env restarts inside the process (env.on_error=restart), as an Actor counts them
        self.actor_restarts = 0  # times this slot was reopened after its process died
        self.round, self.round_keys = first_round, round_keys  # the next round to deliver, its keys
        self.pending: collections.deque = collections.deque()  # (version, future) of the next rounds, oldest first
        self.process = process
        if process is None:
            raise HostRunError(f"no Ray actor process started within ray.start_timeout_s="
                               f"{fleet.config.start_timeout_s} s: no node offers ray.num_cpus_per_actor="
                               f"{fleet.config.num_cpus_per_actor} and ray.actor_resources="
                               f"{dict(fleet.config.actor_resources)} for actor slot {index}")
        self.open(self.process, env_seed)

    def open(self, process: Any, env_seed: int) -> None:
        key_data = np.asarray(jax.random.key_data(self.round_keys))  # typed keys do not pickle
        self.fleet.result(process.open_slot.remote(self.index, env_seed, key_data), f"actor slot {self.index}")

    def top_up(self, parameters: Callable[[], tuple[Any, int]]) -> None:
        """Ask for the next blocks up to `in_flight` ahead (never past the run's last round)."""
        params, version = parameters()
        while len(self.pending) < self.in_flight:
            round_index = self.round + len(self.pending)
            if round_index >= self.num_rounds:
                return
            reference = self.fleet.put_params(params, version)
            future = self.process.block.remote(self.index, round_index * self.round_env_steps, reference, version)
            self.pending.append((version, future))

    prefetch = top_up  # lockstep asks every slot first, then waits for each: the processes act at once

    def block(self, env_steps: int, parameters: Callable[[], tuple[Any, int]], learner_version: Callable[[], int]
              ) -> Any:
        """The block starting at a seed's `env_steps` (the next round this slot owes)."""
        assert env_steps == self.round * self.round_env_steps, (env_steps, self.round)
        while True:
            self.top_up(parameters)
            version, future = self.pending[0]
            try:
                result = self.fleet.result(future, f"the Ray actor process of actor slot {self.index}")
                break
            except self.fleet.ray.exceptions.RayActorError as error:
                self.reopen(error)
        self.pending.popleft()
        for seed, returns in enumerate(result.episodes):
            self.finished[seed].extend(returns)
        self.meter.busy += result.busy
        self.meter.count += self.block_steps  # vector steps, as an Actor counts them
        self.restarts += result.env_restarts
        self.inputs = result.metric_inputs
        self.staleness.append(learner_version() - version)
        self.round += 1
        self.round_keys = self.next_round(self.round_keys)[0]
        return result.items

    def reopen(self, error: BaseException) -> None:
        """The slot's process died: drop its blocks in flight, and reopen the slot (reseeded) in a new process
        or, when none starts, a live one."""
        fleet = self.fleet
        node = fleet.live.get(self.process)
        fleet.lost(self.process)
        dropped, self.pending = len(self.pending), collections.deque()
        self.actor_restarts += 1
        with fleet.lock:
            fleet.blocks_dropped += dropped
            fleet.actor_restarts += 1
        if self.actor_restarts > fleet.config.max_restarts:
            raise HostRunError(f"the Ray actor process of actor slot {self.index} died {self.actor_restarts} times, "
                               f"more than ray.max_restarts={fleet.config.max_restarts} ({cause_of(error)})")
        node_alive = fleet.nodes_alive().get(node, False)
        node_state = "is alive" if node_alive else "is gone"
        print(f"warning: the Ray actor process of actor slot {self.index} died ({cause_of(error)}; its node "
              f"{node_state}); {dropped} block(s) in flight dropped, "
              f"restart {self.actor_restarts} of ray.max_restarts={fleet.config.max_restarts}",
              file=sys.stderr, flush=True)
        # its node alive, the process's resources come back (the free count lags): wait for a new one there
        process = fleet.start_processes(1)[0] if node_alive or fleet.room_for_one() else None
        if process is None:
            process = fleet.any_live()
            print(f"warning: no room in the cluster for a new Ray actor process, or none started within "
                  f"ray.start_timeout_s={fleet.config.start_timeout_s} s (a lost node?): actor slot {self.index} "
                  f"moves to a live process, {len(fleet.live)} of {fleet.config.num_actors} processes left",
                  file=sys.stderr, flush=True)
        env_seed = derived_seed(self.env_seed, self.round * self.round_env_steps, self.actor_restarts)
        while True:  # the live process chosen may die before it opens the slot (its node going too): the next one
            self.process = process
            try:
                return self.open(process, env_seed)
            except fleet.ray.exceptions.RayActorError:
                fleet.lost(process)
                process = fleet.any_live()

    recent_returns = Actor.recent_returns  # it reads `finished` only

    def metric_inputs(self) -> Optional[tuple[Any, np.ndarray]]:
        return self.inputs

    def close(self) -> None:
        """The fleet kills the processes (a process may hold several slots)."""
