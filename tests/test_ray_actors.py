"""actors=ray: Ray actor processes on a two-node cluster feed the driver's learner (framework/sebulba/ray/actors.py).

tests/ray_scenarios.py runs the scenarios inside a private network namespace (`unshare -n`, loopback brought up), so
nothing it starts is reachable from outside; each test reads one scenario's outcome. The default suite runs the
cluster's lockstep, wrong-token and actor-kill scenarios (~2 minutes); the lost node and the local heads stopped by
signals or run back to back (~5 minutes more) are `slow`. The listener test alone runs in the host namespace, against
docs/ray.md's table.
"""
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import flax.serialization
import jax
import numpy as np
import pytest
from conftest import ROOT

from lightspeed.framework.core.config import RayConfig
from lightspeed.framework.core.errors import ConfigError
from lightspeed.framework.sebulba.ray.cluster import check_ports_free

SCENARIOS = ROOT / "tests" / "ray_scenarios.py"


def in_private_namespace_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


DEFAULT_SCENARIOS = ("lockstep", "sigkill")  # lockstep also runs the wrong-token driver
SLOW_SCENARIOS = ("node_removal", "driver_killed", "sigterm_resume", "ctrl_c", "back_to_back")


def run_scenarios(out: Path, names: tuple[str, ...]) -> None:
    """The scenarios `names` into `out`, with the script's exit status and the end of its stderr in out/ran.json."""
    script = f"ip link set lo up && exec {sys.executable} {SCENARIOS} {out} {' '.join(names)}"
    result = subprocess.run(["unshare", "-n", "sh", "-c", script], capture_output=True, text=True, timeout=1500)
    (out / "ran.json").write_text(json.dumps({"returncode": result.returncode, "stderr": result.stderr[-4000:]}))


def scenario_outcomes(tmp_path_factory, names: tuple[str, ...]) -> dict:
    """The outcomes of the scenarios `names`, run once per pytest session: pytest-xdist workers that each get tests
    of this module share one run (under one lock for every set), for two runs at once would SIGKILL and count each
    other's actors."""
    if not in_private_namespace_works():
        pytest.skip("needs `unshare -n` (a private network namespace: root, or user namespaces)")
    xdist = "PYTEST_XDIST_WORKER" in os.environ  # under xdist, the parent of a worker's basetemp is the session's
    session = tmp_path_factory.getbasetemp().parent if xdist else tmp_path_factory.getbasetemp()
    out = session / f"ray_scenarios_{names[0]}"
    with open(session / "ray_scenarios.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "ran.json").exists():
            out.mkdir(exist_ok=True)
            run_scenarios(out, names)
    ran = json.loads((out / "ran.json").read_text())
    assert ran["returncode"] == 0, ran["stderr"]
    return {path.stem: json.loads(path.read_text()) for path in out.glob("*.json") if path.name != "ran.json"}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    return scenario_outcomes(tmp_path_factory, DEFAULT_SCENARIOS)


@pytest.fixture(scope="module")
def slow_outcomes(tmp_path_factory):
    return scenario_outcomes(tmp_path_factory, SLOW_SCENARIOS)


def final_policies(run_dir: str, num_seeds: int = 2) -> list:
    return [flax.serialization.msgpack_restore((ROOT / run_dir / "policies" / f"seed_{seed}" / "final.msgpack")
                                               .read_bytes()) for seed in range(num_seeds)]


def test_lockstep_on_two_nodes_equals_threads(outcomes):
    """3 Ray actors on both nodes, lockstep: the run the 3 actor threads of one process make."""
    result = outcomes["lockstep"]
    ray_run, threads_run = result["ray"], result["threads"]
    assert ray_run["returncode"] == 0, ray_run["output"]
    assert threads_run["returncode"] == 0, threads_run["output"]
    assert ray_run["summary"]["runtime"]["runtime/actor_nodes"] == 2
    assert ray_run["summary"]["runtime"]["runtime/actor_processes"] == 3
    for ray_seed, thread_seed in zip(*map(final_policies, result["dirs"]), strict=True):
        for a, b in zip(jax.tree.leaves(ray_seed), jax.tree.leaves(thread_seed), strict=True):
            if np.asarray(a).dtype.kind in "fiu":  # the arrays; the rest (names) equal
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
            else:
                assert a == b
    finals = [[seed["final_eval_return"] for seed in run["summary"]["seeds"]] for run in (ray_run, threads_run)]
    np.testing.assert_allclose(*finals, atol=1e-6)
    assert result["actors_left"] == 0


def test_ppo_on_ray_actors_learns_every_block_once_within_its_policy_lag(outcomes):
    """On-policy over the cluster, free running: 6 blocks, each learned by one round of 4 updates, acted with
    parameters at most runtime.max_policy_lag=4 updates behind the learner's when it learned them."""
    ppo = outcomes["lockstep"]["ppo"]
    assert ppo["returncode"] == 0, ppo["output"]
    runtime = ppo["summary"]["runtime"]
    assert runtime["runtime/actor_nodes"] == 2 and runtime["runtime/learner_updates"] == 6 * 4
    assert 0 <= runtime["runtime/policy_lag_max"] <= 4


def test_a_driver_with_the_wrong_token_is_refused(outcomes):
    result = outcomes["wrong_token"]
    assert result["returncode"] == 2 and result["summary"] is None
    assert "could not connect to the Ray cluster" in result["output"]
    # Ray refused the token (not a timeout), said in the paragraph; its C++ client's log of every try is kept out
    assert "refused this run's token" in result["output"] and "Authentication token is missing" in result["output"]
    assert "gcs_client" not in result["output"] and "Traceback" not in result["output"]
    assert result["output"].strip().splitlines()[-1].startswith("Invalid config: ray.address=")


def test_an_actor_killed_mid_run_is_replaced_and_the_run_ends_with_its_results(outcomes):
    result = outcomes["sigkill"]
    assert result["killed"], "no actor process was found to kill"
    assert result["returncode"] == 0, result["output"]
    summary = result["summary"]
    assert summary["env_steps"] == 4608 and len(summary["seeds"]) == 2
    assert all(np.isfinite(seed["final_eval_return"]) for seed in summary["seeds"])
    runtime = summary["runtime"]
    assert runtime["runtime/actor_restarts"] == 1 and runtime["runtime/actor_processes"] == 3
    assert runtime["runtime/blocks_dropped"] >= 1  # blocks_in_flight=2: the dead process held some
    assert "actor slot" in result["output"] and "died" in result["output"]
    assert result["actors_left"] == 0


@pytest.mark.slow
def test_a_lost_node_is_a_log_line_and_fewer_actors(slow_outcomes):
    result = slow_outcomes["node_removal"]
    assert result["returncode"] == 0, result["output"]
    assert "moves to a live process" in result["output"]
    runtime = result["summary"]["runtime"]
    assert result["summary"]["env_steps"] == 4608
    assert runtime["runtime/actor_processes"] == 1 and runtime["runtime/actor_nodes"] == 1
    assert runtime["runtime/actor_restarts"] == 2  # the removed node's two slots, reopened on the head's process


@pytest.mark.slow
def test_a_sigkilled_driver_leaves_no_ray_process_it_started(slow_outcomes):
    result = slow_outcomes["driver_killed"]
    names = " ".join(result["running_before"])
    assert "gcs_server" in names and "raylet" in names and "ActorProcess" in names, names
    assert result["left"] == []


@pytest.mark.slow
def test_a_run_leaves_no_head_process_and_the_next_one_starts_at_once_on_the_same_ports(slow_outcomes):
    result = slow_outcomes["back_to_back"]
    for run in ("first", "second"):
        assert result[run]["returncode"] == 0, result[run]["output"]
        assert result[run]["summary"]["env_steps"] == 1536
        assert result[run]["left_at_exit"] == []  # looked at the moment run.py returned, not seconds later


def assert_stopped_with_a_checkpoint(result: dict, returncode: int, signal_name: str) -> None:
    """A local-head driver stopped mid-run by a signal: its exit, no traceback, the resume command last, its head's
    processes gone, and one checkpoint at the env steps it stopped at (of 3,072)."""
    assert result["returncode"] == returncode, result["output"]
    assert "Traceback" not in result["output"], result["output"]
    assert "resume=true" in result["output"].strip().splitlines()[-1]
    assert "ActorProcess" in " ".join(result["running_before"]) and result["left"] == []
    stopped = result["stopped_summary"]
    assert stopped["interrupted"] is True and stopped["interrupted_by"] == signal_name
    assert 0 < stopped["env_steps"] < 3072 and result["checkpoints"] == [str(stopped["env_steps"])]


@pytest.mark.slow
def test_a_sigtermed_driver_checkpoints_leaves_nothing_and_its_run_resumes_to_the_end(slow_outcomes):
    result = slow_outcomes["sigterm_resume"]
    assert_stopped_with_a_checkpoint(result, 143, "SIGTERM")
    resumed = result["resumed"]
    assert resumed["returncode"] == 0, resumed["output"]
    assert resumed["summary"]["interrupted"] is False and resumed["summary"]["env_steps"] == 3072
    assert result["left_after_resume"] == []


@pytest.mark.slow
def test_ctrl_c_stops_a_ray_run_with_a_checkpoint_and_leaves_nothing(slow_outcomes):
    """SIGINT to the driver's process group, as a terminal sends it: exit 130, the resume command last, a
    checkpoint at the steps it stopped at, none of its head's processes left (they run in a session of their own,
    so the signal reaches them only through the driver)."""
    assert_stopped_with_a_checkpoint(slow_outcomes["ctrl_c"], 130, "SIGINT")


def documented_listeners() -> list[dict]:
    """The rows of docs/ray.md's listener table: what, key, port or range, where it binds."""
    text = (ROOT / "docs" / "ray.md").read_text()
    section = text[text.index("## What a Ray head exposes"):]
    rows = re.findall(r"^\| ([^|]+) \| `([\w.]+)`(?:-`([\w.]+)`)? \| (\d+)(?:-(\d+))? \| ([^|]+) \|", section, re.M)
    return [{"what": what.strip(), "key": key, "low": int(low), "high": int(high or low), "binds": binds.strip()}
            for what, key, _, low, high, binds in rows]


def test_the_docs_list_every_listener_of_a_local_head(tmp_path):
    """In the host namespace: a local head started as a run starts it, with one actor; every socket it and the
    driver listen on is a row of docs/ray.md's table (port and bind address), and every always-on row is seen."""
    result = subprocess.run([sys.executable, str(SCENARIOS), str(tmp_path), "listeners"], capture_output=True,
                            text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads((tmp_path / "listeners.json").read_text())["listeners"]
    rows = documented_listeners()
    assert len(rows) >= 8
    config = RayConfig()
    for row in rows:  # the table's ports are the keys' defaults
        assert getattr(config, row["key"].removeprefix("ray.")) == row["low"], row
    every = {"::", "0.0.0.0"}
    for listener in seen:
        row = next((r for r in rows if r["low"] <= listener["port"] <= r["high"]), None)
        assert row is not None, f"not in docs/ray.md's table: {listener}"
        assert (listener["ip"] in every) == row["binds"].startswith("every interface"), (listener, row)
    always = [r for r in rows if "only with" not in r["binds"] and "not started" not in r["binds"]]
    for row in always:
        assert any(row["low"] <= listener["port"] <= row["high"] for listener in seen), f"nothing listens: {row}"


def test_a_pinned_port_in_use_is_a_config_error_naming_its_key():
    import socket

    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=r"ray\.object_manager_port"):
            check_ports_free(RayConfig(object_manager_port=port))


@pytest.mark.parametrize("missing", ["ray", "grpc"])
def test_ray_or_its_client_extra_missing_is_a_config_error_before_anything_starts(missing, monkeypatch):
    """A plain `pip install ray` has no grpcio, and its local head would refuse its client port with a traceback."""
    import importlib.util

    from lightspeed.framework.core.config import TrainConfig

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == missing else find_spec(name))
    expected = rf"actors='ray' \({missing} not installed\).*pip install \"lightspeed\[ray\]\" \(ray\[client\]\)"
    with pytest.raises(ConfigError, match=expected):
        TrainConfig(actors="ray").validate()


@pytest.mark.slow
@pytest.mark.parametrize("kill", [False, True], ids=["", "an actor process sigkilled half-way"])
def test_ten_free_running_seeds_on_two_nodes_end_solved(kill, tmp_path):
    """Ape-X's defaults, free running, 4 Ray actors over both nodes, 10 seeds of a base never tuned on: at least 9
    final greedy evaluations (100 episodes each) at or above 475, also when an actor process is SIGKILLed half-way
    (its slot restarted once, its blocks in flight dropped)."""
    if not in_private_namespace_works():
        pytest.skip("needs `unshare -n` (a private network namespace: root, or user namespaces)")
    script = (f"ip link set lo up && exec {sys.executable} {SCENARIOS} {tmp_path} ten_seeds 6061"
              + (" sigkill" if kill else ""))
    result = subprocess.run(["unshare", "-n", "sh", "-c", script], capture_output=True, text=True, timeout=2400)
    assert result.returncode == 0, result.stderr[-4000:]
    run = json.loads((tmp_path / ("ten_seeds_sigkill.json" if kill else "ten_seeds.json")).read_text())
    assert run["returncode"] == 0, run["output"]
    finals = [seed["final_eval_return"] for seed in run["summary"]["seeds"]]
    assert len(finals) == 10 and sum(final >= 475 for final in finals) >= 9, finals
    runtime = run["summary"]["runtime"]
    assert runtime["runtime/actor_nodes"] == 2
    if kill:
        assert run["killed_at"] >= 50_000 and runtime["runtime/actor_restarts"] == 1, (run["killed_at"], runtime)
        assert runtime["runtime/blocks_dropped"] >= 1 and runtime["runtime/actor_processes"] == 4, runtime


def test_an_actor_process_refuses_a_driver_of_other_versions():
    from lightspeed.framework.sebulba.ray.actors import ActorProcess
    from lightspeed.framework.sebulba.ray.cluster import versions

    driver = {**versions(), "jax": "0.0.1"}
    with pytest.raises(RuntimeError, match=r"the driver .*'jax': '0.0.1'.*lightspeed, jax and Python"):
        ActorProcess(None, driver)
