"""Atari on a GPU machine: one prepared run of about 6 minutes, each phase's table written as it ends.

    bash bench/gpu_atari.sh                     # on the GPU machine (installs what it lacks from .whl/ first)
    python bench/gpu_atari.py [--pong-seconds 100] [--out DIR]      # the phases alone, on any machine

Phases (bench_atari.py's sections at GPU sizes; the files land in --out, default $OUT, else /tmp/gpu_atari):
  0_machine.txt   the machine, the devices and the versions of what the run imports
  1_engine.txt    ale-py's engine alone, 64 envs, sync and async (CPU: the GPU's host cores)
  2_learner.txt   Ape-X's Nature-network update in a scan, flax nn.Conv against StridedConv, batches 32 and 512
  3_actors.txt    Ape-X's actor part with its policy on the device, 1 and 2 actor threads
  4_system.txt    the whole system at 0.8 (Ape-X) and 8 (DQN) samples per insert, one 30-second window each
  5_pong.txt      `run.py algo=apex env=atari env.id=Pong` for --pong-seconds of training, sized from phase 4's
                  Ape-X rate, then its final evaluation: 10 whole games, raw score (its output: 5_pong.log)
A phase that fails writes its traceback to its file and the next one runs.
"""
import argparse
import contextlib
import importlib.metadata
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import NamedTuple

from shared import REPO_ROOT, print_machine

ENVS = 64  # 8 Ape-X actors x 8 envs, RLlib's tuned Atari layout
WINDOW = 30.0  # seconds of phase 4's one window per algorithm
SIGTERM_GRACE_S = 120  # phase 5's run past its deadline: time to end its round and evaluate before it is killed
# the distributions the run imports, whose versions phase 0 records
IMPORTED = ("jax", "jaxlib", "flax", "optax", "chex", "flashbax", "orbax-checkpoint", "gymnasium", "ale-py",
            "hydra-core", "omegaconf", "numpy")


class Tee(io.TextIOBase):
    """Writes to every stream it holds (the console and a phase's file)."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
            stream.flush()
        return len(text)


def run_phase(out: Path, name: str, phase) -> object:
    """`phase()` with its printout copied to out/name.txt; a failure is written there, not raised."""
    start = time.perf_counter()
    with open(out / f"{name}.txt", "w") as file, contextlib.redirect_stdout(Tee(sys.__stdout__, file)):
        try:
            result = phase()
        except Exception:  # the next phase still runs: a GPU lease is too short to stop at the first failure
            traceback.print_exc(file=sys.stdout)
            result = None
        print(f"({name}: {time.perf_counter() - start:.0f} s)")
    return result


def machine(title: str = "lightspeed on Atari, accelerator machine") -> None:
    """The machine, its devices and the versions, read in a child process: on a TPU one process at a time holds the
    chip, and the run.py phases come after."""
    child = subprocess.run([sys.executable, "-c", f"import gpu_atari; gpu_atari.machine_here({title!r})"],
                           cwd=Path(__file__).parent, capture_output=True, text=True, check=False)
    print(child.stdout + (child.stderr[-2000:] if child.returncode else ""), end="")


def machine_here(title: str) -> None:
    print_machine(title)
    import jax

    print(f"  devices: {', '.join(str(device) for device in jax.devices())}")
    for distribution in IMPORTED:
        try:
            version = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            version = "missing"
        print(f"  {distribution}: {version}")
    if shutil.which("nvidia-smi"):
        print(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout.strip())


def table(title: str, rows: list[list[str]]) -> None:
    import bench_atari
    from shared import print_table

    print_table(title, bench_atari.COLUMNS, rows)


def engine() -> float:
    import bench_atari

    rows, sync_rate = bench_atari.engine_rows("Pong", ENVS)
    table("1. Pong, the engine alone", rows)
    return sync_rate


def learner() -> None:
    import bench_atari

    table("2. the conv learner (batches/s)", bench_atari.learner_rows())


def actors(engine_rate) -> None:
    import bench_atari

    table("3. Pong, actors with their policy", bench_atari.actor_rows("Pong", ENVS, engine_rate))


def system() -> float:
    """Both algorithms' rows; returns Ape-X's env steps/s (phase 5's budget)."""
    import bench_atari

    rates = {algo: bench_atari.system_rates("Pong", algo, ENVS, WINDOW, 1) for algo in ("apex", "dqn")}
    table("4. Pong, the whole system", [bench_atari.system_row(algo, rates[algo], WINDOW, 1) for algo in rates])
    return rates["apex"][0]


def run_with_deadline(command: list[str], log_path: Path, seconds: float) -> None:
    """`command` from the repository root, its output into `log_path`. Past twice its budget it gets a SIGTERM: a run
    stops after its round and still evaluates; past the grace, a kill (nothing of a phase outlives it)."""
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            process.wait(timeout=2 * seconds + 120)
        except subprocess.TimeoutExpired:
            print("past twice the budget: SIGTERM (the run ends after its round, with its final evaluation)")
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=SIGTERM_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class TimedRun(NamedTuple):
    summary: dict  # the run's summary.json
    last_log: dict  # its last metrics.jsonl record
    seconds: float  # from launch to exit, compilation and evaluations included


def timed_run(command: list[str], log_path: Path, seconds: float, run_dir: Path) -> TimedRun:
    """`run.py` as `command` (writing to `run_dir`) under run_with_deadline; the tail of its output printed."""
    print("$ " + " ".join(command[1:]), flush=True)
    start = time.perf_counter()
    run_with_deadline(command, log_path, seconds)
    print(log_path.read_text()[-3000:])
    records = (run_dir / "metrics.jsonl").read_text().splitlines()
    return TimedRun(json.loads((run_dir / "summary.json").read_text()), json.loads(records[-1]) if records else {},
                    time.perf_counter() - start)


def pong(out: Path, seconds: float, apex_rate, steps=None, overrides=()) -> None:
    """Ape-X on Pong for about `seconds` of training at phase 4's rate (RLlib's layout, a 200k-frame replay so the
    run starts at once), then its final evaluation of 10 whole games (raw score). Past twice its budget the run
    gets a SIGTERM: it stops after its round and still evaluates."""
    import bench_atari

    rate = apex_rate or 500.0
    steps = steps or max(60_000, int(rate * seconds) // 1280 * 1280)  # learning starts at 50k env steps
    run_dir = Path(tempfile.mkdtemp(prefix="gpu_atari_pong_"))  # not in `out`: a device run brings back 8 files
    command = [sys.executable, "run.py", "algo=apex", "env=atari", "env.id=Pong", f"total_env_steps={steps}",
               f"eval_every={steps}", "log_every=10000", "eval_episodes=10", "final_eval_episodes=10",
               "algo.buffer_size=200000", "runtime.num_actor_threads=2", "progress=false", f"hydra.run.dir={run_dir}",
               *overrides]
    run = timed_run(command, out / "5_pong.log", seconds, run_dir)
    summary = run.summary
    seed = summary["seeds"][0]
    frames = bench_atari.FRAMES_PER_STEP * summary["env_steps"]
    print(f"Pong after {summary['env_steps']:,} env steps ({frames / 1e6:.2f}M frames, "
          f"{run.seconds:.0f} s with compilation and evaluation): final raw score "
          f"{seed['final_eval_return']:.1f} +- {seed['final_eval_std']:.1f} over {summary['final_eval_episodes']} "
          f"games; {summary['env_steps_per_second']:.0f} env steps/s over the run; runtime {summary['runtime']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pong-seconds", type=float, default=100.0)
    parser.add_argument("--pong-steps", type=int, help="phase 5's env steps (default: sized from phase 4)")
    parser.add_argument("--pong-override", action="append", default=[], help="one more override of phase 5's run")
    parser.add_argument("--phases", nargs="+", type=int, default=list(range(6)), help="which phases (0-5) to run")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "/tmp/gpu_atari"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    engine_rate = apex_rate = None
    phases = set(args.phases)
    if 0 in phases:
        run_phase(args.out, "0_machine", machine)
    if 1 in phases:
        engine_rate = run_phase(args.out, "1_engine", engine)
    if 2 in phases:
        run_phase(args.out, "2_learner", learner)
    if 3 in phases:
        run_phase(args.out, "3_actors", lambda: actors(engine_rate))
    if 4 in phases:
        apex_rate = run_phase(args.out, "4_system", system)
    if 5 in phases:
        run_phase(args.out, "5_pong", lambda: pong(args.out, args.pong_seconds, apex_rate, args.pong_steps,
                                                   args.pong_override))


if __name__ == "__main__":
    main()
