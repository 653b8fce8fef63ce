"""PPO beside PureJaxRL's own PPO, stable-baselines3's PPO (rl-zoo's settings) and RLlib's current PPO, one after
another in one run on this machine: each run's final 100-episode greedy evaluation per seed, the IQM of the finals
with its 95% stratified-bootstrap CI, its env steps and its wall-clock from launch (compilation included).

    python bench/bench_ppo.py --purejaxrl ~/purejaxrl         # CartPole: single program, PureJaxRL, threads, SB3
    python bench/bench_ppo.py --rows ray rllib                # CartPole: Ray actors beside RLlib's PPO
    python bench/bench_ppo.py --task pendulum                 # Pendulum-v1: gymnax and gymnasium, 10 seeds; SB3
    python bench/bench_ppo.py --task halfcheetah              # HalfCheetah-v5 on actor threads, 3 seeds; SB3
    python bench/bench_ppo.py --task minatar                  # Breakout and SpaceInvaders (MinAtar), 2 seeds each

Rows (`--rows`, default: the task's):
  single     `python run.py algo=ppo env=...` on a JAX env: every seed in one compiled program.
  purejaxrl  PureJaxRL's purejaxrl/ppo.py (a checkout: `--purejaxrl DIR`, git clone
             https://github.com/luchris429/purejaxrl), its own CartPole config, the seeds vmapped in one jit as its
             README does; the bench's child only adapts gymnax 1.0's six-value step to the five values PureJaxRL
             reads (done = terminated or truncated) and stands in empty modules for the brax and navix that
             wrappers.py imports and CartPole never uses. Its final policies are evaluated greedily here (argmax,
             100 episodes on gymnax's CartPole-v1), as ours are.
  threads    the same algorithm on gymnasium's env through actor threads (`env=gymnasium`).
  zoo        the threads row with rl-zoo's tuned settings for the env, at rl-zoo's env steps (CartPole: ZOO_CARTPOLE),
             so that its seeds and SB3's run the same algorithm on the same budget (HalfCheetah: ZOO_HALFCHEETAH at
             the task's 300k).
  ray        the same through Ray actors on a local head (`actors=ray ray.num_actors=K`).
  sb3        stable-baselines3's PPO with rl-zoo's tuned settings for the env (bench/shared.py: SB3_ZOO_PPO), one
             process per seed, at rl-zoo's env steps (CartPole, Pendulum) or at lightspeed's (HalfCheetah).
  rllib      RLlib's PPO (bench/rllib_ppo.py in its own venv: bash bench/rllib_ppo_venv.sh) with as many env
             runners as lightspeed's Ray actors.

"first >= bar [s]" is a first crossing, not a result: lightspeed's and RLlib's first periodic evaluation whose every
seed is at or above the bar, SB3's first 16-episode evaluation there. The result is the final column pair.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple, Optional

from shared import (
    REPO_ROOT,
    final_iqm,
    first_crossing,
    format_rate,
    format_value,
    print_machine,
    print_table,
    run_sb3,
    run_to_solve,
)

# rl-zoo's Pendulum-v1 PPO (gamma 0.9, 10 epochs, lr 1e-3, no entropy bonus, VecNormalize) on lightspeed's PPO, with
# more envs and minibatches per block (docs/algorithms.md's command; tuned on seed=100)
PENDULUM = ("algo.discount=0.9", "algo.update_epochs=10", "algo.learning_rate=1e-3", "algo.entropy_coef=0",
            "algo.scale_rewards=true", "algo.normalize_observations=true", "algo.num_envs=16",
            "algo.rollout_length=256", "algo.num_minibatches=32")
# CleanRL's ppo_continuous_action.py settings (1 env x 2048 steps there; 2 envs x 1024 here, one per actor thread),
# VecNormalize's statistics on
HALFCHEETAH = ("algo.num_envs=2", "algo.rollout_length=1024", "algo.update_epochs=10", "algo.num_minibatches=32",
               "algo.learning_rate=3e-4", "algo.entropy_coef=0", "algo.scale_rewards=true",
               "algo.normalize_observations=true", "runtime.num_actor_threads=2", "eval_episodes=10")
# rl-zoo's tuned CartPole-v1 PPO (SB3_ZOO_PPO) in lightspeed's keys, at its 100k env steps: 8 envs x 32 steps, 20
# epochs of one minibatch (its batch of 256 is the block), GAE 0.8, gamma 0.98, no entropy bonus, lr 1e-3 annealed to
# 0, SB3's unclipped value loss (SB3 anneals its clip range too; lightspeed's stays 0.2)
ZOO_CARTPOLE = ("algo.num_envs=8", "algo.rollout_length=32", "algo.num_minibatches=1", "algo.update_epochs=20",
                "algo.gae_lambda=0.8", "algo.discount=0.98", "algo.entropy_coef=0", "algo.learning_rate=1e-3",
                "algo.clip_value=false")
# rl-zoo's tuned HalfCheetah PPO (SB3_ZOO_PPO's, its HalfCheetah-v3 entry): 1 env x 512 steps, 8 minibatches of 64, 20
# epochs, gamma 0.98, GAE 0.92, a constant lr 2.06e-5, clip 0.1, log std -2 at the start, relu 256 x 256, VecNormalize
# (SB3's non-orthogonal init is the one setting lightspeed's PPO does not take)
ZOO_HALFCHEETAH = ("algo.num_envs=1", "algo.rollout_length=512", "algo.num_minibatches=8", "algo.update_epochs=20",
                   "algo.discount=0.98", "algo.gae_lambda=0.92", "algo.learning_rate=2.0633e-5",
                   "algo.lr_decay_env_steps=0", "algo.entropy_coef=0.000401762", "algo.clip_eps=0.1",
                   "algo.clip_value=false", "algo.max_grad_norm=0.8", "algo.value_coef=0.58096",
                   "algo.log_std_init=-2", "algo.activation=relu", "algo.hidden_sizes=[256,256]",
                   "algo.normalize_observations=true", "algo.scale_rewards=true", "eval_episodes=10")
PUREJAXRL_CHILD = Path(__file__).resolve().parent / "purejaxrl_ppo.py"


class Task(NamedTuple):
    env_ids: dict[str, str]  # lightspeed's env group -> env.id
    bar: Optional[float]  # the return every final is counted against (None: report only)
    env_steps: int
    eval_every: int
    overrides: tuple[str, ...]  # run.py's, beyond algo, env and the run length
    rows: tuple[str, ...]
    seeds: int
    sb3_env_id: Optional[str]
    sb3_env_steps: Optional[int]  # None: rl-zoo's own
    zoo: tuple[tuple[str, ...], int] = ((), 0)  # the zoo row's overrides (rl-zoo's settings) and its env steps


TASKS = {
    "cartpole": Task({"cartpole": "CartPole-v1", "gymnasium": "CartPole-v1"}, 475.0, 500_000, 51_200, (),
                     ("single", "purejaxrl", "threads", "zoo", "sb3"), 10, "CartPole-v1", None,
                     (ZOO_CARTPOLE, 100_000)),
    "pendulum": Task({"gymnax": "Pendulum-v1", "gymnasium": "Pendulum-v1"}, -250.0, 999_424, 249_856, PENDULUM,
                     ("single", "threads", "sb3"), 10, "Pendulum-v1", None),
    "halfcheetah": Task({"gymnasium": "HalfCheetah-v5"}, None, 300_000, 50_176, HALFCHEETAH, ("threads", "zoo", "sb3"),
                        3, "HalfCheetah-v5", 300_000, (ZOO_HALFCHEETAH, 300_000)),
    "minatar": Task({"minatar": "Breakout-MinAtar"}, None, 2_000_000, 200_000, (), ("single",), 2, None, None),
}
HEADER = ["run", "seeds", "final IQM [95% CI]", "final min", "finals >= bar", "env steps per seed",
          "env steps/s, all seeds, from launch", "first >= bar [s]", "done [s]"]


def count_at_bar(finals: list[float], bar: Optional[float]) -> str:
    return "-" if bar is None else f"{sum(f >= bar for f in finals)}/{len(finals)}"


def row_of(label: str, finals: list[float], bar: Optional[float], env_steps: int, first: Optional[float],
           done: float) -> list[str]:
    print(f"{label}: finals {' '.join(f'{f:.1f}' for f in finals)}, {done:.1f} s", file=sys.stderr, flush=True)
    return [label, str(len(finals)), final_iqm(finals), f"{min(finals):.1f}", count_at_bar(finals, bar),
            f"{env_steps:,}", format_rate(len(finals) * env_steps / done),
            "-" if bar is None else format_value(first, ".1f", "never"), f"{done:.1f}"]


def lightspeed_row(task: Task, shape: str, env: str, env_id: str, seed: int, seeds: int, ray_actors: int
                   ) -> list[str]:
    fleet = ("actors=ray", f"ray.num_actors={ray_actors}", "ray.num_cpus=2") if shape == "ray" else ()
    env_args = (f"env={env}",) if env == "cartpole" else (f"env={env}", f"env.id={env_id}")  # one env: no id
    overrides, env_steps = task.zoo if shape == "zoo" else (task.overrides, task.env_steps)
    result = run_to_solve("algo=ppo", *env_args, f"total_env_steps={env_steps}", f"eval_every={task.eval_every}",
                          f"log_every={task.eval_every}", *overrides, *fleet, f"seed={seed}", f"num_seeds={seeds}",
                          keep_dir=True)
    summary, run_dir = result["summary"], result["run_dir"]
    first = None if task.bar is None else first_crossing(run_dir, task.bar, every_seed=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    where = {"single": "one program", "threads": "actor threads", "zoo": "actor threads, rl-zoo's settings",
             "ray": f"{ray_actors} Ray actors"}[shape]
    return row_of(f"lightspeed ppo, {env} {env_id}, {where}", [s["final_eval_return"] for s in summary["seeds"]],
                  task.bar, summary["env_steps"], first, result["process_seconds"])


def purejaxrl_row(task: Task, checkout: Optional[Path], seed: int, seeds: int) -> list[str]:
    if checkout is None or not (checkout / "purejaxrl" / "ppo.py").exists():
        raise SystemExit("--purejaxrl DIR: a checkout of https://github.com/luchris429/purejaxrl "
                         "(DIR/purejaxrl/ppo.py)")
    spec = dict(purejaxrl=str(checkout), env_steps=task.env_steps, seed=seed, seeds=seeds, episodes=100)
    out = subprocess.run([sys.executable, str(PUREJAXRL_CHILD), json.dumps(spec)], check=True, capture_output=True,
                         text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"purejaxrl: compile {result['compile_seconds']:.1f} s, run {result['run_seconds']:.1f} s",
          file=sys.stderr, flush=True)
    return row_of(f"PureJaxRL ppo.py, gymnax CartPole-v1, {seeds} seeds vmapped", result["finals"], task.bar,
                  result["env_steps"], None, result["wall_seconds"])


def sb3_rows(task: Task, seeds: int) -> list[list[str]]:
    rows = []
    for seed in range(seeds):
        result = run_sb3(task.sb3_env_id, seed, task.bar, eval_every=task.eval_every // 2, algo="PPO",
                         env_steps=task.sb3_env_steps)
        rows.append(row_of(f"stable-baselines3 rl-zoo PPO, {task.sb3_env_id}, seed {seed}",
                           [result["final_eval_return"]], task.bar, result["env_steps"],
                           result["first_solve_seconds"], result["wall_seconds"]))
    return rows


def rllib_row(task: Task, python: Path, runners: int, seed: int) -> list[str]:
    if not python.exists():
        raise SystemExit(f"{python} is missing: run `bash bench/rllib_ppo_venv.sh` first")
    command = [str(python), str(REPO_ROOT / "bench" / "rllib_ppo.py"), "--env-runners", str(runners), "--seed",
               str(seed), "--env-steps", str(task.env_steps), "--target", str(task.bar)]
    out = subprocess.run(command, cwd=REPO_ROOT, check=True, capture_output=True, text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"rllib: {json.dumps(result)}", file=sys.stderr, flush=True)
    return row_of(f"RLlib {result['ray_version']} PPO, gymnasium CartPole-v1, {runners} env runners",
                  [result["final_greedy_return"]], task.bar, result["env_steps"], result["first_target_seconds"],
                  result["wall_seconds"])


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="cartpole", choices=list(TASKS))
    parser.add_argument("--rows", nargs="+", choices=["single", "purejaxrl", "threads", "zoo", "ray", "sb3", "rllib"],
                        help="the runs (default: the task's)")
    parser.add_argument("--seed", type=int, default=2027, help="lightspeed's and PureJaxRL's seed base (never tuned "
                        "on)")
    parser.add_argument("--seeds", type=int, help="lightspeed's and PureJaxRL's seeds (default: the task's)")
    parser.add_argument("--sb3-seeds", type=int, default=1)
    parser.add_argument("--env-steps", type=int, help="every run's env steps per seed (default: the task's)")
    parser.add_argument("--games", nargs="+", default=["Breakout-MinAtar", "SpaceInvaders-MinAtar"],
                        help="minatar: the games")
    parser.add_argument("--purejaxrl", type=Path, help="a checkout of PureJaxRL (for the purejaxrl row)")
    parser.add_argument("--ray-actors", type=int, default=2, help="lightspeed's Ray actors and RLlib's env runners")
    parser.add_argument("--rllib-python", type=Path,
                        default=Path(os.environ.get("RLLIB_PPO_VENV", "/tmp/rllib-ppo-venv")) / "bin" / "python")
    args = parser.parse_args(argv)
    task = TASKS[args.task]
    task = task._replace(env_steps=args.env_steps or task.env_steps,
                         sb3_env_steps=args.env_steps if args.env_steps and task.sb3_env_steps else task.sb3_env_steps)
    seeds = args.seeds or task.seeds
    print_machine(f"PPO on {args.task}: lightspeed beside its references", open_devices=False)
    rows = []
    env_ids = ([(next(iter(task.env_ids)), game) for game in args.games] if args.task == "minatar"
               else list(task.env_ids.items()))
    for shape in args.rows or task.rows:
        if shape in ("single", "threads", "zoo", "ray") and (shape != "zoo" or task.zoo[1]):
            for env, env_id in env_ids:
                if (env == "gymnasium") == (shape != "single"):
                    rows.append(lightspeed_row(task, shape, env, env_id, args.seed, seeds, args.ray_actors))
        elif shape == "purejaxrl":
            rows.append(purejaxrl_row(task, args.purejaxrl, args.seed, seeds))
        elif shape == "sb3" and task.sb3_env_id:
            rows += sb3_rows(task, args.sb3_seeds)
        elif shape == "rllib":
            rows.append(rllib_row(task, args.rllib_python, args.ray_actors, args.seed))
    bar = "" if task.bar is None else f", {task.bar:.0f} the bar"
    print_table(f"PPO, {args.task}{bar}; lightspeed seed={args.seed}, {task.env_steps:,} env steps per seed", HEADER,
                rows)


if __name__ == "__main__":
    main(sys.argv[1:])
