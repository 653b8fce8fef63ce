"""R2D2 on Atari on a GPU machine: one prepared run of about 6 minutes (bench/gpu_atari.py's machinery).

    bash bench/gpu_atari.sh --r2d2              # on the GPU machine (installs what it lacks from .whl/ first)
    python bench/gpu_r2d2_atari.py [--seconds 300] [--game Pong] [--out DIR]     # on any machine

Phases (files in --out, default $OUT, else /tmp/gpu_r2d2_atari):
  0_machine.txt   the machine, the devices and the versions of what the run imports
  1_r2d2.txt      `run.py algo=r2d2 env=atari` for --seconds of training (the paper's network: Nature torso, LSTM 512,
                  dueling; 64 envs on 2 actor threads; a replay of 4,000 sequences, 4.5 GB of 84x84x4 stacks), then
                  its frames/s, learner batches/s and sequences per second over the run, and a 5-game evaluation
                  (its output: 1_r2d2.log). Past twice its budget the run gets a SIGTERM and still evaluates.
"""
import argparse
import os
import sys
import tempfile
from pathlib import Path

from gpu_atari import machine, run_phase, timed_run

FRAMES_PER_STEP = 4  # the ALE's frame skip
ENVS = (8, 8)  # actors x envs per actor
SEQUENCES = 4_000  # the replay: 4,000 x 40 steps of [84, 84, 4] uint8 stacks (the Acme default, 100k, takes 113 GB)


def r2d2(out: Path, seconds: float, game: str, steps_per_second: float) -> None:
    steps = max(20_480, int(steps_per_second * seconds) // 2560 * 2560)
    run_dir = Path(tempfile.mkdtemp(prefix="gpu_r2d2_"))
    actors, envs = ENVS
    command = [sys.executable, "run.py", "algo=r2d2", "env=atari", f"env.id={game}", f"total_env_steps={steps}",
               f"eval_every={steps}", "log_every=10240", "eval_episodes=5", "final_eval_episodes=5",
               f"algo.num_actors={actors}", f"algo.envs_per_actor={envs}", f"algo.buffer_size={SEQUENCES}",
               "algo.learning_starts=512", "runtime.num_actor_threads=2", "progress=false", f"hydra.run.dir={run_dir}"]
    run = timed_run(command, out / "1_r2d2.log", seconds, run_dir)
    summary = run.summary
    rate = summary["env_steps_per_second"]
    batches = run.last_log.get("runtime/learner_batches_per_second", float("nan"))
    sequence_rate = batches * 64  # R2D2Config's batch of 64 sequences
    seed = summary["seeds"][0]
    print(f"R2D2 on {game}: {summary['env_steps']:,} env steps in {run.seconds:.0f} s with "
          f"compilation and evaluation; {rate * FRAMES_PER_STEP:,.0f} frames/s ({rate:,.0f} env steps/s) over the "
          f"run; learner {batches:.2f} batches/s ({sequence_rate:.0f} sequences of 121 steps/s) at the last log; "
          f"final raw score {seed['final_eval_return']:.1f} over {summary['final_eval_episodes']} games")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--game", default="Pong")
    parser.add_argument("--steps-per-second", type=float, default=1500.0, help="the rate the run is sized from")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "/tmp/gpu_r2d2_atari"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    run_phase(args.out, "0_machine", lambda: machine('lightspeed R2D2 on Atari, accelerator machine'))
    run_phase(args.out, "1_r2d2", lambda: r2d2(args.out, args.seconds, args.game, args.steps_per_second))


if __name__ == "__main__":
    main()
