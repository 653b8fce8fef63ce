"""The training loop: one compiled program per chunk of updates, the host only between chunks.

    run_chunk = jit(shard_map(scan(vmap_over_seeds(algorithm.update), K)))

The shard_map's device axis splits the seeds, or (learner-parallel algorithms) holds one learner
per device; see framework/parallel.py.
"""
import gc
import json
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec
from omegaconf import DictConfig, OmegaConf

from framework import registry
from framework.algorithm import Algorithm
from framework.config import TrainConfig, chunk_updates, validated
from framework.checkpoint import CHECKPOINT_DIR, Checkpointer, refuse_to_overwrite
from framework.errors import ConfigError, TrainingDiverged, check_writable_dir
from framework.evaluation import make_evaluate
from framework.loggers import Loggers, make_loggers
from framework.plots import plot_learning_curve
from framework.parallel import (DEVICE_AXIS, check_num_devices, initialize_distributed, is_writer, make_mesh,
                                 to_host)
from framework.progress import ProgressBar, print_line
from framework.resources import check_fits


def _on_this_device(tree: Any) -> Any:
    return jax.tree.map(lambda x: x[0], tree)  # a learner's block of the [device, seed, ...] state


def _stacked(tree: Any) -> Any:
    return jax.tree.map(lambda x: x[None], tree)


def run_updates(algorithm: Algorithm, state: Any, num_updates: int) -> tuple[Any, Any]:
    """`num_updates` updates of every seed (state [seed, ...]) in one scan; the metrics of the last
    one, and the algorithm's state metrics of the final state."""
    update_all_seeds = jax.vmap(algorithm.update)
    # every update's metrics come out of the scan ([updates, seed] scalars): the update is traced once
    state, history = jax.lax.scan(lambda carry, _: update_all_seeds(carry), state, length=num_updates)
    metrics = jax.tree.map(lambda values: values[-1], history)
    if algorithm.state_metrics is not None:
        metrics = {**metrics, **jax.vmap(algorithm.state_metrics)(state)}
    return state, metrics


class Programs(NamedTuple):
    """The jitted programs of a run, over all seeds (and learners)."""

    init: Callable  # seed keys [S] -> state
    run_chunk: Callable  # state -> (state, metrics of the chunk's last update)
    evaluate: Callable  # (state, eval keys [S]) -> returns [(device,) S, episodes]


def run_keys(seed: jax.Array, evaluation: jax.Array, num_seeds: int) -> tuple[jax.Array, jax.Array]:
    """Every seed's init key, and every seed's key for evaluation number `evaluation` (seed: uint32)."""
    init_key, eval_root_key = jax.random.split(jax.random.key(seed))
    eval_key = jax.random.fold_in(eval_root_key, evaluation)
    return jax.random.split(init_key, num_seeds), jax.random.split(eval_key, num_seeds)


class SeededPrograms(NamedTuple):
    """The compiled programs of a run; they derive their keys from the run's seed themselves.

    Each random op run eagerly on the host would first compile its own small XLA program (~80 ms
    apiece on this CPU, four of them before the first evaluation).
    """

    init: Callable  # seed (uint32) -> state
    run_chunk: Callable  # state -> (state, metrics of the chunk's last update)
    evaluate: Callable  # (state, seed, evaluation number (int32)) -> returns [(device,) S, episodes]


def seed_parallel_programs(algorithm: Algorithm, evaluate_one_seed: Callable, mesh: Mesh, num_updates: int) -> Programs:
    """Independent seeds split over the devices: state [seed, ...]."""
    seeds = PartitionSpec(DEVICE_AXIS)
    on_mesh = lambda fn, in_specs: jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=seeds, check_vma=False)
    chunk = lambda state: run_updates(algorithm, state, num_updates)
    return Programs(jax.jit(on_mesh(jax.vmap(algorithm.init), seeds)),
                    # check_vma=False: algorithms stay free of device-axis type annotations on their scan carries
                    jax.jit(on_mesh(chunk, seeds), donate_argnums=0),
                    jax.jit(on_mesh(jax.vmap(evaluate_one_seed), (seeds, seeds))))


def learner_parallel_programs(algorithm: Algorithm, evaluate_one_seed: Callable, mesh: Mesh, num_updates: int) -> Programs:
    """Every device runs every seed's learner and actors: state [device, seed, ...]."""
    devices, everywhere = PartitionSpec(DEVICE_AXIS), PartitionSpec()
    on_mesh = lambda fn, in_specs: jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=devices, check_vma=False)
    init = lambda keys: _stacked(jax.vmap(algorithm.init)(keys))
    chunk = lambda state: _stacked(run_updates(algorithm, _on_this_device(state), num_updates))
    # the parameters are the same on every device, so every device evaluates with the same keys
    evaluate = lambda state, keys: _stacked(jax.vmap(evaluate_one_seed)(_on_this_device(state), keys))
    return Programs(jax.jit(on_mesh(init, everywhere)), jax.jit(on_mesh(chunk, devices), donate_argnums=0),
                    jax.jit(on_mesh(evaluate, (devices, everywhere))))


def per_seed(values: np.ndarray, learners: bool) -> np.ndarray:
    """Host values [seed, ...]: learner-parallel runs average their devices' actors and learners."""
    return values.mean(axis=0) if learners else values


def build(train: TrainConfig) -> tuple[Any, Any, Algorithm]:
    """The env and algorithm selected by a validated config (may raise ConfigError)."""
    env, env_params = registry.lookup("env", train.env.name).factory(train.env)
    algorithm = registry.lookup("algo", train.algo.name).factory(train.algo, env, env_params)
    return env, env_params, algorithm


class SolveTracker:
    """Per-seed evaluation history and the first time each seed reached the target."""

    def __init__(self, num_seeds: int, target_return: Optional[float]):
        self.target = target_return
        self.env_steps: list[int] = []
        self.returns: list[list[float]] = []
        self.solved_at_env_steps: list[Optional[int]] = [None] * num_seeds
        self.solved_at_seconds: list[Optional[float]] = [None] * num_seeds

    def record(self, env_steps: int, returns: np.ndarray, seconds: float) -> None:
        self.env_steps.append(env_steps)
        self.returns.append([float(r) for r in returns])
        if self.target is None:
            return
        for seed, value in enumerate(returns):
            if value >= self.target and self.solved_at_env_steps[seed] is None:
                self.solved_at_env_steps[seed], self.solved_at_seconds[seed] = env_steps, seconds

    @property
    def all_solved(self) -> bool:
        return self.target is not None and all(s is not None for s in self.solved_at_env_steps)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("env_steps", "returns", "solved_at_env_steps", "solved_at_seconds")}

    def load(self, saved: dict) -> None:
        for key, value in saved.items():
            setattr(self, key, list(value))


def non_finite_seeds(metrics: dict, algorithm: Algorithm, learners: bool) -> list[tuple[str, int]]:
    """(metric, seed) pairs whose health metric is not finite although that seed's learner has started."""
    if not algorithm.health_metrics:
        return []
    reduce = (lambda x: x.max(axis=0)) if learners else (lambda x: x)  # any learner device
    started = reduce(np.asarray(metrics[algorithm.learner_steps]) > 0)
    return [(name, int(seed)) for name in algorithm.health_metrics
            for seed in np.flatnonzero(started & reduce(~np.isfinite(np.asarray(metrics[name]))))]


def rate_name(counter: str) -> str:
    """"learner/updates" -> "perf/learner_updates_per_second"."""
    return f"perf/{counter.replace('/', '_')}_per_second"


def _format_line(record: dict) -> str:
    parts = [f"env_steps={record['env_steps']:,}", f"steps/s={record['perf/env_steps_per_second']:,.0f}"]
    parts += [f"{k}={v:.4g}" for k, v in record.items() if "/" in k and not k.startswith("perf/") and isinstance(v, float)]
    return "  ".join(parts)


# (init, run_chunk, evaluate) on CPU: level 1 (0 for init, which runs once) builds faster than XLA's
# default 2 and run_chunk runs as fast; XLA's older LLVM emitters build init and evaluate in half the
# time (each fusion skips an MLIR pipeline), run_chunk keeps the newer, ~30% faster code. With XLA's
# defaults the three took 5.9 s (DQN) / 7.5 s (Ape-X), with these 2.75 / 4.1 s (bench/bench_compile.py).
_OLD_EMITTERS = {"xla_cpu_use_fusion_emitters": False}
CPU_COMPILER_OPTIONS = ({"xla_backend_optimization_level": 0, **_OLD_EMITTERS}, {"xla_backend_optimization_level": 1},
                        {"xla_backend_optimization_level": 1, **_OLD_EMITTERS})


SEED, EVAL_INDEX = jax.ShapeDtypeStruct((), np.uint32), jax.ShapeDtypeStruct((), np.int32)


def compile_programs(algorithm: Algorithm, evaluate_one_seed: Callable, mesh: Mesh, updates_per_chunk: int,
                     num_seeds: int, before_compiling: Callable[[Any], None] = lambda abstract_state: None
                     ) -> SeededPrograms:
    """The run's programs for its layout, compiled ahead of time and side by side.

    `before_compiling(abstract_state)` may still refuse the run (ConfigError) at no compile cost.
    """
    make = learner_parallel_programs if algorithm.parallel_learners else seed_parallel_programs
    programs = make(algorithm, evaluate_one_seed, mesh, updates_per_chunk)
    init_from_seed = jax.jit(lambda seed: programs.init(run_keys(seed, 0, num_seeds)[0]))
    evaluate_from_seed = jax.jit(lambda state, seed, evaluation: programs.evaluate(
        state, run_keys(seed, evaluation, num_seeds)[1]))
    abstract_state = jax.eval_shape(init_from_seed, SEED)
    before_compiling(abstract_state)
    init_options, chunk_options, evaluate_options = (CPU_COMPILER_OPTIONS if jax.default_backend() == "cpu"
                                                     else ({}, {}, {}))
    # XLA compiles outside the GIL: run_chunk, the longest build, starts first, and the other two
    # are traced (Python) and built while it compiles
    with ThreadPoolExecutor(3) as pool:
        submit = lambda lowered, options: pool.submit(lowered.compile, compiler_options=options)
        chunk_build = submit(programs.run_chunk.lower(abstract_state), chunk_options)
        init_build = submit(init_from_seed.lower(SEED), init_options)
        evaluate_build = submit(evaluate_from_seed.lower(abstract_state, SEED, EVAL_INDEX), evaluate_options)
        return SeededPrograms(init_build.result(), chunk_build.result(), evaluate_build.result())


def summarize(tracker: SolveTracker, progress: dict, compile_seconds: float, wall_seconds: float, num_devices: int,
              interrupted_returns: Optional[np.ndarray] = None) -> dict:
    """summary.json: per-seed results and the run's speed (measured after compilation).

    `interrupted_returns`: the evaluation of a run stopped by Ctrl-C, which then counts as final.
    """
    env_steps, train_seconds = progress["env_steps"], progress["train_seconds"]
    num_seeds = len(tracker.solved_at_env_steps)
    final_returns = tracker.returns[-1] if interrupted_returns is None else interrupted_returns.tolist()
    return {
        "interrupted": interrupted_returns is not None,
        "seeds": [
            {"seed_index": i, "final_eval_return": final_returns[i],
             "solved_at_env_steps": tracker.solved_at_env_steps[i], "solved_at_seconds": tracker.solved_at_seconds[i]}
            for i in range(num_seeds)
        ],
        "env_steps": env_steps,
        "env_steps_per_second": num_seeds * env_steps / train_seconds,
        "env_steps_per_second_per_seed": env_steps / train_seconds,
        "compile_seconds": compile_seconds,
        "wall_seconds": wall_seconds,
        "num_devices": num_devices,
    }


class StopRequest:
    """Ctrl-C (SIGINT) asks the loop to stop after the running chunk, with a checkpoint and a summary."""

    def __init__(self):
        self.requested = False

    def _handle(self, signum, frame) -> None:
        if self.requested:  # a second Ctrl-C stops at once
            raise KeyboardInterrupt
        self.requested = True
        print("interrupted: finishing this chunk, then a checkpoint and the summary (Ctrl-C again to abort)",
              file=sys.stderr, flush=True)

    def __enter__(self) -> "StopRequest":
        self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGINT, self.previous)


def keep_first_lines(path: Path, count: int) -> None:
    """Drop log lines written after the checkpoint a run resumes from."""
    if path.exists():
        lines = path.read_text().splitlines(keepends=True)[:count]
        path.write_text("".join(lines))


def use_compilation_cache(directory: Optional[str]) -> None:
    """Keep compiled programs on disk (null: off); checked before anything compiles."""
    if directory is None:
        return
    path = Path(directory).expanduser()
    check_writable_dir(path, "compilation_cache")
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def train(cfg: DictConfig, run_dir: Path, launch_time: Optional[float] = None, sweep_group: Optional[str] = None) -> dict:
    """Validate, build, compile and run; write metrics, summary, plots and checkpoints into `run_dir`.

    Under several processes every process runs the same loop on its devices; the first one alone writes.
    """
    launch_time = time.time() if launch_time is None else launch_time
    seconds = lambda: time.time() - launch_time
    train_cfg = validated(cfg)
    initialize_distributed(train_cfg.distributed)
    check_num_devices(train_cfg.num_devices)
    use_compilation_cache(train_cfg.compilation_cache)
    env, env_params, algorithm = build(train_cfg)
    writer = is_writer()
    check_writable_dir(run_dir)
    checkpointer = Checkpointer(run_dir, train_cfg.checkpoint.keep) if train_cfg.checkpoint.every or train_cfg.resume else None
    if train_cfg.resume and checkpointer.latest_step() is None:
        raise ConfigError("resume", True, "a run dir (hydra.run.dir) that holds a checkpoint", f"none in {run_dir / CHECKPOINT_DIR}")
    if not train_cfg.resume:
        refuse_to_overwrite(run_dir)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    if writer:
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))

    num_seeds, learners = train_cfg.num_seeds, algorithm.parallel_learners
    mesh = make_mesh(num_seeds, learners, train_cfg.num_devices)
    # learners add their devices' actors to the population: every update steps all of their envs
    env_steps_per_update = algorithm.env_steps_per_update * (mesh.size if learners else 1)
    updates_per_chunk, num_chunks = chunk_updates(train_cfg, env_steps_per_update)
    env_steps_per_chunk = updates_per_chunk * env_steps_per_update
    evaluate_one_seed = make_evaluate(env, env_params, algorithm.act, train_cfg.eval_episodes)
    compile_start = time.time()
    checkpoints_kept = train_cfg.checkpoint.keep if checkpointer else 0
    fits = lambda abstract_state: check_fits(abstract_state, run_dir, checkpoints_kept, jax.default_backend() == "cpu")
    programs = compile_programs(algorithm, evaluate_one_seed, mesh, updates_per_chunk, num_seeds, fits)
    run_seed = np.uint32(train_cfg.seed)
    state = programs.init(run_seed)
    compile_seconds = time.time() - compile_start
    if not gc.isenabled():  # run.py pauses the collector through startup; its objects stay out of later scans
        gc.freeze()
        gc.enable()

    def evaluate_returns(state, index: int) -> np.ndarray:
        return per_seed(to_host(programs.evaluate(state, run_seed, np.int32(index))), learners).mean(axis=-1)

    tracker = SolveTracker(num_seeds, train_cfg.target_return)
    progress = {"chunk": 0, "env_steps": 0, "train_seconds": 0.0, "metrics_lines": 0}
    if train_cfg.resume:
        state, saved = checkpointer.restore_latest(state)
        tracker.load(saved.pop("tracker"))
        progress = saved
        if writer:
            keep_first_lines(run_dir / "metrics.jsonl", progress["metrics_lines"])
    elif writer:
        keep_first_lines(run_dir / "metrics.jsonl", 0)  # a fresh run in a used run dir starts a fresh log
    loggers = make_loggers(train_cfg.logger, run_dir, resolved, sweep_group) if writer else Loggers([])
    latest_eval = float(np.mean(tracker.returns[-1])) if tracker.returns else None
    summary, stop, last = None, StopRequest(), False
    try:
        with ProgressBar(num_chunks * env_steps_per_chunk, train_cfg.progress and writer) as bar, stop:
            for chunk in range(progress["chunk"], num_chunks):
                if tracker.all_solved:
                    break
                chunk_start = time.time()
                state, metrics = programs.run_chunk(state)
                metrics = to_host(metrics)
                for name, seed in non_finite_seeds(metrics, algorithm, learners):
                    message = (f"{name} is not finite for seed {seed} at env step "
                               f"{progress['env_steps'] + env_steps_per_chunk:,}")
                    if train_cfg.nan_policy == "stop":  # the state is not saved: the last checkpoint stays good
                        raise TrainingDiverged(f"{message}; stopped (nan_policy=stop). The newest checkpoint, if any, "
                                               "is from before; set nan_policy=warn to only log it.")
                    print(f"warning: {message} (nan_policy=warn)", file=sys.stderr, flush=True)
                progress["train_seconds"] += time.time() - chunk_start
                previous = progress["env_steps"]
                env_steps = progress["env_steps"] = previous + env_steps_per_chunk
                steps_per_second = num_seeds * env_steps / progress["train_seconds"]
                last = chunk == num_chunks - 1
                crossed = lambda every: every > 0 and env_steps // every > previous // every
                record = None
                if crossed(train_cfg.log_every) or crossed(train_cfg.eval_every) or last:
                    record = {"env_steps": env_steps, "perf/wall_seconds": seconds(),
                              "perf/env_steps_per_second": steps_per_second}
                    record.update({k: float(np.mean(v)) for k, v in metrics.items()})
                    record.update({rate_name(k): record[k] / progress["train_seconds"] for k in algorithm.counters})
                if crossed(train_cfg.eval_every) or last:
                    returns = evaluate_returns(state, chunk)
                    tracker.record(env_steps, returns, seconds())
                    latest_eval = float(returns.mean())
                    record.update({"eval/return": latest_eval, "eval/return_per_seed": returns.tolist()})
                if record is not None:
                    loggers.log(record)
                    progress["metrics_lines"] += 1
                    if writer:
                        print_line(_format_line(record))
                bar.update(env_steps, steps_per_second, latest_eval)
                progress["chunk"] = chunk + 1
                if stop.requested and checkpointer is None:
                    checkpointer = Checkpointer(run_dir, train_cfg.checkpoint.keep)
                if checkpointer and (crossed(train_cfg.checkpoint.every) or last or tracker.all_solved or stop.requested):
                    checkpointer.save(env_steps, state, {**progress, "tracker": tracker.to_dict()})
                if stop.requested:
                    break
        # an interrupted run is scored on its state now, outside the evaluation history it resumes with
        interrupted_returns = evaluate_returns(state, num_chunks) if stop.requested and not last else None
        summary = summarize(tracker, progress, compile_seconds, seconds(), mesh.size, interrupted_returns)
    finally:
        loggers.close(summary)
        if checkpointer:
            checkpointer.close()

    if writer:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        if tracker.env_steps:  # a run stopped by Ctrl-C before its first evaluation has no curve yet
            plot_learning_curve(tracker.env_steps, np.array(tracker.returns), run_dir / "learning_curve.png",
                                train_cfg.target_return, f"{train_cfg.algo.name} on {train_cfg.env.name}")
    if algorithm.save_artifacts is not None:
        final_state = to_host(state)
        if writer:
            algorithm.save_artifacts(_on_this_device(final_state) if learners else final_state, run_dir)
    return summary
