"""D4PG on MuJoCo's HalfCheetah-v5 on a GPU machine: one prepared run of about 6 minutes (bench/gpu_atari.py's
machinery).

    bash bench/gpu_atari.sh --d4pg              # on the GPU machine (installs what it lacks from .whl/ first)
    python bench/gpu_d4pg_mujoco.py [--seconds 300] [--env-id HalfCheetah-v5] [--out DIR]     # on any machine

Phases (files in --out, default $OUT, else /tmp/gpu_d4pg_mujoco):
  0_machine.txt   the machine, the devices and the versions of what the run imports
  1_d4pg.txt      `run.py algo=d4pg env=gymnasium env.id=HalfCheetah-v5` for --seconds of training (Acme's network
                  sizes: a 256x256x256 policy, a 512x512x256 critic; 8 actors of 2 envs on 2 actor threads, one batch
                  of 256 per env step), then its env steps/s, learner batches/s and the final return over 10 episodes
                  (its output: 1_d4pg.log). Past twice its budget the run gets a SIGTERM and still evaluates.
"""
import argparse
import os
import sys
import tempfile
from pathlib import Path

from bench_d4pg import HALFCHEETAH_SUPPORT
from gpu_atari import machine, run_phase, timed_run

ACTORS, ENVS_PER_ACTOR = 8, 2


def d4pg(out: Path, seconds: float, env_id: str, steps_per_second: float) -> None:
    steps = max(16_000, int(steps_per_second * seconds) // 1000 * 1000)
    run_dir = Path(tempfile.mkdtemp(prefix="gpu_d4pg_"))
    command = [sys.executable, "run.py", "algo=d4pg", "env=gymnasium", f"env.id={env_id}", f"total_env_steps={steps}",
               f"eval_every={steps}", "log_every=8000", "eval_episodes=10", "final_eval_episodes=10",
               f"algo.num_actors={ACTORS}", f"algo.envs_per_actor={ENVS_PER_ACTOR}", "algo.rollout_length=4",
               "algo.learner_updates_per_iteration=64", "algo.policy_hidden_sizes=[256,256,256]",
               "algo.critic_hidden_sizes=[512,512,256]", "algo.buffer_size=1000000", "algo.learning_starts=10000",
               "runtime.num_actor_threads=2", *HALFCHEETAH_SUPPORT, "progress=false", f"hydra.run.dir={run_dir}"]
    run = timed_run(command, out / "1_d4pg.log", seconds, run_dir)
    summary = run.summary
    batches = run.last_log.get("runtime/learner_batches_per_second", float("nan"))
    seed = summary["seeds"][0]
    print(f"D4PG on {env_id}: {summary['env_steps']:,} env steps in {run.seconds:.0f} s with "
          f"compilation and evaluation; {summary['env_steps_per_second']:,.0f} env steps/s over the run; learner "
          f"{batches:.1f} batches of 256/s at the last log; final return {seed['final_eval_return']:.1f} over "
          f"{summary['final_eval_episodes']} episodes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--env-id", default="HalfCheetah-v5")
    parser.add_argument("--steps-per-second", type=float, default=400.0, help="the rate the run is sized from")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "/tmp/gpu_d4pg_mujoco"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    run_phase(args.out, "0_machine", lambda: machine('lightspeed D4PG on MuJoCo, accelerator machine'))
    run_phase(args.out, "1_d4pg", lambda: d4pg(args.out, args.seconds, args.env_id, args.steps_per_second))


if __name__ == "__main__":
    main()
