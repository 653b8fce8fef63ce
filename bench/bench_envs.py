"""gymnax environments against published numbers: the final 100-episode greedy return of every seed.

    python bench/bench_envs.py [--seeds 10] [--seed 0] [--sb3-seeds 1] [--minatar-seeds 2]
                               [--minatar-frames 2000000] [--skip-classic] [--skip-minatar]

Classic control: `run.py algo=<dqn|apex> env=gymnax env.id=<id> num_seeds=10` with the defaults, at no
more env steps than the reference used; per row the final IQM [95% CI] (rliable), min, the seeds at or
above the published return, and the wall-clock of the whole process (10 seeds, compilation included).
MountainCar's row also says how many seeds ever reached the flag in a periodic evaluation (return
> -200) and how soon: whether Ape-X's epsilon ladder explores better than DQN's single epsilon.
The reference itself runs in the same table: `--sb3-seeds` seeds of stable-baselines3's DQN with
rl-zoo's settings and n_timesteps for the env, one process each, no periodic evaluation (its fastest
wall-clock), the final 100-episode greedy return (needs the bench extra: stable-baselines3, torch).

MinAtar (`env=minatar`: gymnax's ports with the paper's sticky actions 0.1, the minimal action set,
episodes capped at 1000 steps, Freeway's at 2500; the paper used all 6 actions): `--minatar-seeds`
seeds for `--minatar-frames` frames (one frame = one env step, evaluated every tenth of the run),
the final return next to the paper's DQN at 5M frames (read off its learning-curve figure), where
the other algorithm's periodic evaluation stood at the same wall-clock (from launch), and the
speed: frames/s, learner batches/s, minutes per million frames.
"""
import argparse
import json
import time

import numpy as np
from shared import final_iqm, print_machine, print_table, run_sb3, run_to_solve

# (gymnax id, reference, env steps it used, published final return, its +- band)
CLASSIC = [
    ("Acrobot-v1", "rl-zoo DQN", 100_000, -76.6, 11.8),
    ("MountainCar-v0", "rl-zoo DQN", 120_000, -100.9, 9.9),
]
CLEANRL = {"Acrobot-v1": "-88.9 +- 1.6 (CleanRL dqn_jax, 500k)",
           "MountainCar-v0": "-188.9 +- 11.8 (CleanRL dqn_jax, 500k)"}
# MinAtar paper (Young & Tian 2019), DQN at 5M frames, read off its learning-curve figure
MINATAR = [("Breakout-MinAtar", 10.0), ("SpaceInvaders-MinAtar", 43.0), ("Asterix-MinAtar", 17.0),
           ("Freeway-MinAtar", 50.0)]
ALGOS = ("dqn", "apex")
NEVER_REACHED_FLAG = -200.0  # MountainCar's return when the car never gets up in 200 steps


def evaluations(run_dir) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if "eval/return_per_seed" in r]


def exploration(run_dir) -> str:
    """Seeds whose greedy policy reached the flag in some periodic evaluation, and the median first env step."""
    records = evaluations(run_dir)
    per_seed = np.array([r["eval/return_per_seed"] for r in records])  # [evaluations, seeds]
    steps = [r["env_steps"] for r in records]
    firsts = [steps[int(np.argmax(column > NEVER_REACHED_FLAG))] for column in per_seed.T
              if (column > NEVER_REACHED_FLAG).any()]
    median = f", median first at {np.median(firsts):,.0f} env steps" if firsts else ""
    return f"{len(firsts)}/{per_seed.shape[1]} seeds{median}"


def final_cells(finals: list[float], published: float) -> list[str]:
    """final IQM [95% CI] (the value itself for one seed), min, seeds at or above the published return"""
    spread = final_iqm(finals) if len(finals) > 1 else f"{finals[0]:.1f}"
    return [spread, f"{min(finals):.1f}", f"{sum(f >= published for f in finals)}/{len(finals)}"]


def classic_rows(seeds: int, seed: int, sb3_seeds: int) -> list[list[str]]:
    rows = []
    for env_id, reference, steps, published, band in CLASSIC:
        references = [f"{published} +- {band} ({reference}, {steps // 1000}k)", CLEANRL[env_id]]
        for algo in ALGOS:
            # the defaults (conf/algo_env/<algo>_gymnax.yaml) end within the reference's env steps
            result = run_to_solve(f"algo={algo}", "env=gymnax", f"env.id={env_id}", f"num_seeds={seeds}",
                                  f"seed={seed}", keep_dir=True)
            assert result["summary"]["env_steps"] <= steps, "more env steps than the reference used"
            summary = result["summary"]
            finals = [s["final_eval_return"] for s in summary["seeds"]]
            rows.append([f"{env_id}, lightspeed {algo}", f"{summary['env_steps']:,}", *final_cells(finals, published),
                         *references, f"{result['process_seconds']:.1f}",
                         exploration(result["run_dir"]) if env_id.startswith("MountainCar") else "-"])
        if sb3_seeds:
            sb3 = [run_sb3(env_id, s, eval_every=0) for s in range(sb3_seeds)]
            walls = " ".join(f"{r['wall_seconds']:.1f}" for r in sb3)
            rows.append([f"{env_id}, stable-baselines3 rl-zoo DQN", f"{sb3[0]['env_steps']:,}",
                         *final_cells([r["final_eval_return"] for r in sb3], published), *references,
                         f"{walls} (one process per seed)", "-"])
    return rows


def learner_batches_per_second(run_dir, algo: str) -> float:
    """Ape-X logs its learner batches per second; DQN's come from its gradient steps and training time."""
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    if algo == "apex":
        return last["perf/learner_updates_per_second"]
    summary = json.loads((run_dir / "summary.json").read_text())
    train_seconds = summary["env_steps"] / summary["env_steps_per_second_per_seed"]
    return last["learner/updates"] * summary["num_devices"] / train_seconds


def return_within(run_dir, seconds: float) -> str:
    """A run's last periodic evaluation (mean over seeds) reached within `seconds` of its launch."""
    reached = [r for r in evaluations(run_dir) if r["perf/wall_seconds"] <= seconds]
    if not reached:
        return "-"
    return f"{reached[-1]['eval/return']:.1f} at {reached[-1]['env_steps']:,}"


def minatar_rows(seeds: int, frames: int, seed: int) -> list[list[str]]:
    rows = []
    for env_id, published in MINATAR:
        results = {algo: run_to_solve(f"algo={algo}", "env=minatar", f"env.id={env_id}", f"num_seeds={seeds}",
                                      f"seed={seed}", f"total_env_steps={frames}", f"eval_every={frames // 10}",
                                      f"log_every={frames // 10}", keep_dir=True) for algo in ALGOS}
        for algo, result in results.items():
            summary = result["summary"]
            finals = [s["final_eval_return"] for s in summary["seeds"]]
            frames_per_second = summary["env_steps_per_second"]
            # the other algorithm where it stood when this one's last periodic evaluation ended
            (other,) = [r for a, r in results.items() if a != algo]
            own_end = evaluations(result["run_dir"])[-1]["perf/wall_seconds"]
            rows.append([f"{env_id}, lightspeed {algo}", f"{summary['env_steps']:,} x {seeds}",
                         " ".join(f"{f:.1f}" for f in finals), f"~{published:g} (5M frames)",
                         return_within(other["run_dir"], own_end), f"{frames_per_second:,.0f}",
                         f"{learner_batches_per_second(result['run_dir'], algo):,.1f}",
                         f"{1e6 / frames_per_second / 60:.1f}", f"{result['process_seconds']:.0f}"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0, help="seed base")
    parser.add_argument("--sb3-seeds", type=int, default=1, help="stable-baselines3 seeds per classic env (0: none)")
    parser.add_argument("--minatar-seeds", type=int, default=2)
    parser.add_argument("--minatar-frames", type=int, default=2_000_000)
    parser.add_argument("--skip-classic", action="store_true")
    parser.add_argument("--skip-minatar", action="store_true")
    args = parser.parse_args()

    print_machine("lightspeed on gymnax environments", open_devices=False)
    start = time.time()
    if not args.skip_classic:
        print_table(f"Classic control: final 100-episode greedy return of {args.seeds} seeds (seed={args.seed}), "
                    "defaults",
                    ["run", "env steps", "final IQM [95% CI]", "min", "seeds >= published", "published",
                     "also published", "wall, all seeds [s]", "reached the flag (eval > -200)"],
                    classic_rows(args.seeds, args.seed, args.sb3_seeds))
    if not args.skip_minatar:
        print_table(f"MinAtar (env=minatar: sticky actions 0.1, minimal action set): {args.minatar_seeds} seeds, "
                    f"{args.minatar_frames:,} frames each", ["run", "frames", "final return per seed", "paper DQN",
                    "the other algo at this one's wall-clock (eval at frames)", "frames/s (all seeds)",
                    "learner batches/s", "min per 1M frames", "wall [s]"],
                    minatar_rows(args.minatar_seeds, args.minatar_frames, args.seed))
    print(f"\nbenchmark wall-clock {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
