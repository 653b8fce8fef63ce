"""Across processes: a two-process jax.distributed cluster on this machine next to one process with
two forced devices on the same cores, in one run.

    python bench/bench_cluster.py [--env-steps 81920] [--dqn-env-steps 204800] [--skip-pinned]
                                  [--skip-realtime] [--workloads NAME ...]

Workloads (CartPole, no compilation cache):
- Ape-X's defaults, one seed: 16 learner batches of 128 per iteration, each one gradient all-reduce
  between the two learners;
- Ape-X with 4 batches of 512 per iteration: the same samples per env step in a quarter of the
  all-reduces (`algo.batch_size=512 algo.learner_updates_per_iteration=4`);
- DQN, 10 independent seeds (5 per device): no collective in the update at all.
Layouts:
1. one process, two forced CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=2);
2. two processes on 127.0.0.1 joined through the README's LIGHTSPEED_* variables, unpinned;
3. the same, each process pinned to its own core (`taskset -c 0` / `-c 1`);
4. and 5. layouts 2 and 3 with every thread of each process under the real-time SCHED_FIFO
   policy (`chrt -f 1`; root or CAP_SYS_NICE): a thread woken by a gloo message then runs at once
   instead of at the next scheduler tick (4 ms on this kernel, CONFIG_HZ=250).
Each row prints env steps/s (all seeds) and learner batches/s (Ape-X; summary.json and
metrics.jsonl of process 0, measured after compilation). A last table gives each layout's time of
one all-reduce alone: a scan of 100 `lax.pmean`s of one gradient-sized vector (Ape-X's 64x64
dueling net: 9,000 floats), run by `--collective-worker`.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shared import REPO_ROOT, print_machine, print_table

GRADIENT_FLOATS = 9_000  # Ape-X's default network: 4 -> 64 -> 64 -> (1 + 2), dueling, LayerNorm
PMEANS = 100


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def collective_seconds() -> float:
    """(worker) Seconds per pmean of a gradient-sized vector over every device of the job."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, PartitionSpec

    sys.path.insert(0, str(REPO_ROOT))
    from lightspeed.framework.core.config import DistributedConfig
    from lightspeed.framework.core.devices import DEVICE_AXIS, initialize_distributed

    processes = int(os.environ.get("LIGHTSPEED_NUM_PROCESSES", "1"))
    if processes > 1:
        initialize_distributed(DistributedConfig(coordinator_address=os.environ["LIGHTSPEED_COORDINATOR"],
                                                 num_processes=processes,
                                                 process_id=int(os.environ["LIGHTSPEED_PROCESS_ID"])))
    mesh = Mesh(np.array(jax.devices()), (DEVICE_AXIS,))

    def many_pmeans(x):
        return jax.lax.fori_loop(0, PMEANS, lambda i, v: jax.lax.pmean(v * 0.5 + 1.0, DEVICE_AXIS), x)

    program = jax.jit(jax.shard_map(many_pmeans, mesh=mesh, in_specs=PartitionSpec(DEVICE_AXIS),
                                    out_specs=PartitionSpec(DEVICE_AXIS), check_vma=False))
    devices = len(jax.devices())
    x = jax.make_array_from_callback((devices, GRADIENT_FLOATS),
                                     jax.sharding.NamedSharding(mesh, PartitionSpec(DEVICE_AXIS)),
                                     lambda index: np.ones((1, GRADIENT_FLOATS), np.float32))
    jax.block_until_ready(program(x))  # compile
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        jax.block_until_ready(program(x))
        best = min(best, (time.perf_counter() - start) / PMEANS)
    return best


REALTIME = ["chrt", "-f", "1"]  # SCHED_FIFO at the lowest real-time priority, inherited by every thread


def launch(args: list[str], env: dict, prefix: list[str]) -> subprocess.Popen:
    """`python ARGS` under `prefix` (taskset, chrt or nothing)."""
    return subprocess.Popen([*prefix, sys.executable, *args], cwd=REPO_ROOT, env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(processes: list[subprocess.Popen]) -> list[str]:
    outputs = [p.communicate(timeout=1800) for p in processes]
    for process, (_, err) in zip(processes, outputs, strict=True):
        if process.returncode != 0:
            raise RuntimeError(err[-3000:])
    return [out for out, _ in outputs]


def realtime_allowed() -> bool:
    return subprocess.run([*REALTIME, "true"], capture_output=True).returncode == 0


def layouts(pinned: bool, realtime: bool) -> dict[str, list[tuple[dict, list[str]]]]:
    """Row name -> (environment, command prefix) per process; `with_fresh_coordinator` gives a cluster its address."""
    rows = {"one process, two forced devices": [({"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}, [])]}
    process = lambda i: {"LIGHTSPEED_NUM_PROCESSES": "2", "LIGHTSPEED_PROCESS_ID": str(i)}
    pin = lambda i: ["taskset", "-c", str(i)]
    rows["two processes, unpinned"] = [(process(i), []) for i in range(2)]
    if pinned:
        rows["two processes, one core each"] = [(process(i), pin(i)) for i in range(2)]
    if realtime:
        rows["two processes, unpinned, SCHED_FIFO"] = [(process(i), REALTIME) for i in range(2)]
        if pinned:
            rows["two processes, one core each, SCHED_FIFO"] = [(process(i), pin(i) + REALTIME) for i in range(2)]
    return rows


WORKLOADS = {
    "Ape-X defaults": ("algo=apex",),
    "Ape-X, 4 batches of 512": ("algo=apex", "algo.batch_size=512", "algo.learner_updates_per_iteration=4"),
    "DQN, 10 seeds": ("algo=dqn", "num_seeds=10"),
}


def measure_run(processes: list[tuple[dict, list[str]]], overrides: tuple[str, ...], env_steps: int) -> dict:
    """One run.py command in the layout: env steps/s of all seeds and learner batches/s (if counted)."""
    run_dirs = [Path(tempfile.mkdtemp(prefix="bench_cluster_")) for _ in processes]
    run = ["run.py", *overrides, "env=cartpole", f"total_env_steps={env_steps}", f"eval_every={env_steps // 2}",
           f"log_every={env_steps // 4}", "progress=false", "compilation_cache=null"]
    finish([launch([*run, f"hydra.run.dir={d}"], env, prefix)
            for d, (env, prefix) in zip(run_dirs, with_fresh_coordinator(processes), strict=True)])
    summary = json.loads((run_dirs[0] / "summary.json").read_text())
    last = json.loads((run_dirs[0] / "metrics.jsonl").read_text().splitlines()[-1])
    for directory in run_dirs:
        shutil.rmtree(directory, ignore_errors=True)
    return {"env_steps_per_second": summary["env_steps_per_second"], "devices": summary["num_devices"],
            "batches_per_second": last.get("perf/learner_updates_per_second")}


def measure_collective(processes: list[tuple[dict, list[str]]]) -> float:
    workers = finish([launch([str(Path(__file__).resolve()), "--collective-worker"], env, prefix)
                      for env, prefix in with_fresh_coordinator(processes)])
    return 1e3 * float(workers[0].strip().splitlines()[-1])


def with_fresh_coordinator(processes: list[tuple[dict, list[str]]]) -> list[tuple[dict, list[str]]]:
    """A cluster's processes with a coordinator address of their own: every launch meets on a new port."""
    if "LIGHTSPEED_NUM_PROCESSES" not in processes[0][0]:
        return processes
    address = f"127.0.0.1:{free_port()}"
    return [({**env, "LIGHTSPEED_COORDINATOR": address}, prefix) for env, prefix in processes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-steps", type=int, default=81_920, help="Ape-X rows")
    parser.add_argument("--dqn-env-steps", type=int, default=204_800, help="DQN rows, per seed")
    parser.add_argument("--skip-pinned", action="store_true")
    parser.add_argument("--skip-realtime", action="store_true", help="no SCHED_FIFO rows")
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--collective-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.collective_worker:
        print(collective_seconds())
        return
    print_machine("lightspeed across processes")
    realtime = not args.skip_realtime and realtime_allowed()
    if not args.skip_realtime and not realtime:
        print("SCHED_FIFO rows skipped: `chrt -f 1` is not allowed here (needs root or CAP_SYS_NICE)")
    rows = layouts(not args.skip_pinned, realtime)
    table = []
    for workload in args.workloads:
        overrides = WORKLOADS[workload]
        env_steps = args.dqn_env_steps if "algo=dqn" in overrides else args.env_steps
        results = {name: measure_run(processes, overrides, env_steps) for name, processes in rows.items()}
        reference = results["one process, two forced devices"]["env_steps_per_second"]
        for name, r in results.items():
            batches = r["batches_per_second"]
            table.append([workload, name, f"{r['devices']}", f"{r['env_steps_per_second']:,.0f}",
                          f"{r['env_steps_per_second'] / reference:.0%}",
                          "-" if batches is None else f"{batches:,.1f}"])
    print_table(f"CartPole, Ape-X {args.env_steps:,} env steps (one seed, two learners), DQN {args.dqn_env_steps:,} "
                "per seed", ["workload", "layout", "devices", "env steps/s", "of one process", "learner batches/s"],
                table)
    print_table(f"One all-reduce alone: a pmean of {GRADIENT_FLOATS:,} floats, in a scan of {PMEANS}",
                ["layout", "ms per pmean"],
                [[name, f"{measure_collective(processes):.3f}"] for name, processes in rows.items()])


if __name__ == "__main__":
    main()
