"""actors=ray on a two-node Ray cluster, run by tests/test_ray_actors.py inside a private network namespace
(`unshare -n`, loopback only): nothing it starts can be reached from outside.

    python tests/ray_scenarios.py OUT_DIR [SCENARIO ...]     # every scenario, or those named

One cluster (ray.cluster_utils.Cluster, token authentication on) for the first three scenarios, started only when one
of them is asked for; each scenario a `run.py` driver in a subprocess whose outcome is written to
OUT_DIR/<scenario>.json:

    lockstep        Ape-X on gymnasium CartPole with 3 Ray actors on both nodes, runtime.mode=lockstep, and the
                    same run with 3 actor threads: their final policies
    wrong_token     a driver joining with a token that is not the cluster's (run meanwhile)
    sigkill         a free-running run whose actor process is SIGKILLed after its first log line
    node_removal    a free-running run whose second node is removed after its first log line (the last scenario)
    driver_killed   a driver with a local head (ray.address=null) SIGKILLed mid-run (its process group, as every
                    stop below): what is left of its processes
    sigterm_resume  the same SIGTERMed mid-run: its exit, checkpoint and leftovers; then `resume=true` to the end
    ctrl_c          the same sent SIGINT, as a terminal's Ctrl-C sends it to its job's process group
    back_to_back    two local-head runs on the same pinned ports, the second started as soon as the first returned:
                    what is left of the first's head at that moment, and both outcomes

`python tests/ray_scenarios.py OUT_DIR ten_seeds SEED [sigkill]` runs only the slow check: Ape-X's defaults on 10
seeds, free running, 4 Ray actors over both nodes (OUT_DIR/ten_seeds.json); with `sigkill`, one actor process is
SIGKILLed once the run logs half its env steps (OUT_DIR/ten_seeds_sigkill.json).

`python tests/ray_scenarios.py OUT_DIR listeners` (in the host namespace: the one scenario that must see the
machine's interfaces) starts a local head as a run does, with one actor process, and writes every listening
socket of the head's session and of the driver to OUT_DIR/listeners.json.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["algo=apex", "env=gymnasium", "algo.num_actors=3", "algo.envs_per_actor=1", "algo.rollout_length=16",
         "algo.batch_size=32", "algo.learner_updates_per_iteration=4", "algo.learning_starts=256", "num_seeds=2",
         "eval_every=1536", "log_every=768", "eval_episodes=2", "final_eval_episodes=3", "progress=false"]
# PPO (on-policy), free running: 6 blocks of 3 envs x 32 steps, each learned by one round of 2 x 2 minibatches, acted
# with parameters at most one round (4 updates) behind
PPO_SMALL = ["algo=ppo", "env=gymnasium", "algo.num_envs=3", "algo.rollout_length=32", "algo.update_epochs=2",
             "algo.num_minibatches=2", "num_seeds=2", "total_env_steps=576", "eval_every=576", "log_every=288",
             "eval_episodes=2", "final_eval_episodes=2", "progress=false", "runtime.max_policy_lag=4"]
RAY = ["actors=ray", "ray.num_actors=3", "ray.num_cpus_per_actor=0.5", "ray.actor_resources.actor_slot=1",
       "runtime.timeout_s=60"]
# one actor slot on the head, two on the second node: actors on both nodes, and a removal loses two; PPO's run, beside
# Ape-X's in the lockstep scenario, has slots of its own (sharing three, each could hold some and wait for the rest)
HEAD_RESOURCES, NODE_RESOURCES = {"actor_slot": 1, "ppo_slot": 1}, {"actor_slot": 2, "ppo_slot": 2}
PPO_RAY = [option.replace("actor_slot", "ppo_slot") for option in RAY]
CLUSTER_SCENARIOS = ("lockstep", "sigkill", "node_removal")  # the rest start local heads: no cluster needed
# a lost node noticed within seconds, not Ray's default ~30 s
FAST_HEALTH_CHECKS = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 1000,
                      "health_check_failure_threshold": 3}


def driver(run_dir: Path, overrides: list[str], own_group: bool = False) -> subprocess.Popen:
    """`run.py` with `overrides`; `own_group`: as a shell starts a job, leader of a process group of its own. Every
    driver and actor process of one scenario run shares a compilation cache of its own (run_dir's parent is OUT_DIR):
    the first compiles, the rest load (sigkill's 24 s became 15 s), and nothing is kept in the user's cache."""
    command = [sys.executable, str(ROOT / "run.py"), *overrides, f"hydra.run.dir={run_dir}",
               f"compilation_cache={run_dir.parent / 'xla'}"]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=own_group)


def finish(process: subprocess.Popen, run_dir: Path, timeout: float = 600) -> dict:
    output, _ = process.communicate(timeout=timeout)
    summary = run_dir / "summary.json"
    return {"returncode": process.returncode, "output": output[-6000:],
            "summary": json.loads(summary.read_text()) if summary.exists() else None}


def wait_for_line(process: subprocess.Popen, needle: str, timeout: float = 300) -> str:
    """Read the driver's output until a line holds `needle`; what was read (the rest stays in the pipe)."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            break
    return "".join(seen)


def actor_processes() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if any("ActorProcess" in part for part in p.info["cmdline"]
                                                                or ())]


def leftovers(marker: str) -> list[str]:
    """Processes whose command line mentions `marker` (a local head's session dir), and actor processes."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(process.info["cmdline"] or ())
        if process.info["status"] != psutil.STATUS_ZOMBIE and (marker in cmdline or "ActorProcess" in cmdline):
            found.append(f"{process.pid} {cmdline[:120]}")
    return found


def lockstep(cluster_args: list[str], out: Path) -> dict:
    lock = ["runtime.mode=lockstep", "total_env_steps=1536"]
    ray_run = driver(out / "lockstep_ray", [*SMALL, *RAY, *cluster_args, *lock])
    wrong = driver(out / "wrong_token", [*SMALL, *RAY, *cluster_args[:1], f"ray.token_file={out / 'wrong_token.txt'}",
                                         "total_env_steps=768"])
    threads_run = driver(out / "lockstep_threads", [*SMALL, *lock, "runtime.num_actor_threads=3"])
    ppo_run = driver(out / "ppo_ray", [*PPO_SMALL, *PPO_RAY, *cluster_args])
    results = {"ray": finish(ray_run, out / "lockstep_ray"), "threads": finish(threads_run, out / "lockstep_threads"),
               "ppo": finish(ppo_run, out / "ppo_ray")}
    (out / "wrong_token.json").write_text(json.dumps(finish(wrong, out / "wrong_token")))
    results["dirs"] = [str(out / "lockstep_ray"), str(out / "lockstep_threads")]
    results["actors_left"] = len(actor_processes())
    return results


def sigkill(cluster_args: list[str], out: Path) -> dict:
    process = driver(out / "sigkill", [*SMALL, *RAY, *cluster_args, "total_env_steps=4608"])
    before = wait_for_line(process, "env steps")
    victims = actor_processes()
    if victims:
        victims[0].send_signal(signal.SIGKILL)
    result = finish(process, out / "sigkill")
    result.update(output=before + result["output"], killed=len(victims) > 0, actors_left=len(actor_processes()))
    return result


def node_removal(cluster, node, cluster_args: list[str], out: Path) -> dict:
    process = driver(out / "node_removal", [*SMALL, *RAY, *cluster_args, "total_env_steps=4608"])
    before = wait_for_line(process, "env steps")
    cluster.remove_node(node)
    result = finish(process, out / "node_removal")
    result.update(output=before + result["output"], actors_left=len(actor_processes()))
    return result


def ten_seeds(cluster_args: list[str], out: Path, seed: int, kill: bool) -> dict:
    """The slow check: Ape-X's defaults, free running, 10 seeds, 4 Ray actors over both nodes; `kill`: an actor
    process SIGKILLed at the first log line past half the run's env steps."""
    name = "ten_seeds_sigkill" if kill else "ten_seeds"
    overrides = ["algo=apex", "env=gymnasium", "num_seeds=10", f"seed={seed}", "progress=false", "actors=ray",
                 "ray.num_actors=4", "ray.num_cpus_per_actor=0.5", *cluster_args]
    process, before, killed_at = driver(out / name, overrides), "", None
    while kill and killed_at is None:
        line = wait_for_line(process, "env steps", timeout=1800)
        before += line
        logged = line.split("env steps")[0].split()
        if not logged:  # the run ended (or failed) before half-way
            break
        steps = int(logged[-1].replace(",", ""))
        if steps >= 50_000:  # half of the default 100k
            actor_processes()[0].send_signal(signal.SIGKILL)
            killed_at = steps
    result = finish(process, out / name, timeout=1800)
    result.update(output=before + result["output"], killed_at=killed_at)
    return result


def local_head_run(head_dir: Path, total_env_steps: int) -> list[str]:
    """A run whose driver starts its own local head (pinned ports, its own token) under `head_dir`."""
    return [*SMALL, "actors=ray", "ray.num_actors=3", "ray.num_cpus_per_actor=0.5", "ray.num_cpus=2",
            f"ray.temp_dir={head_dir}", f"total_env_steps={total_env_steps}"]


def stopped_mid_run(name: str, out: Path, sig: signal.Signals, total_env_steps: int, resume: bool = False) -> dict:
    """A local-head driver whose process group is sent `sig` at its first log line, as a terminal's Ctrl-C or a
    shell's `kill %1` sends it: its output, exit, summary and checkpoints, the processes of its head before and
    what is left of them 30 s later; `resume`: then the same run with resume=true, to its end."""
    run_dir = out / name
    head_dir = Path(tempfile.mkdtemp(prefix="lsh-", dir="/tmp"))  # short: Ray's unix sockets live under it
    process = driver(run_dir, local_head_run(head_dir, total_env_steps), own_group=True)
    before = wait_for_line(process, "env steps")
    running = leftovers(str(head_dir))
    os.killpg(process.pid, sig)
    rest, _ = process.communicate(timeout=300)
    deadline, left = time.monotonic() + 30, running
    while left and time.monotonic() < deadline:
        time.sleep(1)
        left = leftovers(str(head_dir))
    shutil.rmtree(head_dir, ignore_errors=True)  # a SIGKILLed driver could not remove it
    summary, checkpoints = run_dir / "summary.json", run_dir / "checkpoints"
    result = {"output": before + rest, "returncode": process.returncode, "running_before": running, "left": left,
              "stopped_summary": json.loads(summary.read_text()) if summary.exists() else None,
              "checkpoints": sorted(p.name for p in checkpoints.iterdir()) if checkpoints.exists() else []}
    if resume:
        head_dir = Path(tempfile.mkdtemp(prefix="lsh-", dir="/tmp"))
        resumed = driver(run_dir, [*local_head_run(head_dir, total_env_steps), "resume=true"])
        result["resumed"] = finish(resumed, run_dir)
        result["left_after_resume"] = leftovers(str(head_dir))
        shutil.rmtree(head_dir, ignore_errors=True)
    return result


def back_to_back(out: Path) -> dict:
    """Two local-head runs one right after the other (the same default ports): the first head's processes left
    the moment its driver returned, and both runs' outcomes."""
    result = {}
    for run in ("first", "second"):
        head_dir = Path(tempfile.mkdtemp(prefix="lsh-", dir="/tmp"))
        result[run] = finish(driver(out / f"back_to_back_{run}", local_head_run(head_dir, 1536)),
                             out / f"back_to_back_{run}")
        result[run]["left_at_exit"] = leftovers(str(head_dir))
        shutil.rmtree(head_dir, ignore_errors=True)
    return result


def listeners(out: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from lightspeed.framework.core.config import RayConfig
    from lightspeed.framework.sebulba.ray.cluster import connect

    ray, head = connect(RayConfig(num_cpus=2), timeout_s=60)
    try:
        actor = ray.remote(num_cpus=0.5)(Probe).remote()
        ray.get(actor.ping.remote(), timeout=60)
        session = psutil.Process(head.reaper.pid).children(recursive=True)  # the workers are the raylet's
        found = [{"name": process.name(), "cmdline": " ".join(process.cmdline())[:160], "ip": c.laddr.ip,
                  "port": c.laddr.port}
                 for process in [*session, psutil.Process()] for c in process.net_connections("inet")
                 if c.status == psutil.CONN_LISTEN]
    finally:
        ray.shutdown()
        head.stop()
    (out / "listeners.json").write_text(json.dumps({"listeners": found}))


class Probe:
    def ping(self) -> int:
        return os.getpid()


def main(out: Path, only: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if only == ["listeners"]:
        return listeners(out)
    token = out / "token.txt"
    token.write_text("lightspeed-test-token-" + os.urandom(8).hex())
    token.chmod(0o600)
    (out / "wrong_token.txt").write_text("not-the-cluster-token")
    if not only or only[0] == "ten_seeds" or set(only) & set(CLUSTER_SCENARIOS):
        on_a_cluster(out, token, only)
    run_and_write((("driver_killed", lambda: stopped_mid_run("driver_killed", out, signal.SIGKILL, 46080)),
                   ("sigterm_resume", lambda: stopped_mid_run("sigterm_resume", out, signal.SIGTERM, 3072,
                                                              resume=True)),
                   ("ctrl_c", lambda: stopped_mid_run("ctrl_c", out, signal.SIGINT, 3072)),
                   ("back_to_back", lambda: back_to_back(out))), only, out)


def on_a_cluster(out: Path, token: Path, only: list[str]) -> None:
    """The scenarios of a two-node cluster asked for (all when `only` is empty), or the ten-seed check."""
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token), RAY_USAGE_STATS_ENABLED="0",
                      RAY_enable_metrics_collection="0")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": HEAD_RESOURCES, "include_dashboard": False, "_system_config": FAST_HEALTH_CHECKS})
    node = cluster.add_node(num_cpus=2, resources=NODE_RESOURCES)
    cluster.wait_for_nodes()
    cluster_args = [f"ray.address={cluster.address}", f"ray.token_file={token}"]
    try:
        scenarios = (("lockstep", lambda: lockstep(cluster_args, out)),
                     ("sigkill", lambda: sigkill(cluster_args, out)),
                     ("node_removal", lambda: node_removal(cluster, node, cluster_args, out)))
        if only and only[0] == "ten_seeds":  # asked for alone (slow), with its seed base (and the kill)
            seed, kill = int(only[1]), only[2:] == ["sigkill"]
            only = ["ten_seeds_sigkill" if kill else "ten_seeds"]
            scenarios = ((only[0], lambda: ten_seeds(cluster_args, out, seed, kill)),)
        run_and_write(scenarios, only, out)
    finally:
        cluster.shutdown()


def run_and_write(scenarios: tuple, only: list[str], out: Path) -> None:
    """Each (name, scenario) asked for (all when `only` is empty), its outcome and seconds to OUT_DIR/<name>.json."""
    for name, scenario in scenarios:
        if only and name not in only:
            continue
        start = time.monotonic()
        result = scenario()
        result["seconds"] = time.monotonic() - start
        (out / f"{name}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])  # scenario names after the dir: only those
