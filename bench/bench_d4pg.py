"""D4PG beside stable-baselines3's TD3 and SAC (rl-zoo's settings), under one protocol: each run's final 100-episode
deterministic evaluation per seed, the IQM of the finals with its 95% stratified-bootstrap CI, and the wall-clock of
each, measured one after the other on this machine.

    python bench/bench_d4pg.py                              # Pendulum: both shapes, 10 seeds on seed=2027; TD3, SAC
    python bench/bench_d4pg.py --shapes gymnax --seed 5150 --sb3-seeds 3
    python bench/bench_d4pg.py --task halfcheetah           # MuJoCo HalfCheetah-v5, 3 seeds; TD3 and SAC, 1 seed
    python bench/bench_d4pg.py --task hopper --sb3-seeds 0  # MuJoCo Hopper-v5, 3 seeds, lightspeed alone
    python bench/bench_d4pg.py --task halfcheetah --shapes none --sb3-budget env-steps --sb3-algos TD3
                                                            # TD3 alone, 300,000 env steps (lightspeed's budget)

Tasks:
  pendulum     Pendulum-v1, 20,000 env steps per seed (rl-zoo's budget), evaluations every 2,000; shapes
               gymnax (the single program, every seed in one compiled program) and gymnasium (actor threads).
               The issue's bar: every final >= -200, ten seeds done before one TD3 seed first reaches -200.
  halfcheetah  HalfCheetah-v5 through gymnasium[mujoco] (actor threads), 300,000 env steps per seed (HALFCHEETAH's
               settings), evaluations every 50,000. TD3 and SAC (the zoo's MuJoCo settings, 1M steps) train for
               at most lightspeed's whole wall-clock, then evaluate: the same wall-clock, not the same env steps
               (`--sb3-budget env-steps`: for lightspeed's 300,000 env steps, however long that takes).
  hopper       Hopper-v5 as halfcheetah, with a support for Hopper's returns (HOPPER): its episodes end where the
               hopper falls, so a seed's return says how long it stays up as well as how fast it moves.

"done [s]" is a whole launch to its end, every seed's final evaluation written (compilation included); an SB3 seed's
"first >= bar [s]" is from its launch to its first periodic evaluation (16 episodes) at or above the bar.
"""
import argparse
import sys
from typing import NamedTuple, Optional

import numpy as np
from shared import final_iqm, format_value, print_machine, print_table, run_sb3, run_to_solve

# HalfCheetah on 2 cores: D4PGConfig's 256x256 nets and batches of 256 at discount 0.99 (not the Pendulum yaml's),
# a support that holds its discounted returns (about 100 x a reward of -1 .. 10 per step), a learner batch per 4 env
# steps (4 updates per iteration of 4 actors x 4 steps) so that 3 seeds x 300k steps fit in about 25 minutes,
# and 10,000 steps of replay before the first batch, as the zoo's TD3 and SAC
HALFCHEETAH_SUPPORT = ("algo.discount=0.99", "algo.v_min=-200", "algo.v_max=1200")
MUJOCO_ON_2_CORES = ("algo.batch_size=256", "algo.policy_hidden_sizes=[256,256]", "algo.critic_hidden_sizes=[256,256]",
                     "algo.learner_updates_per_iteration=4", "algo.learning_starts=10000", "algo.buffer_size=300000",
                     "log_every=10000", "eval_episodes=10")
HALFCHEETAH = (*HALFCHEETAH_SUPPORT, *MUJOCO_ON_2_CORES)
# Hopper: the same on a support for its discounted returns (a reward of about 1 for staying up plus the forward
# speed, ~3 a step at best: 0.99-discounted sums up to ~300; a fall ends the episode, so never far below 0)
HOPPER = ("algo.discount=0.99", "algo.v_min=-50", "algo.v_max=450", *MUJOCO_ON_2_CORES)


class Task(NamedTuple):
    env_id: str
    bar: Optional[float]  # the return every final is counted against (None: report only)
    env_steps: int
    eval_every: int
    overrides: tuple[str, ...]  # run.py's, beyond algo, env and the run length
    shapes: tuple[str, ...]
    seeds: int
    sb3_same_wall_clock: bool  # SB3 trains for lightspeed's wall-clock by default (else for rl-zoo's env steps)


TASKS = {"pendulum": Task("Pendulum-v1", -200.0, 20_000, 2_000, (), ("gymnax", "gymnasium"), 10, False),
         "halfcheetah": Task("HalfCheetah-v5", None, 300_000, 50_000, HALFCHEETAH, ("gymnasium",), 3, True),
         "hopper": Task("Hopper-v5", None, 300_000, 50_000, HOPPER, ("gymnasium",), 3, True)}
HEADER = ["run", "seeds", "final IQM [95% CI]", "final min", "finals >= bar", "env steps", "first >= bar [s]",
          "done [s]"]


def lightspeed_row(task: Task, shape: str, seed: int, seeds: int) -> tuple[list[str], float]:
    result = run_to_solve("algo=d4pg", f"env={shape}", f"env.id={task.env_id}", f"total_env_steps={task.env_steps}",
                          f"eval_every={task.eval_every}", *task.overrides, f"seed={seed}", f"num_seeds={seeds}")
    finals = [s["final_eval_return"] for s in result["summary"]["seeds"]]
    print(f"d4pg {shape}: finals {' '.join(f'{f:.1f}' for f in finals)}", flush=True)
    seconds = result["process_seconds"]
    return ([f"lightspeed d4pg, {shape}", str(seeds), final_iqm(finals), f"{min(finals):.1f}",
             count_at_bar(finals, task), f"{result['summary']['env_steps']:,}", "-", f"{seconds:.1f}"], seconds)


def count_at_bar(finals: list[float], task: Task) -> str:
    return "-" if task.bar is None else f"{sum(f >= task.bar for f in finals)}/{len(finals)}"


def sb3_row(task: Task, algo: str, seed: int, max_seconds: Optional[float],
            env_steps: Optional[int]) -> tuple[list[str], dict]:
    result = run_sb3(task.env_id, seed, task.bar, eval_every=task.eval_every, algo=algo, max_seconds=max_seconds,
                     env_steps=env_steps)
    final = result["final_eval_return"]
    print(f"{algo} seed {seed}: final {final:.1f} after {result['env_steps']:,} env steps", flush=True)
    return ([f"stable-baselines3 rl-zoo {algo}, seed {seed}", "1", f"{final:.1f}", f"{final:.1f}",
             count_at_bar([final], task), f"{result['env_steps']:,}",
             "-" if task.bar is None else format_value(result["first_solve_seconds"], ".1f", "never"),
             f"{result['wall_seconds']:.1f}"], result)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="pendulum", choices=list(TASKS))
    parser.add_argument("--shapes", nargs="+", choices=["gymnax", "gymnasium", "none"],
                        help="lightspeed's shapes (default: the task's; none: SB3 alone)")
    parser.add_argument("--seed", type=int, default=2027, help="lightspeed's seed base (never tuned on)")
    parser.add_argument("--seeds", type=int, help="lightspeed's seeds (default: the task's)")
    parser.add_argument("--sb3-seeds", type=int, default=1, help="seeds of TD3 and of SAC (0: none)")
    parser.add_argument("--sb3-algos", nargs="+", default=["TD3", "SAC"], choices=["TD3", "SAC"])
    parser.add_argument("--sb3-budget", choices=["wall-clock", "env-steps"],
                        help="SB3 trains for lightspeed's wall-clock or for its env steps (default: the task's; "
                             "wall-clock needs a lightspeed shape run first)")
    args = parser.parse_args(argv)
    task = TASKS[args.task]
    seeds = args.seeds or task.seeds
    print_machine(f"D4PG on {task.env_id} beside stable-baselines3", open_devices=False)
    rows, done = [], {}
    shapes = [shape for shape in args.shapes or task.shapes if shape != "none"]
    same_wall_clock = (args.sb3_budget or ("wall-clock" if task.sb3_same_wall_clock else "env-steps")) == "wall-clock"
    if same_wall_clock and not shapes and args.sb3_seeds:
        parser.error("--sb3-budget wall-clock needs lightspeed's wall-clock: run a shape, or --sb3-budget env-steps")
    for shape in shapes:
        row, done[shape] = lightspeed_row(task, shape, args.seed, seeds)
        rows.append(row)
    max_seconds = max(done.values()) if same_wall_clock and done else None
    sb3_env_steps = None if same_wall_clock else task.env_steps  # Pendulum's are rl-zoo's too
    td3_first = []
    for algo in args.sb3_algos:
        for seed in range(args.sb3_seeds):
            row, result = sb3_row(task, algo, seed, max_seconds, sb3_env_steps)
            rows.append(row)
            if algo == "TD3":
                td3_first.append(result["first_solve_seconds"])
    bar = "" if task.bar is None else f", {task.bar:.0f} the bar"
    budget = f"; SB3 trains for at most {max_seconds:.0f} s, then evaluates" if max_seconds else ""
    print_table(f"{task.env_id}{bar}; lightspeed seed={args.seed}{budget}", HEADER, rows)
    reached = [t for t in td3_first if t is not None]
    if task.bar is not None and td3_first:
        first = float(np.min(reached)) if reached else None
        for shape, seconds in done.items():
            verdict = (f"no TD3 seed reached {task.bar:.0f}" if first is None else
                       f"{'before' if seconds < first else 'after'} the first TD3 seed reached {task.bar:.0f} "
                       f"({first:.1f} s)")
            print(f"   {seeds} lightspeed seeds ({shape}) done in {seconds:.1f} s: {verdict}")


if __name__ == "__main__":
    main(sys.argv[1:])
