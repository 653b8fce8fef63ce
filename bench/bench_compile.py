"""Compile time and run speed of the trainer's programs at each XLA CPU backend optimisation level.

    python bench/bench_compile.py [--seeds 10] [--rounds 6]

For DQN and Ape-X (their defaults, CartPole, 10 seeds in one program, 20 updates per chunk) it
builds the trainer's three programs (`init`, `run_chunk`, `evaluate`) with
`xla_backend_optimization_level` 0, 1 and 2 (2 is XLA's default), one after the other on an
otherwise idle machine, and reports seconds to compile each. Then it times `run_chunk` at levels
1 and 2 in interleaved rounds from the same initial state (median of the rounds after two warm-up
calls; the metrics come back to the host every call). The trainer uses level 0 for `init` (it
runs once) and level 1 for the others (`framework.trainer.CPU_COMPILER_OPTIONS`).
"""
import argparse
import sys
import time

import numpy as np

from shared import REPO_ROOT, format_rate, print_machine, print_table

LEVELS = (0, 1, 2)
UPDATES_PER_CHUNK = 20


def programs_of(name: str, num_seeds: int):
    import jax

    sys.path.insert(0, str(REPO_ROOT))
    from algorithms.apex import ApexConfig, make_apex
    from algorithms.dqn import DQNConfig, make_dqn
    from envs import make
    from framework.evaluation import make_evaluate
    from framework.parallel import make_mesh
    from framework.trainer import learner_parallel_programs, seed_parallel_programs

    env, env_params = make("cartpole")
    algorithm = (make_apex(ApexConfig(), env, env_params) if name == "apex" else make_dqn(DQNConfig(), env, env_params))
    make_programs = learner_parallel_programs if algorithm.parallel_learners else seed_parallel_programs
    programs = make_programs(algorithm, make_evaluate(env, env_params, algorithm.act, 16),
                             make_mesh(num_seeds, algorithm.parallel_learners, 1), UPDATES_PER_CHUNK)
    keys = jax.random.split(jax.random.key(0), num_seeds)
    abstract_state = jax.eval_shape(programs.init, keys)
    lowered = {"init": programs.init.lower(keys), "run_chunk": programs.run_chunk.lower(abstract_state),
               "evaluate": programs.evaluate.lower(abstract_state, keys)}
    return algorithm, programs, keys, lowered


def compile_seconds(lowered, level: int) -> tuple[float, object]:
    start = time.perf_counter()
    compiled = lowered.compile(compiler_options={"xla_backend_optimization_level": level})
    return time.perf_counter() - start, compiled


def measure(name: str, num_seeds: int, rounds: int) -> tuple[list[list[str]], list[list[str]]]:
    import jax

    algorithm, programs, keys, lowered = programs_of(name, num_seeds)
    compile_rows, chunks = [], {}
    for level in LEVELS:
        seconds = {}
        for program, lowered_program in lowered.items():
            seconds[program], compiled = compile_seconds(lowered_program, level)
            if program == "run_chunk":
                chunks[level] = compiled
        compile_rows.append([f"{name}, level {level}{' (XLA default)' if level == 2 else ''}",
                             *(f"{seconds[p]:.2f}" for p in lowered), f"{sum(seconds.values()):.2f}"])

    initial = programs.init(keys)
    timed_levels = (1, 2)
    states = {level: jax.tree.map(lambda x: x.copy(), initial) for level in timed_levels}
    times = {level: [] for level in timed_levels}
    for round_index in range(rounds + 2):  # interleaved, so both levels see the same machine load
        for level in timed_levels:
            start = time.perf_counter()
            states[level], metrics = chunks[level](states[level])
            loss = float(np.nanmean(jax.device_get(metrics["train/loss"])))
            if round_index >= 2:
                times[level].append(time.perf_counter() - start)
    env_steps = UPDATES_PER_CHUNK * algorithm.env_steps_per_update * num_seeds
    speed_rows = [[f"{name}, level {level}", format_rate(env_steps / float(np.median(times[level]))),
                   f"{float(np.median(times[level])) * 1e3:.0f}"] for level in timed_levels]
    assert np.isfinite(loss), "the learners must have trained"
    return compile_rows, speed_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    print_machine("lightspeed compile-time benchmark")
    compile_rows, speed_rows = [], []
    for name in ("dqn", "apex"):
        rows = measure(name, args.seeds, args.rounds)
        compile_rows += rows[0]
        speed_rows += rows[1]
    print_table(f"1. Seconds to compile each program ({args.seeds} seeds, one at a time)",
                ["algorithm, xla_backend_optimization_level", "init", "run_chunk", "evaluate", "all"], compile_rows)
    print_table(f"2. run_chunk speed ({UPDATES_PER_CHUNK} updates of {args.seeds} seeds per call, median of "
                f"{args.rounds} interleaved rounds)", ["algorithm, level", "env steps/s", "ms per call"], speed_rows)


if __name__ == "__main__":
    main()
