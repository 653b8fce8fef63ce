"""A run killed with SIGKILL and resumed ends bit-identical to one that was never interrupted."""
import json
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp

from conftest import ROOT, run_cli

RUN = ("algo=dqn", "env=cartpole", "num_seeds=2", "total_env_steps=120000", "log_every=4000", "eval_every=8000",
       "eval_episodes=4", "checkpoint.every=4000", "checkpoint.keep=2", "algo.learning_starts=500")
WALL_CLOCK_KEYS = {"wall_seconds", "env_steps_per_second"}


def _final_state(run_dir):
    steps = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    return steps[-1], ocp.StandardCheckpointer().restore((run_dir / "checkpoints" / str(steps[-1]) / "state").absolute())


def _metrics(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in WALL_CLOCK_KEYS} for line in lines]


def _kill_after_first_checkpoint(run_dir):
    args = [sys.executable, str(ROOT / "run.py"), *RUN, "progress=false", f"hydra.run.dir={run_dir}"]
    process = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    checkpoints = run_dir / "checkpoints"
    while time.time() < deadline and process.poll() is None:
        if checkpoints.exists() and any(p.name.isdigit() for p in checkpoints.iterdir()):
            break
        time.sleep(0.02)
    assert process.poll() is None, f"the run ended before it could be killed: {process.stderr.read()}"
    process.send_signal(signal.SIGKILL)
    process.wait()


def test_sigkill_then_resume_is_bit_identical(tmp_path):
    uninterrupted, interrupted = tmp_path / "uninterrupted", tmp_path / "interrupted"
    result = run_cli(*RUN, run_dir=uninterrupted)
    assert result.returncode == 0, result.stderr

    _kill_after_first_checkpoint(interrupted)
    assert not (interrupted / "summary.json").exists()
    result = run_cli(*RUN, "resume=true", run_dir=interrupted)
    assert result.returncode == 0, result.stderr

    step_a, state_a = _final_state(uninterrupted)
    step_b, state_b = _final_state(interrupted)
    assert step_a == step_b >= 120000
    leaves_a, leaves_b = jax.tree.leaves(state_a), jax.tree.leaves(state_b)
    assert len(leaves_a) == len(leaves_b) > 10
    for a, b in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(a, b)
    assert _metrics(interrupted) == _metrics(uninterrupted)


def test_resume_without_a_checkpoint_is_a_clear_error(tmp_path):
    result = run_cli("resume=true", run_dir=tmp_path, timeout=120)
    assert result.returncode == 2 and "resume" in result.stderr and "Traceback" not in result.stderr
