"""Ape-X learners across devices (forced CPU devices) and across two processes on 127.0.0.1, and
DQN's independent seeds split over two processes."""
import json
import os
import socket
import time

import jax
import numpy as np
import pytest
from conftest import ROOT, run_python, start_python

FOUR_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
# the runs keep run.py's default compilation cache: a resumed cluster, or a later session, loads what one compiled
SHORT_APEX = ("algo=apex", "env=cartpole", "algo.num_actors=2", "algo.envs_per_actor=4", "algo.learning_starts=64",
              "algo.learner_updates_per_iteration=4", "total_env_steps=2048", "eval_every=1024", "log_every=1024",
              "eval_episodes=2", "checkpoint.every=1024", "progress=false")


@pytest.fixture(scope="module")
def on_devices() -> dict:
    result = run_python(script=ROOT / "tests" / "apex_on_devices.py", env=FOUR_DEVICES, timeout=600)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("count", ["two", "four"])
def test_parameters_bit_identical_on_every_device(on_devices, count):
    run = on_devices[count]
    assert run["shape"][:2] == [{"two": 2, "four": 4}[count], 2]  # [device, seed, ...]
    assert run["learner_updates"] == [[20, 20]] * run["shape"][0]
    assert run["params_spread"] == 0.0 and run["target_spread"] == 0.0
    assert run["obs_spread"] > 0.0  # while every device's actors see their own episodes


def test_two_device_update_matches_one_device_maths(on_devices):
    math = on_devices["math"]
    assert math["params_moved"] > 1e-3  # the comparison is of a real step
    assert math["gradient_difference"] <= 1e-6 * max(1.0, math["gradient_scale"])
    assert math["params_difference"] <= 1e-6


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _restore_params(run_dir):
    import orbax.checkpoint as ocp

    manager = ocp.CheckpointManager(run_dir / "checkpoints")
    state = manager.restore(manager.latest_step(), args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
    return state["learner"]["train_state"]["params"]


def _run_cluster(run_dirs, *overrides, command=SHORT_APEX):
    """The same run.py command in two processes joined through the LIGHTSPEED_* variables."""
    cluster = {"LIGHTSPEED_COORDINATOR": f"127.0.0.1:{_free_port()}", "LIGHTSPEED_NUM_PROCESSES": "2"}
    processes = [start_python(*command, *overrides, f"hydra.run.dir={run_dirs[i]}",
                              env={**cluster, "LIGHTSPEED_PROCESS_ID": str(i)}) for i in range(2)]
    outputs = [process.communicate(timeout=600) for process in processes]
    assert [p.returncode for p in processes] == [0, 0], [err[-2000:] for _, err in outputs]


def test_two_processes_train_one_model_and_only_the_first_writes(tmp_path):
    run_dirs = [tmp_path / f"process{i}" for i in range(2)]
    _run_cluster(run_dirs)
    summary = json.loads((run_dirs[0] / "summary.json").read_text())
    assert summary["num_devices"] == 2 and summary["env_steps"] == 2048
    records = [json.loads(line) for line in (run_dirs[0] / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and records[-1]["perf/learner_updates_per_second"] > 0
    assert not any((run_dirs[1] / name).exists()
                   for name in ("metrics.jsonl", "summary.json", "checkpoints", "config.yaml"))
    # process 0's checkpoint holds both processes' learners: [device, seed, ...], the same on each
    leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(_restore_params(run_dirs[0]))]
    assert leaves[0].shape[0] == 2
    for leaf in leaves:
        np.testing.assert_array_equal(leaf[0], leaf[1])

    # resumed: process 0 reads the checkpoint and hands process 1 its device's block
    _run_cluster(run_dirs, "resume=true", "total_env_steps=3072")
    assert len((run_dirs[0] / "metrics.jsonl").read_text().splitlines()) == 3
    resumed = [np.asarray(leaf) for leaf in jax.tree.leaves(_restore_params(run_dirs[0]))]
    for leaf, before in zip(resumed, leaves, strict=True):
        np.testing.assert_array_equal(leaf[0], leaf[1])
        assert leaf.shape == before.shape
    assert not (run_dirs[1] / "metrics.jsonl").exists()


SHORT_DQN = ("algo=dqn", "env=cartpole", "num_seeds=2", "total_env_steps=2048", "eval_every=2048", "log_every=2048",
             "eval_episodes=2", "progress=false")


def test_two_processes_split_independent_seeds(tmp_path):
    # DQN's seeds go one to each process's device; both get the keys the run's seed gives them, so
    # the cluster ends exactly where one process with two devices does (no collective in the update)
    run_dirs = [tmp_path / f"process{i}" for i in range(2)]
    _run_cluster(run_dirs, command=SHORT_DQN)
    summary = json.loads((run_dirs[0] / "summary.json").read_text())
    assert summary["num_devices"] == 2 and summary["env_steps"] == 2048
    returns = [seed["final_eval_return"] for seed in summary["seeds"]]
    assert len(returns) == 2 and returns[0] != returns[1]
    assert not (run_dirs[1] / "summary.json").exists()

    one_process = tmp_path / "one_process"
    result = run_python(*SHORT_DQN, f"hydra.run.dir={one_process}", timeout=600,
                        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert result.returncode == 0, result.stderr
    alone = json.loads((one_process / "summary.json").read_text())
    assert alone["num_devices"] == 2
    assert [seed["final_eval_return"] for seed in alone["seeds"]] == returns
    best = lambda run: [seed["best_eval_return"] for seed in run["seeds"]]
    assert best(alone) == best(summary)


LOOPBACK = {"tcp": ("0100007F",), "tcp6": ("00000000000000000000000001000000", "0000000000000000FFFF00000100007F")}


def _listening(pid: int) -> list[tuple[str, str, int]]:
    """(table, local address in hex, port) of every listening TCP socket the process holds."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = []
    for table in LOOPBACK:
        for line in open(f"/proc/net/{table}").read().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                found.append((table, address, int(port, 16)))
    return found


def test_a_cluster_on_loopback_listens_on_loopback_only(tmp_path):
    """The coordination service (unauthenticated gRPC) and gloo's pairs: no socket on another interface."""
    port = _free_port()
    cluster = {"LIGHTSPEED_COORDINATOR": f"127.0.0.1:{port}", "LIGHTSPEED_NUM_PROCESSES": "2"}
    command = ("algo=dqn", "num_seeds=2", "total_env_steps=1000000", "compilation_cache=null", "progress=false")
    processes = [start_python(*command, f"hydra.run.dir={tmp_path / str(i)}",
                              env={**cluster, "LIGHTSPEED_PROCESS_ID": str(i)}) for i in range(2)]
    try:
        deadline, sockets = time.time() + 120, []
        while time.time() < deadline and all(p.poll() is None for p in processes):
            sockets = [s for p in processes for s in _listening(p.pid)]
            if any(s[2] == port for s in sockets) and len(sockets) >= 3:  # the coordinator and both gloo listeners
                break
            time.sleep(0.2)
        assert any(s[2] == port for s in sockets), sockets
        assert all(address in LOOPBACK[table] for table, address, _ in sockets), sockets
    finally:
        for p in processes:
            p.kill()
            p.wait()
