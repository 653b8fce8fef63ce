"""actors=ray against actor threads and against RLlib 2.8.1's Ape-X, on gymnasium CartPole-v1, in one run.

    bash bench/rllib_venv.sh                     # once: RLlib 2.8.1 in a venv of its own (/tmp/rllib-venv)
    python bench/bench_ray.py [--actors 4] [--seeds 0 1 2] [--env-steps 100000] [--rllib-seconds 240]

For each seed, in turn: `run.py algo=apex env=gymnasium` with its defaults (32 envs, samples per insert 8,
eval every 5,120 env steps over 16 greedy episodes) and K actor threads, then the same with K Ray actor
processes on a local head started by the run (`actors=ray ray.num_actors=K`, half a CPU each). Then RLlib
2.8.1's Ape-X (bench/rllib_apex.py) with K rollout workers holding as many envs in all and its
training_intensity at the same samples per insert, for --rllib-seconds of training.

Rates, two ways. After start-up, RLlib's way: its sampled env steps over the time inside its train() calls (its
start-up and evaluations excluded), ours from the run's first log line to its last (Ray's start, the actor
processes' start, compilation and the first log interval excluded; the periodic evaluations run beside the
training and stay in). From launch: env steps over the whole process's wall time, start-up included. Learner
batches/s after start-up (of 128 for ours, of RLlib's train_batch_size for it). Time to 475 is the wall time
of the first periodic evaluation at or above 475: from launch for ours (Ray's start and compilation included),
from the first train() call for RLlib (its start-up, printed apart, excluded). The final return is ours'
final greedy evaluation over 100 episodes, RLlib's greedy mean at its end.

On paper: how many actors one learner feeds at the Ape-X paper's replay ratio (0.8 samples per insert) and at
this run's (8): the learner's measured batches/s while it worked (batches/s / (1 - its wait fraction)) x 128 /
samples per insert, against one actor process's env steps/s while it worked; and the object store's share:
bytes of experience and parameters per second against what moving a block through it measured here.
"""
import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from shared import REPO_ROOT, first_crossing, format_rate, format_value, print_table, run_to_solve

RLLIB_PYTHON = Path("/tmp/rllib-venv/bin/python")
TARGET = 475.0
BATCH = 128  # Ape-X's default learner batch (algorithms/apex.py)


def after_start_up(run_dir: Path) -> tuple[float, float, float]:
    """(env steps/s, learner batches/s, seconds to the first report) from the run's first log line to its last:
    start-up and compilation excluded, as RLlib's rate excludes its start-up (its evaluations are excluded too;
    ours run beside the training and stay in)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first, last = records[0], records[-1]
    seconds = last["perf/wall_seconds"] - first["perf/wall_seconds"]
    updates = last["runtime/learner_updates"] - first["runtime/learner_updates"]
    return (last["env_steps"] - first["env_steps"]) / seconds, updates / seconds, first["perf/wall_seconds"]


def ours(fleet: str, actors: int, seed: int, env_steps: int) -> dict:
    fleet_args = (["actors=ray", f"ray.num_actors={actors}", "ray.num_cpus_per_actor=0.5", "ray.num_cpus=2"]
                  if fleet == "ray" else [f"runtime.num_actor_threads={actors}"])
    result = run_to_solve("algo=apex", "env=gymnasium", f"seed={seed}", f"total_env_steps={env_steps}",
                          *fleet_args, keep_dir=True)
    summary, run_dir = result["summary"], result["run_dir"]
    runtime = summary["runtime"]
    steady_env, steady_learner, first_report = after_start_up(run_dir)
    row = {"fleet": fleet, "seed": seed, "steady_env_steps_per_second": steady_env,
           "steady_learner_batches_per_second": steady_learner, "first_report": first_report,
           "launch_env_steps_per_second": summary["env_steps"] / result["process_seconds"],
           "seconds_to_target": first_crossing(run_dir, TARGET), "final": summary["final_eval_return"],
           "wall": result["process_seconds"], "actor_wait": runtime["runtime/actor_wait_fraction"],
           "learner_wait": runtime["runtime/learner_wait_fraction"]}
    shutil.rmtree(run_dir, ignore_errors=True)
    return row


def rllib(actors: int, seed: int, seconds: float, intensity: float) -> dict:
    """bench/rllib_apex.py in its own venv: its printed config, and its RESULT line."""
    if not RLLIB_PYTHON.exists():
        raise SystemExit(f"{RLLIB_PYTHON} is missing: run `bash bench/rllib_venv.sh` first")
    command = [str(RLLIB_PYTHON), str(REPO_ROOT / "bench" / "rllib_apex.py"), "--workers", str(actors),
               "--envs-per-worker", str(32 // actors), "--training-intensity", str(intensity), "--seconds",
               str(seconds), "--seed", str(seed)]
    output = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    config = output[:output.index("RESULT ")].strip()
    return {"config": config, **json.loads(output.split("RESULT ", 1)[1].splitlines()[0])}


def object_store_rate(mib: int = 4, repeats: int = 20) -> float:
    """Bytes/s of a block of `mib` MiB returned by a Ray actor to this driver, on a local head of ours."""
    sys.path.insert(0, str(REPO_ROOT))
    from lightspeed.framework.core.config import RayConfig
    from lightspeed.framework.sebulba.ray.cluster import connect

    ray, head = connect(RayConfig(num_cpus=2), timeout_s=60)
    try:
        @ray.remote(num_cpus=0.5)
        class Source:
            def block(self, size: int) -> np.ndarray:
                return np.ones(size, np.uint8)

        source = Source.remote()
        ray.get(source.block.remote(1))
        start = time.perf_counter()
        for _ in range(repeats):
            assert ray.get(source.block.remote(mib << 20)).nbytes == mib << 20
        return repeats * (mib << 20) / (time.perf_counter() - start)
    finally:
        ray.shutdown()
        head.stop()


def median(rows: list[dict], key: str) -> float | None:
    values = [row[key] for row in rows if row[key] is not None]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actors", type=int, default=4, help="K: actor threads, Ray actors, RLlib workers")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--env-steps", type=int, default=100_000)
    parser.add_argument("--rllib-seconds", type=float, default=240)
    parser.add_argument("--skip-rllib", action="store_true")
    args = parser.parse_args()
    spi = 8.0  # Ape-X's default samples per insert (16 x 128 / 256)
    runs = {"threads": [], "ray": []}
    for seed in args.seeds:  # interleaved, so the machine's load falls on both alike
        for fleet in runs:
            runs[fleet].append(ours(fleet, args.actors, seed, args.env_steps))
            print(json.dumps(runs[fleet][-1]), flush=True)
    reference = None if args.skip_rllib else rllib(args.actors, args.seeds[0], args.rllib_seconds, spi)
    if reference is not None:
        print("RLlib 2.8.1 ApexDQN config:\n" + reference.pop("config"), flush=True)
        print(json.dumps(reference), flush=True)
    rows = []
    for fleet, label in (("threads", f"lightspeed, {args.actors} actor threads"),
                         ("ray", f"lightspeed, {args.actors} Ray actors")):
        r = runs[fleet]
        rows.append([label, format_rate(median(r, "steady_env_steps_per_second")),
                     format_rate(median(r, "launch_env_steps_per_second")),
                     f"{median(r, 'steady_learner_batches_per_second'):.1f} x {BATCH}",
                     f"{median(r, 'first_report'):.0f}", format_value(median(r, "seconds_to_target"), ".0f"),
                     f"{median(r, 'wall'):.0f}", " ".join(f"{row['final']:.0f}" for row in r)])
    if reference is not None:
        wall = reference["wall_seconds"] + reference["startup_seconds"]
        reference["launch_env_steps_per_second"] = reference["env_steps_sampled"] / wall
        rows.append([f"RLlib 2.8.1 Ape-X, {args.actors} workers", format_rate(reference["env_steps_per_second"]),
                     format_rate(reference["launch_env_steps_per_second"]),
                     f"{reference['learner_batches_per_second']:.1f} x {reference['train_batch_size']}",
                     f"{reference['startup_seconds']:.0f}", format_value(reference["seconds_to_target"], ".0f"),
                     f"{wall:.0f}", f"{reference['final_greedy_return']:.0f}"])
    print_table(f"gymnasium CartPole-v1, Ape-X, samples per insert {spi:g}, medians of seeds {args.seeds}",
                ["system", "env steps/s after start-up", "env steps/s from launch", "learner batches/s",
                 "start-up s", "s to 475", "wall s", "final per seed"], rows)
    print("after start-up: ours from the first log line to the last (periodic evaluations included), RLlib's inside "
          "its train() calls; start-up: ours to the first log line (Ray, actor processes, compilation and the "
          "first log interval), RLlib's to its first train(); learner batches/s after start-up")
    ray_rate = lambda key: median(runs["ray"], key)
    if reference is not None:
        steady = ray_rate("steady_env_steps_per_second") / reference["env_steps_per_second"]
        launch = ray_rate("launch_env_steps_per_second") / reference["launch_env_steps_per_second"]
        print(f"Ray actors / RLlib env steps/s: {steady:.1f}x after start-up, {launch:.1f}x from launch; "
              f"RLlib's measured training intensity {reference['training_intensity_measured']:.2f} "
              f"(set {spi:g})")
    ratio = ray_rate("steady_env_steps_per_second") / median(runs["threads"], "steady_env_steps_per_second")
    print(f"Ray actors / actor threads env steps/s after start-up: {ratio:.2f}")
    paper(runs["ray"], args.actors, object_store_rate())


def paper(ray_runs: list[dict], actors: int, store_rate: float) -> None:
    """How many actors one learner feeds, and where the object store would cap them."""
    learner = median([{"x": r["steady_learner_batches_per_second"] / max(1 - r["learner_wait"], 1e-9)}
                      for r in ray_runs], "x")
    per_actor = median([{"x": r["steady_env_steps_per_second"] / actors / max(1 - r["actor_wait"], 1e-9)}
                        for r in ray_runs], "x")
    block_bytes = 4 * 2 * 4 + 4 + 4 * 3  # per transition on the wire: obs and next obs (4 float32), action, scalars
    rows = []
    for spi in (0.8, 8.0):
        feeds = learner * BATCH / spi
        rows.append([f"{spi:g}", format_rate(feeds), format_rate(per_actor), f"{feeds / per_actor:,.0f}",
                     format_rate(store_rate / block_bytes)])
    print_table("On paper (this CPU; no GPU was lent): env steps/s one learner consumes, and the actors that feeds",
                ["samples per insert", "learner consumes", "one actor makes", "actors fed",
                 "object store cap, env steps/s"], rows)
    print(f"object store: {store_rate / 2**20:,.0f} MiB/s returning 4 MiB blocks from an actor to the driver here; "
          f"a CartPole transition is ~{block_bytes} bytes on the wire")


if __name__ == "__main__":
    main()
