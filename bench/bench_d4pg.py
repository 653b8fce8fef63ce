"""D4PG on Pendulum-v1 beside stable-baselines3's TD3 and SAC (rl-zoo's settings), under one protocol: each run's
final 100-episode deterministic evaluation per seed, the IQM of the finals with its 95% stratified-bootstrap CI, and
the wall-clock of each, measured one after the other on this machine.

    python bench/bench_d4pg.py                              # both shapes, 10 seeds on seed=2027; TD3 and SAC, 1 seed
    python bench/bench_d4pg.py --shapes gymnax --seed 5150 --sb3-seeds 3

Shapes (20,000 env steps per seed, as rl-zoo's Pendulum runs; evaluations every 2,000):
  gymnax      the single program: env=gymnax env.id=Pendulum-v1, every seed in one compiled program
  gymnasium   actor threads: env=gymnasium env.id=Pendulum-v1, every seed's envs stepped by gymnasium

"done [s]" is a whole lightspeed launch to its end, every seed's final evaluation written (compilation included);
an SB3 seed's "first >= -200 [s]" is from its launch to its first periodic evaluation (16 episodes) at or above
-200. The issue's bar: ten lightspeed seeds done before one TD3 seed first reaches -200.
"""
import argparse
import sys

import numpy as np
from shared import final_iqm, format_value, print_machine, print_table, run_sb3, run_to_solve

TARGET = -200.0
RUN = ["algo=d4pg", "env.id=Pendulum-v1", "total_env_steps=20000", "eval_every=2000", "log_every=2000"]
SHAPES = {"gymnax": ["env=gymnax"], "gymnasium": ["env=gymnasium"]}
HEADER = ["run", "seeds", "final IQM [95% CI]", "final min", f"finals >= {TARGET:.0f}", "env steps",
          "first >= -200 [s]", "done [s]"]


def lightspeed_row(shape: str, seed: int, seeds: int) -> tuple[list[str], float]:
    result = run_to_solve(*RUN, *SHAPES[shape], f"seed={seed}", f"num_seeds={seeds}")
    finals = [s["final_eval_return"] for s in result["summary"]["seeds"]]
    print(f"d4pg {shape}: finals {' '.join(f'{f:.1f}' for f in finals)}", flush=True)
    return ([f"lightspeed d4pg, {shape}", str(seeds), final_iqm(finals), f"{min(finals):.1f}",
             f"{sum(f >= TARGET for f in finals)}/{len(finals)}", f"{result['summary']['env_steps']:,}", "-",
             f"{result['process_seconds']:.1f}"], result["process_seconds"])


def sb3_row(algo: str, seed: int) -> tuple[list[str], dict]:
    result = run_sb3("Pendulum-v1", seed, TARGET, eval_every=2000, algo=algo)
    final = result["final_eval_return"]
    return ([f"stable-baselines3 rl-zoo {algo}, seed {seed}", "1", f"{final:.1f}", f"{final:.1f}",
             f"{int(final >= TARGET)}/1", f"{result['env_steps']:,}",
             format_value(result["first_solve_seconds"], ".1f", "never"), f"{result['wall_seconds']:.1f}"], result)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--seed", type=int, default=2027, help="lightspeed's seed base (never tuned on)")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--sb3-seeds", type=int, default=1, help="seeds of TD3 and of SAC (0: none)")
    args = parser.parse_args(argv)
    print_machine("D4PG on Pendulum-v1 beside stable-baselines3")
    rows, done = [], {}
    for shape in args.shapes:
        row, done[shape] = lightspeed_row(shape, args.seed, args.seeds)
        rows.append(row)
    td3_first = []
    for algo in ("TD3", "SAC"):
        for seed in range(args.sb3_seeds):
            row, result = sb3_row(algo, seed)
            rows.append(row)
            if algo == "TD3":
                td3_first.append(result["first_solve_seconds"])
    print_table(f"Pendulum-v1, {TARGET:.0f} the bar; lightspeed seed={args.seed}", HEADER, rows)
    if td3_first:
        reached = [t for t in td3_first if t is not None]
        first = float(np.min(reached)) if reached else None
        for shape, seconds in done.items():
            verdict = ("never reached -200" if first is None else
                       f"{'before' if seconds < first else 'after'} the first TD3 seed reached -200 ({first:.1f} s)")
            print(f"   {args.seeds} lightspeed seeds ({shape}) done in {seconds:.1f} s: {verdict}")


if __name__ == "__main__":
    main(sys.argv[1:])
