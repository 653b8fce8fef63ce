"""Shared test setup: repo root on the path, plugins registered, run.py and config helpers."""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lightspeed.framework.core.registry import load_plugins  # noqa: E402

load_plugins()

from lightspeed.framework.core.config import TrainConfig  # noqa: E402
from lightspeed.framework.core.devices import use_compilation_cache  # noqa: E402

# the tests' own programs in run.py's default cache, as their run.py subprocesses' are: a later session loads them
# instead of compiling (the first in-process train() of a worker turned it on anyway, for what followed in that worker);
# a cache named in the environment wins (bench/mutation.py keeps its mutants' programs out of the default one)
use_compilation_cache(os.environ.get("JAX_COMPILATION_CACHE_DIR") or TrainConfig.compilation_cache)

import subprocess  # noqa: E402

import forkserver  # noqa: E402
import pytest  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker (not the controller, which runs no test): import while collecting
    forkserver.start_server()

# the module whose fixture runs ~2 minutes of cluster scenarios goes first: pytest-xdist hands the start of the
# list to one worker, so it starts at once instead of last, alone, after everything else has run
STARTED_FIRST = ("test_ray_actors.py",)


def pytest_collection_modifyitems(items: list) -> None:
    items.sort(key=lambda item: item.path.name not in STARTED_FIRST)  # stable: the order within stays


def run_cli(*overrides: str, run_dir: Path | None = None, env: dict | None = None,
            timeout: int = 300) -> subprocess.CompletedProcess:
    """`python run.py OVERRIDES` in a subprocess, progress bar off, output in `run_dir`."""
    run_dir_override = [] if run_dir is None else [f"hydra.run.dir={run_dir}"]
    return run_python(*overrides, "progress=false", *run_dir_override, env=env, timeout=timeout)


def deterministic_metrics(run_dir: Path) -> list[dict]:
    """metrics.jsonl without what depends on the clock (the perf/ namespace: wall seconds, rates)."""
    import json

    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
            for line in lines]


@pytest.fixture
def cli():
    return run_cli


def compose_config(*overrides: str):
    """The composed Hydra config, as run.py would build it, for in-process training."""
    from hydra import compose, initialize_config_dir

    from lightspeed.framework.core.config import CONF_DIR, register_schemas

    register_schemas()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3", job_name="test"):
        return compose("config", overrides=[*overrides, "progress=false"])


def check_like_run_py(overrides: list[str]) -> None:
    """What run.py does before compiling: the command-line checks, then the schema checks and the build."""
    from lightspeed.framework.anakin.trainer import build
    from lightspeed.framework.app.cli import check_composes, check_group_choices, with_open_keys_added
    from lightspeed.framework.core.config import register_schemas, validated

    register_schemas()
    overrides = with_open_keys_added(overrides)
    check_group_choices(overrides)
    build(validated(check_composes(overrides)))


def start_python(*args: str, module: str | None = None, script: Path | None = None, cwd: Path = ROOT,
                 env: dict | None = None) -> subprocess.Popen:
    """`python run.py ARGS` (or `python -m MODULE ARGS`, `python SCRIPT ARGS`) started in `cwd` with `env` added to
    this process's environment; its stdout and stderr captured, as text."""
    argv = ["-m", module, *args] if module else [str(script or ROOT / "run.py"), *args]
    return forkserver.popen(argv, cwd, {**os.environ, **(env or {})})  # run.py and the tools: forked, see there


def run_python(*args: str, module: str | None = None, script: Path | None = None, cwd: Path = ROOT,
               env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """start_python's command run to its end, as subprocess.run(..., capture_output=True, text=True, timeout=...)."""
    return finish(start_python(*args, module=module, script=script, cwd=cwd, env=env), timeout)


def finish(process, timeout: int) -> subprocess.CompletedProcess:
    """A started command's end, as subprocess.run(..., capture_output=True, timeout=...) gives it."""
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def shared_dir(tmp_path_factory, name: str, make) -> Path:
    """A directory that `make(directory)` fills once per test session, whichever pytest-xdist worker asks first
    (a module-scoped fixture runs once per worker that runs one of its tests); a worker that asks while another
    fills it waits. Tests read it; one that changes what it holds works on a copy."""
    import fcntl
    import shutil

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the session's dir, shared by workers
    directory, done = root / f"shared-{name}", root / f"shared-{name}.done"
    with open(root / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            make(directory)
            done.touch()
    return directory
