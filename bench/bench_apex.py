"""Ape-X on this machine: throughput over actor populations and devices, and launch-to-solved next to DQN.

    python bench/bench_apex.py [--devices 1 2] [--seeds 10] [--seed 0] [--sb3-seeds 3] [--skip-sb3]
                               [--skip-solve] [--skip-throughput]

1. Throughput: the trainer's learner-parallel program (`run_chunk`, K iterations in one scan),
   CartPole, Ape-X's defaults (a dueling 64x64 MLP with LayerNorm, 5-step returns) but learner
   batches of 512, replay of 100k per device. Every iteration each of the actors' envs steps
   `rollout_length` times and each device's learner takes `updates` prioritised batches; the
   loss comes back to the host, so no work can be deleted. Devices > 1 are forced CPU devices
   (XLA_FLAGS) sharing the same cores.
   References: the Ape-X paper's whole-cluster rates (360 actors on 376 cores and a GPU, about
   50K env frames/s and 19 batches of 512/s) and RLlib 2.8.1's Ape-X on this 2-core CPU (its tuned
   CartPole example with 4 workers x 8 envs and training_intensity 8: 560 env steps/s and 8.4 batches of
   512/s, measured by bench/bench_ray.py on 2026-12-03; issue 27 had read 0.9-1.0k env steps/s with 3 workers,
   a helper 248-318 with 3 workers x 1 env).
2. Solve, under the evaluation protocol: `run.py algo=apex env=cartpole num_seeds=10` and the same
   with `algo=dqn` (each with its defaults) in this bench run, as bench_dqn.py measures DQN: launch
   to every seed sustained-solved (3 evaluations in a row >= 475) cold and relaunched with a filled
   compilation cache, then the default-length run's final 100-episode greedy return (IQM, 95% CI)
   and stability; stable-baselines3's rl-zoo DQN under the same protocol beside them.
"""
import argparse
import json
import os
import subprocess
import sys
import time

from shared import REPO_ROOT, format_rate, print_machine, print_protocol_table, print_table

# (num_actors, envs_per_actor, rollout_length, learner batches of 512 per iteration and device)
POPULATIONS = ((8, 4, 8, 1), (16, 16, 8, 1), (32, 16, 8, 1), (16, 16, 8, 4), (64, 16, 8, 4))
CALLS_PER_ROUND, ROUNDS = 3, 3
PAPER_ENV_STEPS, PAPER_BATCHES = 50_000, 19
RLLIB_ENV_STEPS, RLLIB_BATCHES = 560, 8.4  # bench_ray.py's run of 2026-12-03 (bench/README.md)
TARGET = 475.0


def measure(num_devices: int, num_actors: int, envs_per_actor: int, rollout_length: int, updates: int) -> dict:
    """Best-of-rounds env steps/s and learner batches/s of one population on `num_devices` learners."""
    import jax
    import numpy as np

    sys.path.insert(0, str(REPO_ROOT))
    from lightspeed.algorithms.apex import ApexConfig, make_apex
    from lightspeed.envs import make
    from lightspeed.framework.anakin.compose import single_program
    from lightspeed.framework.anakin.trainer import learner_parallel_programs
    from lightspeed.framework.core.devices import make_mesh
    from lightspeed.framework.core.evaluation import make_evaluate

    env, env_params = make("cartpole")
    config = ApexConfig(num_actors=num_actors, envs_per_actor=envs_per_actor, rollout_length=rollout_length,
                        batch_size=512, learner_updates_per_iteration=updates, learning_starts=512)
    algorithm = single_program(make_apex(config, env, env_params), env, env_params)
    env_steps_per_iteration = num_devices * algorithm.env_steps_per_update
    iterations = max(4, 40_000 // env_steps_per_iteration)  # one call: about 40k env steps
    programs = learner_parallel_programs(algorithm, make_evaluate(env, env_params, algorithm, 1),
                                         make_mesh(1, True, num_devices), iterations)
    state = programs.init(jax.random.split(jax.random.key(0), 1))
    run_chunk = programs.run_chunk.lower(state).compile()
    state, metrics = run_chunk(state)  # fills replay past learning_starts
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(CALLS_PER_ROUND):
            state, metrics = run_chunk(state)
            loss = float(np.mean(jax.device_get(metrics["train/loss"])))
        best = min(best, time.perf_counter() - start)
    assert np.isfinite(loss), "the learner must have trained"
    total_iterations = CALLS_PER_ROUND * iterations
    return {"devices": num_devices, "actors": num_devices * num_actors,
            "envs": num_devices * num_actors * envs_per_actor,
            "rollout": rollout_length, "updates": updates,
            "env_steps_per_second": total_iterations * env_steps_per_iteration / best,
            "batches_per_second": total_iterations * updates * num_devices / best,
            "replay_ratio": updates * 512 / algorithm.env_steps_per_update}


def throughput_on(num_devices: int) -> list[dict]:
    """Every population, in a child process that sees `num_devices` forced CPU devices."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={num_devices}".strip()
    child = subprocess.run([sys.executable, __file__, "--worker", str(num_devices)], cwd=REPO_ROOT, check=True,
                           capture_output=True, text=True, env={**os.environ, "XLA_FLAGS": flags})
    return [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]


def print_throughput(results: list[dict]) -> None:
    rows = [[f"{r['devices']} device{'s' if r['devices'] > 1 else ''}, "
             f"{r['actors']} actors x {r['envs'] // r['actors']} envs",
             f"{r['rollout']}", f"{r['updates']}", f"{r['replay_ratio']:.2f}", format_rate(r["env_steps_per_second"]),
             f"{r['batches_per_second']:,.1f}",
             "yes" if (r["env_steps_per_second"] >= PAPER_ENV_STEPS
                       and r["batches_per_second"] >= PAPER_BATCHES) else "no"]
            for r in results]
    rows += [["Ape-X paper, whole cluster (376 cores + GPU)", "", "", "", format_rate(PAPER_ENV_STEPS),
              f"{PAPER_BATCHES}", ""],
             ["RLlib 2.8.1 Ape-X, this CPU, 4 workers x 8 envs", "", "", "", format_rate(RLLIB_ENV_STEPS),
              f"{RLLIB_BATCHES}", ""]]
    print_table("1. Ape-X throughput on CartPole, the default network (dueling 64x64 MLP, LayerNorm), learner batch "
                "512 (best of 3 rounds)",
                ["population", "rollout", "batches/iter", "samples per env step", "env steps/s",
                 "batches of 512/s", ">= paper"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2], help="learner device counts (forced CPU)")
    parser.add_argument("--seeds", type=int, default=10, help="seeds of the solve comparison, vmapped in one run")
    parser.add_argument("--seed", type=int, default=0, help="seed base of the solve comparison")
    parser.add_argument("--sb3-seeds", type=int, default=3)
    parser.add_argument("--skip-sb3", action="store_true")
    parser.add_argument("--skip-solve", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        for population in POPULATIONS:
            print(json.dumps(measure(args.worker, *population)), flush=True)
        return

    print_machine("lightspeed Ape-X benchmark")
    if not args.skip_throughput:
        print_throughput([row for count in args.devices for row in throughput_on(count)])
    if args.skip_solve:
        return
    overrides = (f"num_seeds={args.seeds}", f"seed={args.seed}", "env=cartpole")
    configurations = {f"lightspeed {label}, {args.seeds} seeds in one process": (f"algo={algo}", *overrides)
                      for label, algo in (("Ape-X", "apex"), ("DQN", "dqn"))}  # each with its defaults
    numbers = print_protocol_table(f"2. CartPole-v1: sustained solve (3 evaluations in a row >= {TARGET:.0f}) and the "
                                   "final 100-episode greedy return", configurations, TARGET,
                                   0 if args.skip_sb3 else args.sb3_seeds)
    apex, dqn = (numbers[label]["cold"] for label in configurations)
    if apex is not None and dqn is not None:
        print(f"   Ape-X / DQN, launch to every seed sustained-solved: {apex / dqn:.2f}x")


if __name__ == "__main__":
    main()
