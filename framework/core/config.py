"""Structured config schema (Hydra ConfigStore) and the value checks run before compiling.

The dataclasses hold every default; a YAML in conf/ holds only what its option changes. Every
registered env and algorithm brings a dataclass schema. It is stored as the config
`<group>_<name>_schema` (outside any group, so `--help` lists only the groups a user chooses from;
the built-in YAML files in conf/ extend it) and, when conf/ has no YAML of that name (a third-party
plugin), as the group option `<group>/<name>` itself.
"""
import dataclasses
import importlib.util
import math
from pathlib import Path
from typing import Any, Dict, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from lightspeed.framework.core import registry
from lightspeed.framework.core.errors import (
    ConfigError,
    check,
    check_choice,
    check_number,
    check_positive_int,
    install_hint,
)


def conf_dir() -> Path:
    """The built-in config groups, beside framework/: the installed package's lightspeed/conf, or the repository's
    conf/ in a source checkout or an editable install."""
    return Path(__file__).resolve().parent.parent.parent / "conf"


CONF_DIR = conf_dir()
WANDB_MODES = ("auto", "offline", "online", "disabled")
NAN_POLICIES = ("stop", "warn")
MATMUL_PRECISIONS = ("default", "high", "highest")  # jax_default_matmul_precision's names


@dataclasses.dataclass
class LoggerConfig:
    """`console` (progress + metrics.jsonl), plus Weights & Biases (`wandb`) or TensorBoard (`tensorboard`)."""

    name: str = "console"  # the logger=... option chosen; the sinks are the ones wandb and tensorboard turn on
    wandb: bool = False  # also log to Weights & Biases (project, entity, group, mode, init_timeout)
    tensorboard: bool = False  # also write TensorBoard event files to <run dir>/tensorboard (needs tensorboardX)
    project: str = "lightspeed"  # the W&B project the runs are logged to
    entity: Optional[str] = None  # the W&B user or team that owns the project (null: the API key's default)
    group: Optional[str] = None  # defaults to the sweep's name under multirun
    mode: str = "auto"  # auto: online with WANDB_API_KEY, offline without
    init_timeout: int = 30  # seconds an online init may take before the run falls back to offline

    def validate(self) -> None:
        check_choice("logger.mode", self.mode, WANDB_MODES)
        check(bool(self.project), "logger.project", self.project, "a non-empty W&B project name")
        check_positive_int("logger.init_timeout", self.init_timeout)
        if self.tensorboard:
            check(importlib.util.find_spec("tensorboardX") is not None, "logger", self.name,
                  f"console or wandb, or install the tensorboard extra: {install_hint('tensorboard')}",
                  "tensorboardX is not installed")


@dataclasses.dataclass
class CheckpointConfig:
    every: int = 0  # env steps between checkpoints; 0 writes none
    keep: int = 3  # newest checkpoints kept on disk

    def validate(self) -> None:
        check_positive_int("checkpoint.every", self.every, minimum=0)
        check_positive_int("checkpoint.keep", self.keep)


RUNTIME_MODES = ("free", "lockstep")


@dataclasses.dataclass
class RuntimeConfig:
    """Actors and learner apart (host envs, framework/sebulba/trainer.py); the single program ignores these keys."""

    # free: actor threads and the learner run at once, held to samples_per_insert; lockstep: block k is acted
    # with the parameters after learner round k-1, then its share of samples is drawn (reproducible, slower)
    mode: str = "free"
    num_actor_threads: int = 1  # threads stepping the envs, each a share of every seed's env columns
    # learner samples per inserted item, kept within one learner round's samples; auto: what the single
    # program does (Ape-X 16 x 128 / 256 = 8, DQN updates_per_train x batch_size / train_every); null: free
    samples_per_insert: Any = "auto"
    queue_blocks: int = 2  # blocks in flight per actor thread
    timeout_s: float = 60.0  # longest the run may not move (no block handed over, no grant) before it stops
    # an on-policy algorithm's (PPO's) blocks, free mode: learner updates by which the parameters a block is acted
    # with may trail the learner's when it learns the block. 0: synchronous (a block acted after the last was
    # learned, as the single program); one round's updates (PPO: epochs x minibatches): acting overlaps learning
    max_policy_lag: int = 0

    def validate(self) -> None:
        check_choice("runtime.mode", self.mode, RUNTIME_MODES)
        check_positive_int("runtime.num_actor_threads", self.num_actor_threads)
        spi = self.samples_per_insert
        check(spi in ("auto", None) or (isinstance(spi, (int, float)) and not isinstance(spi, bool) and spi > 0),
              "runtime.samples_per_insert", spi, "auto, null (free running) or a number > 0")
        check_positive_int("runtime.queue_blocks", self.queue_blocks)
        check_number("runtime.timeout_s", self.timeout_s, 0, low_inclusive=False)
        check_positive_int("runtime.max_policy_lag", self.max_policy_lag, minimum=0)


ACTOR_FLEETS = ("threads", "ray")
# every listener of a local Ray head that a key pins (docs/ray.md lists them)
RAY_PORT_KEYS = ("port", "node_manager_port", "object_manager_port", "runtime_env_agent_port",
                 "dashboard_agent_grpc_port", "dashboard_agent_listen_port", "metrics_export_port",
                 "client_server_port", "dashboard_port", "autoscaler_metric_port")


@dataclasses.dataclass
class RayConfig:
    """actors=ray (framework/sebulba/ray/actors.py): each actor slot (a share of every seed's env columns) steps its
    envs in a Ray actor process anywhere in the cluster; the learner stays in this process on its device."""

    # null: start a local head (ports below, a per-run token); auto or host:port: join a running cluster
    address: Optional[str] = None
    num_actors: int = 2  # actor slots, each a Ray actor process with num_envs / num_actors of every seed's envs
    num_cpus_per_actor: float = 1.0  # CPUs Ray reserves for each actor process (a node must offer them to host it)
    actor_resources: Dict[str, float] = dataclasses.field(default_factory=dict)  # custom resources each actor asks for
    blocks_in_flight: int = 2  # blocks asked of an actor ahead of the learner (free mode; lockstep: 1)
    max_restarts: int = 3  # times an actor slot is reopened (a dead process replaced, or moved off a lost node)
    min_actors: int = 1  # fewer live actor processes than this stops the run
    start_timeout_s: float = 60.0  # longest an actor process may take to start (import, envs) before it is given up
    # the token file of the cluster joined (its RAY_AUTH_TOKEN_PATH); a local head writes a fresh one per run
    token_file: Optional[str] = None
    num_cpus: Optional[int] = None  # the local head's CPUs (null: the machine's)
    node_ip_address: str = "127.0.0.1"  # the local head's address (Ray still binds most listeners to every interface)
    temp_dir: Optional[str] = None  # the local head's session dir (null: a short dir under /tmp; sockets live there)
    dashboard: bool = False  # a local head also starts Ray's dashboard (on node_ip_address:dashboard_port)
    port: int = 46379  # GCS: the cluster's address
    node_manager_port: int = 46380  # raylet
    object_manager_port: int = 46381  # object manager (raylet): objects between nodes
    runtime_env_agent_port: int = 46382  # runtime-env agent: the actors' environment variables
    dashboard_agent_grpc_port: int = 46383  # dashboard agent, gRPC (pinned; not started: no metrics collection)
    dashboard_agent_listen_port: int = 46384  # dashboard agent, HTTP (pinned; not started: no metrics collection)
    metrics_export_port: int = 46385  # metrics export (pinned; not started: no metrics collection)
    client_server_port: int = 46386  # Ray Client (ray://)
    dashboard_port: int = 46387  # only with dashboard=true
    autoscaler_metric_port: int = 46388  # the head's autoscaler monitor (Ray's AUTOSCALER_METRIC_PORT)
    min_worker_port: int = 46400  # every worker process (actors and the driver) listens on one port of this range
    max_worker_port: int = 46499  # the worker ports' last one (at least min_worker_port + 2 num_actors + 4)

    def validate(self) -> None:
        check(self.address is None or self.address == "auto" or is_host_port(self.address), "ray.address",
              self.address, "null (start a local head), auto (the cluster this machine belongs to) or host:port")
        check_positive_int("ray.num_actors", self.num_actors)
        check_number("ray.num_cpus_per_actor", self.num_cpus_per_actor, 0, low_inclusive=False)
        check(isinstance(self.actor_resources, dict) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in self.actor_resources.values()),
            "ray.actor_resources", self.actor_resources, "a mapping of custom resource names to amounts > 0")
        check_positive_int("ray.blocks_in_flight", self.blocks_in_flight)
        check_positive_int("ray.max_restarts", self.max_restarts, minimum=0)
        check_positive_int("ray.min_actors", self.min_actors)
        check(self.min_actors <= self.num_actors, "ray.min_actors", self.min_actors,
              f"at most ray.num_actors ({self.num_actors})")
        check_number("ray.start_timeout_s", self.start_timeout_s, 0, low_inclusive=False)
        if self.num_cpus is not None:
            check_positive_int("ray.num_cpus", self.num_cpus)
        for key in (*RAY_PORT_KEYS, "min_worker_port", "max_worker_port"):
            check_positive_int(f"ray.{key}", getattr(self, key), minimum=1024)
            check(getattr(self, key) <= 65535, f"ray.{key}", getattr(self, key), "a port 1024-65535")
        check(self.max_worker_port - self.min_worker_port >= 2 * self.num_actors + 4, "ray.max_worker_port",
              self.max_worker_port, f"at least ray.min_worker_port + {2 * self.num_actors + 4} (a port per worker "
              "process: the actors, the driver and Ray's idle workers)")


@dataclasses.dataclass
class DistributedConfig:
    """Several processes (hosts) joined by `jax.distributed.initialize`; one process: nothing to do."""

    name: str = "auto"  # the distributed=... option chosen (auto: the LIGHTSPEED_* variables; local: one process)
    coordinator_address: Optional[str] = None  # host:port of process 0, reachable from every process
    num_processes: int = 1  # processes (hosts) in the cluster, one jax.distributed process each; 1: none to join
    process_id: int = 0  # this process's index, 0 .. num_processes - 1 (process 0 coordinates and writes the run dir)
    initialization_timeout: int = 120  # seconds to wait for every process to join
    # where process 0's coordination service (unauthenticated gRPC) listens; null: the coordinator
    # address itself, so 127.0.0.1:PORT stays on loopback. 0.0.0.0:PORT listens on every interface.
    bind_address: Optional[str] = None

    def validate(self) -> None:
        check_positive_int("distributed.num_processes", self.num_processes)
        check_positive_int("distributed.process_id", self.process_id, minimum=0)
        check_positive_int("distributed.initialization_timeout", self.initialization_timeout)
        check(self.process_id < self.num_processes, "distributed.process_id", self.process_id,
              f"0 .. distributed.num_processes - 1 ({self.num_processes - 1})")
        if self.num_processes > 1:
            check(is_host_port(self.coordinator_address), "distributed.coordinator_address", self.coordinator_address,
                  "host:port of process 0 (or the LIGHTSPEED_COORDINATOR environment variable)")
        if self.bind_address is not None:
            check(is_host_port(self.bind_address), "distributed.bind_address", self.bind_address,
                  "null (listen on the coordinator address) or host:port, e.g. 0.0.0.0:7777 for every interface")


def is_host_port(address: Optional[str]) -> bool:
    host, _, port = (address or "").rpartition(":")
    return bool(host) and port.isdigit()


@dataclasses.dataclass
class TrainConfig:
    algo: Any = MISSING
    env: Any = MISSING
    logger: LoggerConfig = MISSING
    distributed: DistributedConfig = MISSING
    seed: int = 0  # root of every random key (0 .. 2**32 - 1); each of the num_seeds seeds derives its own from it
    num_seeds: int = 1  # independent runs vmapped in one program
    num_devices: Optional[int] = None  # devices to run on (null: all that JAX sees, on every process)
    total_env_steps: int = 100_000  # per seed, over all of its envs
    eval_every: int = 10_000  # env steps between periodic evaluations (the learning curve's points)
    eval_episodes: int = 16  # greedy episodes of each periodic evaluation (the learning curve)
    final_eval_episodes: int = 100  # greedy episodes of the final evaluation (the result)
    # each seed ends once solved (solve_window evaluations in a row), with its best policy; the run once all are
    target_return: Optional[float] = None
    solve_window: int = 3  # consecutive periodic evaluations >= target_return that make a seed solved
    log_every: int = 10_000  # env steps between log lines (and metrics.jsonl records)
    progress: bool = True  # draw the progress bar (on a terminal only, and by process 0)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)
    actors: str = "threads"  # host envs: actor threads in this process, or actor processes on Ray (ray.*)
    ray: RayConfig = dataclasses.field(default_factory=RayConfig)
    resume: bool = False  # continue from the newest checkpoint in the run dir
    nan_policy: str = "stop"  # a non-finite loss or Q-value: stop (keeping the last good checkpoint) or warn
    # XLA programs cached on disk: a relaunch with the same shapes skips most of compilation
    compilation_cache: Optional[str] = "~/.cache/lightspeed/xla"
    # float32 matrix products: null keeps JAX's default (full float32 on a CPU; bfloat16 passes on a TPU, TF32 on
    # recent NVIDIA GPUs), highest asks for full float32 everywhere (slower on an accelerator)
    matmul_precision: Optional[str] = None

    def validate(self) -> None:
        check_positive_int("seed", self.seed, minimum=0)
        check(self.seed < 2**32, "seed", self.seed, f"at most {2**32 - 1}", "keys are derived from a uint32 seed")
        check_positive_int("num_seeds", self.num_seeds)
        if self.num_devices is not None:
            check_positive_int("num_devices", self.num_devices)
        for key in ("total_env_steps", "eval_every", "eval_episodes", "final_eval_episodes", "solve_window",
                    "log_every"):
            check_positive_int(key, getattr(self, key))
        if self.target_return is not None:
            check_number("target_return", self.target_return)
        self.checkpoint.validate()
        self.runtime.validate()
        check_choice("actors", self.actors, ACTOR_FLEETS)
        if self.actors == "ray":
            # plain `pip install ray` lacks grpcio, without which a local head refuses its client server port
            missing = [name for name in ("ray", "grpc") if importlib.util.find_spec(name) is None]
            check(not missing, "actors", self.actors, "threads (actor threads in this process), or ray once it is "
                  f"installed: {install_hint('ray')} (ray[client])", f"{' and '.join(missing)} not installed")
            self.ray.validate()
        check_choice("nan_policy", self.nan_policy, NAN_POLICIES)
        if self.matmul_precision is not None:
            check(self.matmul_precision in MATMUL_PRECISIONS, "matmul_precision", self.matmul_precision,
                  f"null (JAX's default) or one of {', '.join(MATMUL_PRECISIONS)}")


def register_schemas() -> None:
    """Put the top-level, logger, env and algorithm schemas into Hydra's ConfigStore."""
    registry.load_plugins()
    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    store.store(name="logger_schema", node=LoggerConfig)
    store.store(name="distributed_schema", node=DistributedConfig)
    for group, kind in (("env", "env"), ("algo", "algo")):
        for name in registry.known(kind):
            config_class = registry.lookup(kind, name).config_class
            store.store(name=f"{group}_{name}_schema", node=config_class)
            if not (CONF_DIR / group / f"{name}.yaml").exists():
                store.store(group=group, name=name, node=config_class)


def _as_object(node: Any) -> Any:
    return OmegaConf.to_object(node) if isinstance(node, DictConfig) else node


def check_known_keys(node: DictConfig, config_class: type, prefix: str = "") -> None:
    """Keys appended with `+key=value` that the schema does not know are errors, not ignored."""
    fields = {f.name for f in dataclasses.fields(config_class)}
    for key in node:
        check(key in fields, f"{prefix}{key}", node[key], f"keys of this schema: {', '.join(sorted(fields))}",
              "unknown key")


def validated(cfg: DictConfig) -> TrainConfig:
    """The composed config as dataclasses, every value checked; raises ConfigError."""
    check_known_keys(cfg, TrainConfig)
    for group in ("env", "algo"):
        entry = registry.lookup(group, cfg[group].get("name"))
        check_known_keys(cfg[group], entry.config_class, f"{group}.")
    check_known_keys(cfg.logger, LoggerConfig, "logger.")
    check_known_keys(cfg.distributed, DistributedConfig, "distributed.")
    check_known_keys(cfg.checkpoint, CheckpointConfig, "checkpoint.")
    check_known_keys(cfg.runtime, RuntimeConfig, "runtime.")
    check_known_keys(cfg.ray, RayConfig, "ray.")
    train = _as_object(cfg)
    for group in ("env", "algo"):
        node = getattr(train, group)
        entry = registry.lookup(group, node.name)
        check(isinstance(node, entry.config_class), f"{group}.name", node.name,
              f"the name of the selected {group} option ({', '.join(registry.known(group))})")
    train.validate()
    train.logger.validate()
    train.distributed.validate()
    train.env.validate()
    train.algo.validate()
    check_learning_can_start(train)
    return train


def check_learning_can_start(train: TrainConfig) -> None:
    """Refuse a run whose learner would never update: an algorithm config's optional `learning_start()` names the
    key that sets when a seed's learner first learns, and after how many of the seed's env steps."""
    learning_start = getattr(train.algo, "learning_start", None)
    if learning_start is None:
        return
    key, env_steps = learning_start()
    check(env_steps < train.total_env_steps, key, getattr(train.algo, key.removeprefix("algo.")),
          f"a value that lets the learner start within total_env_steps={train.total_env_steps:,} (or a longer run)",
          f"each seed's learner first learns after {env_steps:,} env steps, so this run would never learn")


def chunk_updates(train: TrainConfig, env_steps_per_update: int) -> tuple[int, int]:
    """(updates per compiled chunk, number of chunks) so logs and evals land on chunk ends."""
    # math.gcd ignores a 0, so a disabled checkpoint interval does not constrain the chunks
    boundaries = math.gcd(train.log_every, train.eval_every, train.checkpoint.every)
    chunk_env_steps = min(boundaries, train.total_env_steps)
    updates_per_chunk = max(1, -(-chunk_env_steps // env_steps_per_update))
    steps_per_chunk = updates_per_chunk * env_steps_per_update
    return updates_per_chunk, max(1, -(-train.total_env_steps // steps_per_chunk))


__all__ = ["ConfigError", "CheckpointConfig", "DistributedConfig", "LoggerConfig", "RuntimeConfig", "TrainConfig",
           "register_schemas", "validated", "chunk_updates"]
