"""tests/forkserver.py: a forked command does what a fresh interpreter does, and what it cannot match starts one."""
import os
import subprocess
import sys

import forkserver
import pytest
from conftest import ROOT, finish

pytestmark = pytest.mark.skipif(not forkserver.ENABLED, reason="LIGHTSPEED_TESTS_FORK=0")

RUN_PY = str(ROOT / "run.py")


def fresh(argv: list[str], cwd=ROOT, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env or dict(os.environ), capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("argv", [[RUN_PY, "algo=nope"], [RUN_PY, "env=gridworld", "env.goal=[8,0]", "algo=tabular_q"],
                                  ["-m", "lightspeed.framework.tools.evaluate", "no/such/run"]],
                         ids=["unknown algo", "bad cell", "evaluate without a run"])
def test_a_forked_command_prints_and_exits_as_a_fresh_interpreter(argv, tmp_path):
    forkserver.start_server()
    assert forkserver._server.mismatch(argv, ROOT, dict(os.environ)) is None
    process = forkserver.popen(argv, ROOT, dict(os.environ))
    assert isinstance(process, forkserver.ForkedProcess)
    forked, expected = finish(process, 120), fresh(argv)
    assert (forked.returncode, forked.stdout, forked.stderr) == (expected.returncode, expected.stdout, expected.stderr)
    assert forked.returncode == 2


def test_a_signal_ends_it_as_it_ends_a_fresh_interpreter():
    process = forkserver.popen([RUN_PY, "algo=tabular_q", "env=gridworld", "total_env_steps=100000000"], ROOT,
                               dict(os.environ))
    process.kill()
    assert finish(process, 60).returncode == -9  # Popen's way: minus the signal's number


@pytest.mark.parametrize("env, argv", [({"JAX_ENABLE_X64": "1"}, [RUN_PY, "algo=nope"]),
                                       ({"PYTHONPATH": "/elsewhere"}, [RUN_PY, "algo=nope"]),
                                       ({}, ["-m", "json.tool", "--help"])],
                         ids=["read by jax at import", "another path", "not one of the tools"])
def test_what_a_fork_cannot_match_starts_a_fresh_interpreter(env, argv):
    process = forkserver.popen(argv, ROOT, {**os.environ, **env})
    assert isinstance(process, subprocess.Popen)
    process.communicate(timeout=120)


def test_what_only_a_later_import_or_no_library_reads_is_forked():
    forkserver.start_server()
    env = {**os.environ, "LD_LIBRARY_PATH": "/no/such/dir", "WANDB_MODE": "offline", "XLA_FLAGS": "--xla_dump_to=x"}
    assert forkserver._server.mismatch([RUN_PY, "algo=nope"], ROOT, env) is None
