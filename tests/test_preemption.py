"""SIGTERM (what SLURM and Kubernetes send before stopping a job) stops a run as Ctrl-C does: the running
chunk finishes, a checkpoint and summary.json are written, exit status 143, and resume=true continues."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, run_cli, start_python

# long enough to be still training when the signal comes, small enough to resume to the end in seconds
# (30 chunks of 2048 env steps: DQN's updates step 128 envs); no periodic checkpoints: the signal must write one
# no early stop (dqn_cartpole.yaml ends a solved seed): the run goes to total_env_steps
RUN = ("algo=dqn", "env=cartpole", "target_return=null",
       "total_env_steps=61440", "log_every=2048", "eval_every=4096", "eval_episodes=2",
       "final_eval_episodes=4", "algo.learning_starts=500", "checkpoint.every=0")


def _start(*args: str) -> subprocess.Popen:
    return start_python(*args, "progress=false")


def _wait_for_training(process: subprocess.Popen, metrics: Path) -> None:
    """Until the first metrics line is written (training has started); the run must still be going."""
    deadline = time.time() + 180
    while time.time() < deadline and process.poll() is None and not (metrics.exists() and metrics.stat().st_size):
        time.sleep(0.02)
    assert process.poll() is None, f"the run ended before it could be terminated: {process.communicate()[1]}"


def _terminate_once_training(process: subprocess.Popen, metrics: Path) -> tuple[str, str]:
    """SIGTERM as soon as training has started; the run's output."""
    _wait_for_training(process, metrics)
    process.send_signal(signal.SIGTERM)
    return process.communicate(timeout=180)


def _checkpoint_steps(run_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())


def test_sigterm_writes_a_checkpoint_and_the_summary_then_resume_finishes(tmp_path):
    process = _start(*RUN, f"hydra.run.dir={tmp_path}")
    stdout, stderr = _terminate_once_training(process, tmp_path / "metrics.jsonl")

    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr
    assert "SIGTERM: finishing this chunk" in stderr
    last_line = stderr.strip().splitlines()[-1]
    assert last_line.startswith("stopped by SIGTERM after") and str(tmp_path) in last_line
    assert f"resume=true hydra.run.dir={tmp_path}" in last_line and "total_env_steps=61440" in last_line
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["interrupted_by"] == "SIGTERM"
    assert 0 < summary["env_steps"] < 61440
    assert _checkpoint_steps(tmp_path) == [summary["env_steps"]]  # the signal's checkpoint, at the chunk it ended
    assert any(line.startswith("final greedy return") for line in stdout.splitlines())  # the interrupted run's result

    result = run_cli(*RUN, "resume=true", run_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] is False and summary["interrupted_by"] is None
    assert summary["env_steps"] == 61440 and _checkpoint_steps(tmp_path)[-1] == 61440
    env_steps = [json.loads(line)["env_steps"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert env_steps == list(range(2048, 61441, 2048))  # one line per log_every, none lost or repeated


def test_sigterm_stops_the_whole_sweep(tmp_path):
    process = _start("-m", *RUN, "seed=0,1", f"hydra.sweep.dir={tmp_path}")
    _, stderr = _terminate_once_training(process, tmp_path / "0" / "metrics.jsonl")

    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr
    assert "job 0 of the sweep" in stderr and f"hydra.run.dir={tmp_path / '0'}" in stderr
    assert "seed=0" in stderr.strip().splitlines()[-1]  # the job's own overrides, not the sweep's seed=0,1
    assert json.loads((tmp_path / "0" / "summary.json").read_text())["interrupted_by"] == "SIGTERM"
    assert not (tmp_path / "1").exists()  # the sweep's next job never started


# the host path: actor threads stepping gymnasium envs in 2 worker processes, a learner thread; 16,384 env steps
# (~3,000 a second here) leave seconds of training after the first log line, where the signal comes
HOST_RUN = ("algo=dqn", "env=gymnasium", "env.num_workers=2", "total_env_steps=16384", "log_every=2048",
            "eval_every=8192", "eval_episodes=2", "final_eval_episodes=2", "checkpoint.every=0")


def test_sigterm_on_the_host_path_stops_every_worker_checkpoints_and_resumes(tmp_path):
    import psutil

    process = _start(*HOST_RUN, f"hydra.run.dir={tmp_path}")
    _wait_for_training(process, tmp_path / "metrics.jsonl")
    workers = psutil.Process(process.pid).children(recursive=True)  # the forkserver and the env workers
    assert workers, "the run started no env worker"
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=180)

    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr and f"resume=true hydra.run.dir={tmp_path}" in stderr.strip().splitlines()[-1]
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, f"left behind: {alive}"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["interrupted_by"] == "SIGTERM"
    assert 0 < summary["env_steps"] < 16384 and _checkpoint_steps(tmp_path) == [summary["env_steps"]]

    result = run_cli(*HOST_RUN, "resume=true", run_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] is False and summary["env_steps"] == 16384


SIGNALLED_TWICE = """import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from lightspeed.framework.run.common import StopRequest
with StopRequest() as stop:
    os.kill(os.getpid(), signal.SIG{name})
    time.sleep(0.2)  # the first one handled: a stop requested, the loop would finish its chunk
    assert stop.requested
    os.kill(os.getpid(), signal.SIG{name})
    time.sleep(10)
"""


@pytest.mark.parametrize("name, status", [("INT", 130), ("TERM", 143)])
def test_a_second_signal_aborts_in_one_line(name, status, tmp_path):
    """Ctrl-C (or SIGTERM) twice: the first asks for a checkpoint after the chunk, the second ends the process at
    once with the shell's status for the signal and one line saying so, no traceback."""
    script = tmp_path / "twice.py"
    script.write_text(SIGNALLED_TWICE.replace("{name}", name))
    result = subprocess.run([sys.executable, str(script), str(ROOT)], capture_output=True, text=True, timeout=60)
    assert result.returncode == status, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and "finishing this chunk" in lines[0] and "Traceback" not in result.stderr, lines
    assert "again: aborted at once" in lines[1] and "atomically" in lines[1]
