"""Does the README's main command hold on seeds never tuned on? `python run.py seed=S` (Ape-X on CartPole-v1, the
defaults) once per seed, each its own process as a user runs it, then the final 100-episode greedy return of each.

    python bench/bench_main_command.py                      # seeds 4700 .. 4729 (4711 failed at 458.9 on 2026-12-03)
    python bench/bench_main_command.py --first 5000 --count 30 -- algo.lr=0.0005   # more overrides after --

Prints a row per seed (final, best policy's, solved at, wall seconds) and the summary: how many end >= 475, the
minimum, the IQM with its 95% CI. The compilation cache is shared across the runs (the first compiles).
"""
import argparse
import sys
import tempfile

from shared import final_iqm, print_table, run_to_solve

SOLVED = 475.0  # CartPole-v1's threshold


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first", type=int, default=4700, help="the first seed")
    parser.add_argument("--count", type=int, default=30, help="how many consecutive seeds")
    parser.add_argument("overrides", nargs="*", help="run.py overrides added to every run (after --)")
    args = parser.parse_args(argv)
    cache = tempfile.mkdtemp(prefix="bench_main_cache_")
    rows, finals = [], []
    for seed in range(args.first, args.first + args.count):
        result = run_to_solve(f"seed={seed}", *args.overrides, compilation_cache=cache)
        seed_result = result["summary"]["seeds"][0]
        finals.append(seed_result["final_eval_return"])
        solved_at = seed_result["solved_at_env_steps"]
        rows.append([str(seed), f"{finals[-1]:.1f}", f"{seed_result['best_policy_eval_return']:.1f}",
                     "-" if solved_at is None else f"{solved_at:,}", f"{result['process_seconds']:.1f}"])
        print(f"seed {seed}: final {finals[-1]:.1f}", flush=True)
    print_table(f"python run.py seed=S {' '.join(args.overrides)}".rstrip(),
                ["seed", "final", "best policy", "solved at", "wall [s]"], rows)
    print(f"\n{sum(f >= SOLVED for f in finals)}/{len(finals)} seeds end >= {SOLVED:g}; min {min(finals):.1f}; "
          f"final IQM [95% CI] {final_iqm(finals)}")


if __name__ == "__main__":
    main(sys.argv[1:])
