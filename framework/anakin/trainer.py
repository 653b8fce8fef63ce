"""The single-program driver (Anakin): one compiled program per chunk of updates, the host only between chunks
(a host env goes to framework/sebulba's actors and learner; what both share is in framework/run).

    run_chunk = jit(shard_map(scan(vmap_over_seeds(algorithm.update), K)))

The shard_map's device axis splits the seeds, or (learner-parallel algorithms) holds one learner
per device; see framework/core/devices.py.
"""
import gc
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec
from omegaconf import DictConfig

from lightspeed.framework.anakin.compose import composed
from lightspeed.framework.core import registry
from lightspeed.framework.core.algorithm import Algorithm, check_outputs
from lightspeed.framework.core.config import TrainConfig, chunk_updates
from lightspeed.framework.core.devices import DEVICE_AXIS, is_writer, make_mesh, to_devices, to_host
from lightspeed.framework.core.errors import TrainingDiverged
from lightspeed.framework.core.evaluation import make_evaluate
from lightspeed.framework.core.keys import FINAL_EVALUATION, run_keys
from lightspeed.framework.run.common import StopRequest, open_run_dir, rate_name
from lightspeed.framework.run.loop import RunLoop
from lightspeed.framework.run.progress import ProgressBar
from lightspeed.framework.run.protocol import BestPolicies
from lightspeed.framework.run.resources import check_fits


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
    evaluate: Callable  # (policies, eval keys [S]) -> returns [(device,) S, episodes]


class SeededPrograms(NamedTuple):
    """The compiled programs of a run; they derive their keys from the run's seed themselves.

    Each random op run eagerly on the host would first compile its own small XLA program (~80 ms
    apiece on this CPU, four of them before the first evaluation).
    """

    init: Callable  # seed (uint32) -> state
    run_chunk: Callable  # state -> (state, metrics of the chunk's last update)
    evaluate: Callable  # (policies, seed, evaluation number (int32)) -> returns [(device,) S, eval_episodes]
    final_evaluate: Callable  # the same, over final_eval_episodes


def evaluation_on_mesh(evaluate_one_seed: Callable, mesh: Mesh, learners: bool) -> Callable:
    """(policies laid out as the state is, eval keys [S]) -> returns [(device,) S, episodes]."""
    if not learners:
        seeds = PartitionSpec(DEVICE_AXIS)
        return jax.jit(jax.shard_map(jax.vmap(evaluate_one_seed), mesh=mesh, in_specs=(seeds, seeds),
                                     out_specs=seeds, check_vma=False))
    devices, everywhere = PartitionSpec(DEVICE_AXIS), PartitionSpec()
    # the parameters are the same on every device, so every device evaluates with the same keys
    evaluate = lambda policies, keys: _stacked(jax.vmap(evaluate_one_seed)(_on_this_device(policies), keys))
    return jax.jit(jax.shard_map(evaluate, mesh=mesh, in_specs=(devices, everywhere), out_specs=devices,
                                 check_vma=False))


def seed_parallel_programs(algorithm: Algorithm, evaluate_one_seed: Callable, mesh: Mesh, num_updates: int) -> Programs:
    """Independent seeds split over the devices: state [seed, ...]."""
    seeds = PartitionSpec(DEVICE_AXIS)
    on_mesh = lambda fn, in_specs: jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=seeds, check_vma=False)
    chunk = lambda state: run_updates(algorithm, state, num_updates)
    return Programs(jax.jit(on_mesh(jax.vmap(algorithm.init), seeds)),
                    # check_vma=False: algorithms stay free of device-axis type annotations on their scan carries
                    jax.jit(on_mesh(chunk, seeds), donate_argnums=0),
                    evaluation_on_mesh(evaluate_one_seed, mesh, learners=False))


def learner_parallel_programs(algorithm: Algorithm, evaluate_one_seed: Callable, mesh: Mesh,
                              num_updates: int) -> Programs:
    """Every device runs every seed's learner and actors: state [device, seed, ...]."""
    devices, everywhere = PartitionSpec(DEVICE_AXIS), PartitionSpec()
    on_mesh = lambda fn, in_specs: jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=devices, check_vma=False)
    init = lambda keys: _stacked(jax.vmap(algorithm.init)(keys))
    chunk = lambda state: _stacked(run_updates(algorithm, _on_this_device(state), num_updates))
    return Programs(jax.jit(on_mesh(init, everywhere)), jax.jit(on_mesh(chunk, devices), donate_argnums=0),
                    evaluation_on_mesh(evaluate_one_seed, mesh, learners=True))


def policies_of(algorithm: Algorithm, state: Any) -> Any:
    """Every seed's policy (and every learner's copy of it), laid out as the state is; no copy is made."""
    policy = jax.vmap(algorithm.policy)
    return jax.vmap(policy)(state) if algorithm.parallel_learners else policy(state)


def per_seed(values: np.ndarray, learners: bool) -> np.ndarray:
    """Host values [seed, ...]: learner-parallel runs average their devices' actors and learners."""
    return values.mean(axis=0) if learners else values


def build(train: TrainConfig) -> tuple[Any, Any, Algorithm]:
    """The env and algorithm selected by a validated config (may raise ConfigError), an algorithm written as parts
    composed into its single program where the env is a JAX one."""
    env, env_params, algorithm = registry.build(train.env, train.algo)
    return env, env_params, composed(train.algo.name, algorithm, env, env_params)


def non_finite_seeds(metrics: dict, algorithm: Algorithm, learners: bool) -> list[tuple[str, int]]:
    """(metric, seed) pairs whose health metric is not finite although that seed's learner has started."""
    if not algorithm.health_metrics:
        return []
    reduce = (lambda x: x.max(axis=0)) if learners else (lambda x: x)  # any learner device
    started = reduce(np.asarray(metrics[algorithm.learner_steps]) > 0)
    return [(name, int(seed)) for name in algorithm.health_metrics
            for seed in np.flatnonzero(started & reduce(~np.isfinite(np.asarray(metrics[name]))))]


# (init, run_chunk, evaluate) on CPU: level 1 (0 for init, which runs once) builds faster than XLA's
# default 2 and run_chunk runs as fast; XLA's older LLVM emitters build init and evaluate in half the
# time (each fusion skips an MLIR pipeline), run_chunk keeps the newer, ~30% faster code. With XLA's
# defaults a CartPole run's four programs took 12.7 s (DQN) / 16.8 s (Ape-X), with these 6.0 / 9.6 s
# (bench/bench_compile.py, 10 seeds).
_OLD_EMITTERS = {"xla_cpu_use_fusion_emitters": False}
CPU_COMPILER_OPTIONS = ({"xla_backend_optimization_level": 0, **_OLD_EMITTERS}, {"xla_backend_optimization_level": 1},
                        {"xla_backend_optimization_level": 1, **_OLD_EMITTERS})


SEED, EVAL_INDEX = jax.ShapeDtypeStruct((), np.uint32), jax.ShapeDtypeStruct((), np.int32)


def compile_programs(algorithm: Algorithm, evaluate_one_seed: Callable, mesh: Mesh, updates_per_chunk: int,
                     num_seeds: int, before_compiling: Callable[[Any], None] = lambda abstract_state: None,
                     final_evaluate_one_seed: Optional[Callable] = None,
                     check_outputs: Callable[[Any, Any], None] = lambda abstract_state, abstract_metrics: None
                     ) -> SeededPrograms:
    """The run's programs for its layout, compiled ahead of time and side by side.

    `before_compiling(abstract_state)` may still refuse the run (ConfigError) at no compile cost, and so
    may `check_outputs(abstract_state, abstract_metrics)` (PluginError), once the chunk is traced.
    `final_evaluate_one_seed` (more episodes) gets its own program; None: the periodic one serves.
    """
    learners = algorithm.parallel_learners
    make = learner_parallel_programs if learners else seed_parallel_programs
    programs = make(algorithm, evaluate_one_seed, mesh, updates_per_chunk)
    seeded = lambda evaluate: jax.jit(lambda policies, seed, evaluation: evaluate(
        policies, run_keys(seed, evaluation, num_seeds)[1]))
    init_from_seed = jax.jit(lambda seed: programs.init(run_keys(seed, 0, num_seeds)[0]))
    evaluate_from_seed = seeded(programs.evaluate)
    final_from_seed = (seeded(evaluation_on_mesh(final_evaluate_one_seed, mesh, learners))
                       if final_evaluate_one_seed is not None else None)
    abstract_state = jax.eval_shape(init_from_seed, SEED)
    before_compiling(abstract_state)
    abstract_policies = jax.eval_shape(lambda state: policies_of(algorithm, state), abstract_state)
    init_options, chunk_options, evaluate_options = (CPU_COMPILER_OPTIONS if jax.default_backend() == "cpu"
                                                     else ({}, {}, {}))
    # XLA compiles outside the GIL: run_chunk, the longest build, starts first, and the others
    # are traced (Python) and built while it compiles
    with ThreadPoolExecutor(4) as pool:
        submit = lambda lowered, options: pool.submit(lowered.compile, compiler_options=options)
        chunk_lowered = programs.run_chunk.lower(abstract_state)
        check_outputs(abstract_state, chunk_lowered.out_info[1])
        chunk_build = submit(chunk_lowered, chunk_options)
        init_build = submit(init_from_seed.lower(SEED), init_options)
        evaluate_build = submit(evaluate_from_seed.lower(abstract_policies, SEED, EVAL_INDEX), evaluate_options)
        final_build = (submit(final_from_seed.lower(abstract_policies, SEED, EVAL_INDEX), evaluate_options)
                       if final_from_seed is not None else evaluate_build)
        return SeededPrograms(init_build.result(), chunk_build.result(), evaluate_build.result(), final_build.result())


def stop_if_diverged(metrics: dict, algorithm: Algorithm, learners: bool, nan_policy: str, env_steps: int) -> None:
    """A non-finite health metric stops the run (the state is not saved: the last checkpoint stays good) or warns."""
    for name, seed in non_finite_seeds(metrics, algorithm, learners):
        message = f"{name} is not finite for seed {seed} at env step {env_steps:,}"
        if nan_policy == "stop":
            raise TrainingDiverged(f"{message}; stopped (nan_policy=stop). The newest checkpoint, if any, "
                                   "is from before; set nan_policy=warn to only log it.")
        print(f"warning: {message} (nan_policy=warn)", file=sys.stderr, flush=True)


def counter_rates(record: dict, algorithm: Algorithm, train_seconds: float) -> dict:
    """The algorithm's cumulative counters as rates over the training seconds ("perf/<counter>_per_second")."""
    return {rate_name(counter): record[counter] / train_seconds for counter in algorithm.counters}


class Run(NamedTuple):
    """A compiled run: its programs, layout and sizes, and the evaluation calls the host loop makes."""

    programs: SeededPrograms
    algorithm: Algorithm
    mesh: Mesh
    seed: np.uint32
    num_seeds: int
    num_chunks: int
    env_steps_per_chunk: int
    compile_seconds: float

    @property
    def learners(self) -> bool:
        return self.algorithm.parallel_learners

    def policies(self, state: Any) -> Any:
        return policies_of(self.algorithm, state)

    def returns(self, policies: Any, evaluation: int, final: bool = False) -> np.ndarray:
        """Every seed's episode returns [S, episodes] (learners' copies agree; their mean is taken)."""
        program = self.programs.final_evaluate if final else self.programs.evaluate
        return per_seed(to_host(program(policies, self.seed, np.int32(evaluation))), self.learners)


def compile_run(train_cfg: TrainConfig, env: Any, env_params: Any, algorithm: Algorithm, run_dir: Path,
                checkpoints_kept: int) -> tuple[Run, Any]:
    """The run's layout and compiled programs, and its initial state."""
    num_seeds, learners = train_cfg.num_seeds, algorithm.parallel_learners
    mesh = make_mesh(num_seeds, learners, train_cfg.num_devices)
    # learners add their devices' actors to the population: every update steps all of their envs
    env_steps_per_update = algorithm.env_steps_per_update * (mesh.size if learners else 1)
    updates_per_chunk, num_chunks = chunk_updates(train_cfg, env_steps_per_update)
    evaluate_one_seed = make_evaluate(env, env_params, algorithm, train_cfg.eval_episodes)
    final_evaluate_one_seed = (make_evaluate(env, env_params, algorithm, train_cfg.final_eval_episodes)
                               if train_cfg.final_eval_episodes != train_cfg.eval_episodes else None)
    compile_start = time.time()
    fits = lambda abstract_state: check_fits(abstract_state, run_dir, checkpoints_kept, jax.default_backend() == "cpu",
                                             algorithm.memory)
    seed_dims = (mesh.size, num_seeds) if learners else (num_seeds,)
    observation = jax.eval_shape(lambda: env.reset_env(jax.random.key(0), env_params))[0]

    def outputs(abstract_state: Any, abstract_metrics: Any) -> None:
        one_seed = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape[len(seed_dims):], leaf.dtype),
                                abstract_state)
        check_outputs(train_cfg.algo.name, algorithm, abstract_metrics, seed_dims,
                      jax.eval_shape(algorithm.policy, one_seed), observation, env.action_space(env_params))

    programs = compile_programs(algorithm, evaluate_one_seed, mesh, updates_per_chunk, num_seeds, fits,
                                final_evaluate_one_seed, outputs)
    run_seed = np.uint32(train_cfg.seed)
    state = programs.init(run_seed)
    run = Run(programs, algorithm, mesh, run_seed, num_seeds, num_chunks, updates_per_chunk * env_steps_per_update,
              time.time() - compile_start)
    return run, state


def evaluate_finally(run: Run, state: Any, loop: RunLoop) -> tuple[np.ndarray, np.ndarray, Any]:
    """The result: each seed's final policy (where it was solved, or the one the run ends with) and its best, on the
    same final episodes: their returns [S, episodes] and the final policies (host arrays)."""
    ends_with = run.policies(state)
    final_policies = loop.final_policies(to_host(ends_with))
    final_returns = run.returns(to_devices(final_policies, ends_with), FINAL_EVALUATION, final=True)
    best_returns = run.returns(to_devices(loop.best.policies, ends_with), FINAL_EVALUATION, final=True)
    return final_returns, best_returns, final_policies


def train_single_program(train_cfg: TrainConfig, cfg: DictConfig, env: Any, env_params: Any, algorithm: Algorithm,
                         run_dir: Path, seconds: Callable[[], float], sweep_group: Optional[str] = None) -> dict:
    """Compile and run a JAX env's training; write metrics, summary, plots, policies and checkpoints into `run_dir`.

    Under several processes every process runs the same loop on its devices; the first one alone writes.
    """
    algorithm = composed(train_cfg.algo.name, algorithm, env, env_params)
    writer = is_writer()
    checkpointer = open_run_dir(train_cfg, cfg, run_dir)
    run, state = compile_run(train_cfg, env, env_params, algorithm, run_dir,
                             train_cfg.checkpoint.keep if checkpointer else 0)
    if not gc.isenabled():  # run.py pauses the collector through startup; its objects stay out of later scans
        gc.freeze()
        gc.enable()

    best = BestPolicies(to_host(run.policies(state)), seed_axis=1 if run.learners else 0)
    loop = RunLoop(train_cfg, cfg, run_dir, env, algorithm, seconds, sweep_group, checkpointer, best, writer,
                   env_params)
    state, _ = loop.resume(state)
    progress, history = loop.progress, loop.history
    stop, last, interrupted_by, latest_eval = StopRequest(), False, None, loop.latest_eval
    # a signal after the last chunk (final evaluation, writing) lets the run finish: its results are whole
    with stop, loop.logging():
        try:
            with ProgressBar(run.num_chunks * run.env_steps_per_chunk, train_cfg.progress and writer) as bar:
                for chunk in range(progress.chunks, run.num_chunks):
                    if history.all_solved:
                        break
                    chunk_start = time.time()
                    state, metrics = run.programs.run_chunk(state)
                    metrics = to_host(metrics)
                    previous = progress.env_steps
                    env_steps = previous + run.env_steps_per_chunk
                    stop_if_diverged(metrics, algorithm, run.learners, train_cfg.nan_policy, env_steps)
                    progress.train_seconds += time.time() - chunk_start
                    steps_per_second = run.num_seeds * env_steps / progress.train_seconds
                    last = chunk == run.num_chunks - 1
                    crossed = lambda every, now=env_steps, before=previous: every > 0 and now // every > before // every
                    progress.env_steps = env_steps
                    if crossed(train_cfg.log_every) or crossed(train_cfg.eval_every) or last:
                        record = loop.record(env_steps, metrics, steps_per_second)
                        record.update(counter_rates(record, algorithm, progress.train_seconds))
                        if crossed(train_cfg.eval_every) or last:
                            policies = run.policies(state)
                            # copied now where a seed improved: the next chunk donates the state's buffers
                            loop.evaluated(record, run.returns(policies, chunk).mean(axis=-1),
                                           lambda policies=policies: to_host(policies))
                            latest_eval = record["eval/return"]
                        loop.log(record)
                    bar.update(env_steps, steps_per_second, latest_eval)
                    progress.chunks = chunk + 1
                    if stop.requested or (loop.checkpointer is not None and (crossed(train_cfg.checkpoint.every) or last
                                                                        or history.all_solved)):
                        loop.checkpoint(env_steps, state)
                    if stop.requested:
                        interrupted_by = None if last else stop.signal.name
                        break
            final_returns, best_returns, final_policies = evaluate_finally(run, state, loop)
            summary = loop.summarize(final_returns, best_returns, run.compile_seconds, run.mesh.size, interrupted_by)
        finally:
            loop.close()

    on_first_learner = _on_this_device if run.learners else (lambda tree: tree)
    loop.write_results(summary, on_first_learner(final_policies), on_first_learner(best.policies))
    if algorithm.save_artifacts is not None:
        final_state = to_host(state)
        if writer:
            algorithm.save_artifacts(_on_this_device(final_state) if run.learners else final_state, run_dir)
    loop.closing_lines(summary)
    return summary
