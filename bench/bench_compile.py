"""Compile time and run speed of the trainer's programs under XLA CPU backend optimisation levels.

    python bench/bench_compile.py [--seeds 10] [--rounds 6] [--launches 2]

1. For DQN and Ape-X (what `run.py algo=<dqn|apex> env=cartpole num_seeds=10` builds: the conf/
   defaults and the run's updates per chunk): seconds of `framework.anakin.trainer.compile_programs`
   (trace, lower and build `init`, `run_chunk` and the periodic and final `evaluate`, side by side
   in threads, as a run does) in a fresh process, with
   XLA's default options for every program and with the trainer's `CPU_COMPILER_OPTIONS`
   (`xla_backend_optimization_level` 0 for `init`, which runs once, and 1 for the others; XLA's
   older emitters for `init` and `evaluate`).
   Launches alternate between the two so both see the same machine load.
2. `run_chunk` at levels 1 and 2 (XLA's default), timed in interleaved rounds from the same initial
   state (median of the rounds after two warm-up calls; the metrics come back to the host every call).
"""
import argparse
import subprocess
import sys
import time

import numpy as np
from shared import REPO_ROOT, format_rate, print_machine, print_table


def run_setup(name: str, num_seeds: int):
    """What `python run.py algo=NAME env=cartpole num_seeds=N` builds: the algorithm with its conf/
    defaults, its periodic and final evaluations, and its updates per chunk."""
    sys.path.insert(0, str(REPO_ROOT))
    from lightspeed.framework.anakin.trainer import build
    from lightspeed.framework.app.cli import check_composes
    from lightspeed.framework.core.config import chunk_updates, register_schemas, validated
    from lightspeed.framework.core.evaluation import make_evaluate
    from lightspeed.framework.core.registry import load_plugins

    load_plugins()
    register_schemas()
    train = validated(check_composes([f"algo={name}", "env=cartpole", f"num_seeds={num_seeds}"]))
    env, env_params, algorithm = build(train)
    updates_per_chunk, _ = chunk_updates(train, algorithm.env_steps_per_update)
    evaluations = [make_evaluate(env, env_params, algorithm, episodes)
                   for episodes in (train.eval_episodes, train.final_eval_episodes)]
    return algorithm, *evaluations, updates_per_chunk


def run_chunk_at(name: str, num_seeds: int, levels: tuple[int, ...]):
    """The algorithm, its updates per chunk, its initial state and its run_chunk built at each backend level."""
    import jax

    sys.path.insert(0, str(REPO_ROOT))
    from lightspeed.framework.anakin.trainer import learner_parallel_programs, seed_parallel_programs
    from lightspeed.framework.core.devices import make_mesh

    algorithm, evaluate_one_seed, _, updates_per_chunk = run_setup(name, num_seeds)
    make_programs = learner_parallel_programs if algorithm.parallel_learners else seed_parallel_programs
    programs = make_programs(algorithm, evaluate_one_seed, make_mesh(num_seeds, algorithm.parallel_learners, 1),
                             updates_per_chunk)
    keys = jax.random.split(jax.random.key(0), num_seeds)
    lowered = programs.run_chunk.lower(jax.eval_shape(programs.init, keys))
    chunks = {level: lowered.compile(compiler_options={"xla_backend_optimization_level": level}) for level in levels}
    return algorithm, updates_per_chunk, programs.init(keys), chunks


OPTION_SETS = {"XLA default (level 2) for all": ({}, {}, {}),
               "trainer's CPU_COMPILER_OPTIONS": None}  # levels 0 / 1 / 1, older emitters for init and evaluate


def compile_launch(name: str, option_set: str, num_seeds: int) -> float:
    """Seconds of the trainer's compile_programs in a fresh process."""
    child = subprocess.run([sys.executable, __file__, "--worker", name, option_set, "--seeds", str(num_seeds)],
                           check=True, capture_output=True, text=True)
    return float(child.stdout.strip().splitlines()[-1])


def compile_worker(name: str, option_set: str, num_seeds: int) -> None:
    sys.path.insert(0, str(REPO_ROOT))
    from lightspeed.framework.anakin import trainer
    from lightspeed.framework.core.devices import make_mesh

    if OPTION_SETS[option_set] is not None:
        trainer.CPU_COMPILER_OPTIONS = OPTION_SETS[option_set]
    algorithm, evaluate_one_seed, final_evaluate_one_seed, updates_per_chunk = run_setup(name, num_seeds)
    start = time.perf_counter()
    trainer.compile_programs(algorithm, evaluate_one_seed, make_mesh(num_seeds, algorithm.parallel_learners, 1),
                             updates_per_chunk, num_seeds, final_evaluate_one_seed=final_evaluate_one_seed)
    print(time.perf_counter() - start)


def speed_rows(name: str, num_seeds: int, rounds: int) -> list[list[str]]:
    """run_chunk at levels 1 and 2, timed in interleaved rounds from the same initial state."""
    import jax

    timed_levels = (1, 2)
    algorithm, updates_per_chunk, initial, chunks = run_chunk_at(name, num_seeds, timed_levels)
    states = {level: jax.tree.map(lambda x: x.copy(), initial) for level in timed_levels}
    times = {level: [] for level in timed_levels}
    for round_index in range(rounds + 2):  # interleaved, so both levels see the same machine load
        for level in timed_levels:
            start = time.perf_counter()
            states[level], metrics = chunks[level](states[level])
            loss = float(np.nanmean(jax.device_get(metrics["train/loss"])))
            if round_index >= 2:
                times[level].append(time.perf_counter() - start)
    assert np.isfinite(loss), "the learners must have trained"
    env_steps = updates_per_chunk * algorithm.env_steps_per_update * num_seeds
    return [[f"{name} ({updates_per_chunk} updates per chunk), level {level}",
             format_rate(env_steps / float(np.median(times[level]))),
             f"{float(np.median(times[level])) * 1e3:.0f}"] for level in timed_levels]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--launches", type=int, default=2, help="fresh processes per algorithm and option set")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        compile_worker(args.worker[0], args.worker[1], args.seeds)
        return
    print_machine("lightspeed compile-time benchmark")
    names = ("dqn", "apex")
    seconds = {(name, option_set): [] for name in names for option_set in OPTION_SETS}
    for _ in range(args.launches):
        for name, option_set in seconds:
            seconds[name, option_set].append(compile_launch(name, option_set, args.seeds))
    print_table(f"1. Seconds to build a run's four programs ({args.seeds} seeds; fresh process per launch)",
                ["algorithm, options", "launches [s]", "best [s]"],
                [[f"{name}, {option_set}", ", ".join(f"{t:.2f}" for t in times), f"{min(times):.2f}"]
                 for (name, option_set), times in seconds.items()])
    print_table(f"2. run_chunk speed (a run's chunk of {args.seeds} seeds per call, median of "
                f"{args.rounds} interleaved rounds)", ["algorithm, level", "env steps/s", "ms per call"],
                [row for name in names for row in speed_rows(name, args.seeds, args.rounds)])


if __name__ == "__main__":
    main()
