"""The training loop: one compiled program per chunk of updates, the host only between chunks.

    run_chunk = jit(shard_map(scan(vmap_over_seeds(algorithm.update), K)))
"""
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from omegaconf import DictConfig, OmegaConf

from framework import registry
from framework.algorithm import Algorithm
from framework.config import TrainConfig, chunk_updates, validated
from framework.checkpoint import CHECKPOINT_DIR, Checkpointer
from framework.errors import ConfigError, check_writable_dir
from framework.evaluation import make_evaluate
from framework.loggers import make_loggers
from framework.plots import plot_learning_curve
from framework.progress import ProgressBar, print_line

DEVICE_AXIS = "device"


def seed_mesh(num_seeds: int) -> Mesh:
    """Seeds are independent, so they split across as many devices as divide them evenly."""
    devices = jax.devices()
    return Mesh(np.array(devices[: math.gcd(num_seeds, len(devices))]), (DEVICE_AXIS,))


def make_run_chunk(update: Callable, mesh: Mesh, num_updates: int) -> Callable:
    """jit(shard_map(scan(vmap(update)))): `num_updates` updates of every seed, metrics of the last."""
    update_all_seeds = jax.vmap(update)

    def run_on_device(state):
        _, metrics_shape = jax.eval_shape(update_all_seeds, state)
        no_metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metrics_shape)
        step = lambda carry, _: (update_all_seeds(carry[0]), None)
        (state, metrics), _ = jax.lax.scan(step, (state, no_metrics), length=num_updates)
        return state, metrics

    seeds = PartitionSpec(DEVICE_AXIS)
    # check_vma=False: algorithms stay free of device-axis type annotations on their scan carries
    on_devices = jax.shard_map(run_on_device, mesh=mesh, in_specs=seeds, out_specs=seeds, check_vma=False)
    return jax.jit(on_devices, donate_argnums=0)


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


def _format_line(record: dict) -> str:
    parts = [f"env_steps={record['env_steps']:,}", f"steps/s={record['env_steps_per_second']:,.0f}"]
    parts += [f"{k}={v:.4g}" for k, v in record.items() if "/" in k and isinstance(v, float)]
    return "  ".join(parts)


def compile_programs(algorithm: Algorithm, evaluate_one_seed: Callable, mesh: Mesh, updates_per_chunk: int,
                     seed_keys: jax.Array, eval_keys: jax.Array) -> tuple[Callable, Callable, Callable]:
    """(init, run_chunk, evaluate) over all seeds, compiled ahead of time and side by side."""
    init_all = jax.jit(jax.vmap(algorithm.init), out_shardings=NamedSharding(mesh, PartitionSpec(DEVICE_AXIS)))
    abstract_state = jax.eval_shape(init_all, seed_keys)
    lowered = (init_all.lower(seed_keys),
               make_run_chunk(algorithm.update, mesh, updates_per_chunk).lower(abstract_state),
               jax.jit(jax.vmap(evaluate_one_seed)).lower(abstract_state, eval_keys))
    # XLA compiles outside the GIL, so the three programs build on both cores at once
    with ThreadPoolExecutor(len(lowered)) as pool:
        return tuple(pool.map(lambda program: program.compile(), lowered))


def summarize(tracker: SolveTracker, progress: dict, compile_seconds: float, wall_seconds: float, num_devices: int) -> dict:
    """summary.json: per-seed results and the run's speed (measured after compilation)."""
    env_steps, train_seconds = progress["env_steps"], progress["train_seconds"]
    num_seeds = len(tracker.solved_at_env_steps)
    return {
        "seeds": [
            {"seed_index": i, "final_eval_return": tracker.returns[-1][i],
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
    """Validate, build, compile and run; write metrics, summary, plots and checkpoints into `run_dir`."""
    launch_time = time.time() if launch_time is None else launch_time
    seconds = lambda: time.time() - launch_time
    train_cfg = validated(cfg)
    use_compilation_cache(train_cfg.compilation_cache)
    env, env_params, algorithm = build(train_cfg)
    check_writable_dir(run_dir)
    checkpointer = Checkpointer(run_dir, train_cfg.checkpoint.keep) if train_cfg.checkpoint.every or train_cfg.resume else None
    if train_cfg.resume and checkpointer.latest_step() is None:
        raise ConfigError("resume", True, "a run dir (hydra.run.dir) that holds a checkpoint", f"none in {run_dir / CHECKPOINT_DIR}")
    resolved = OmegaConf.to_container(cfg, resolve=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))

    num_seeds = train_cfg.num_seeds
    updates_per_chunk, num_chunks = chunk_updates(train_cfg, algorithm.env_steps_per_update)
    env_steps_per_chunk = updates_per_chunk * algorithm.env_steps_per_update
    mesh = seed_mesh(num_seeds)
    init_key, eval_root_key = jax.random.split(jax.random.key(train_cfg.seed))
    evaluate_one_seed = make_evaluate(env, env_params, algorithm.act, train_cfg.eval_episodes)
    compile_start = time.time()
    seed_keys = jax.random.split(init_key, num_seeds)
    init_all, run_chunk, evaluate = compile_programs(
        algorithm, evaluate_one_seed, mesh, updates_per_chunk, seed_keys, jax.random.split(eval_root_key, num_seeds))
    state = init_all(seed_keys)
    compile_seconds = time.time() - compile_start

    def evaluate_returns(state, index: int) -> np.ndarray:
        keys = jax.random.split(jax.random.fold_in(eval_root_key, index), num_seeds)
        return np.asarray(jax.device_get(evaluate(state, keys))).mean(axis=1)

    tracker = SolveTracker(num_seeds, train_cfg.target_return)
    progress = {"chunk": 0, "env_steps": 0, "train_seconds": 0.0, "metrics_lines": 0}
    if train_cfg.resume:
        state, saved = checkpointer.restore_latest(state)
        tracker.load(saved.pop("tracker"))
        progress = saved
        keep_first_lines(run_dir / "metrics.jsonl", progress["metrics_lines"])
    loggers = make_loggers(train_cfg.logger, run_dir, resolved, sweep_group)
    latest_eval = float(np.mean(tracker.returns[-1])) if tracker.returns else None
    try:
        with ProgressBar(num_chunks * env_steps_per_chunk, train_cfg.progress) as bar:
            for chunk in range(progress["chunk"], num_chunks):
                if tracker.all_solved:
                    break
                chunk_start = time.time()
                state, metrics = run_chunk(state)
                metrics = jax.device_get(metrics)
                progress["train_seconds"] += time.time() - chunk_start
                previous = progress["env_steps"]
                env_steps = progress["env_steps"] = previous + env_steps_per_chunk
                steps_per_second = num_seeds * env_steps / progress["train_seconds"]
                last = chunk == num_chunks - 1
                crossed = lambda every: every > 0 and env_steps // every > previous // every
                record = None
                if crossed(train_cfg.log_every) or crossed(train_cfg.eval_every) or last:
                    record = {"env_steps": env_steps, "wall_seconds": seconds(), "env_steps_per_second": steps_per_second}
                    record.update({k: float(np.mean(v)) for k, v in metrics.items()})
                if crossed(train_cfg.eval_every) or last:
                    returns = evaluate_returns(state, chunk)
                    tracker.record(env_steps, returns, seconds())
                    latest_eval = float(returns.mean())
                    record.update({"eval/return": latest_eval, "eval/return_per_seed": returns.tolist()})
                if record is not None:
                    loggers.log(record)
                    progress["metrics_lines"] += 1
                    print_line(_format_line(record))
                bar.update(env_steps, steps_per_second, latest_eval)
                progress["chunk"] = chunk + 1
                if checkpointer and (crossed(train_cfg.checkpoint.every) or last or tracker.all_solved):
                    checkpointer.save(env_steps, state, {**progress, "tracker": tracker.to_dict()})
    finally:
        loggers.close()
        if checkpointer:
            checkpointer.close()

    summary = summarize(tracker, progress, compile_seconds, seconds(), mesh.size)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_learning_curve(tracker.env_steps, np.array(tracker.returns), run_dir / "learning_curve.png",
                        train_cfg.target_return, f"{train_cfg.algo.name} on {train_cfg.env.name}")
    if algorithm.save_artifacts is not None:
        algorithm.save_artifacts(jax.device_get(state), run_dir)
    return summary
