"""A plain (not editable) `pip install .` runs: conf/ ships inside the package and the `lightspeed` command works
from any folder, with nothing of the repository on its path."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("pyproject.toml", "README.md", "framework", "algorithms", "envs", "conf")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv with lightspeed installed from a copy of the source (its dependencies seen from this interpreter's
    site-packages, so nothing downloads); the repository itself is never on its path."""
    base = tmp_path_factory.mktemp("install")
    source = base / "source"
    source.mkdir()
    for name in SHIPPED:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, source / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                            if (ROOT / name).is_dir() else {}))
    venv = base / "venv"
    # no pip of its own: ensurepip's bundled setuptools would shadow the one that builds this pyproject
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps",
                    "--no-build-isolation", str(source)], check=True, capture_output=True, text=True)
    shutil.rmtree(source)  # what runs now is what the install put in the venv
    return venv


def clean_env() -> dict:
    """This environment without a PYTHONPATH that could point back at the repository."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def test_the_installed_package_holds_its_config_and_no_repository_path(installed, tmp_path):
    probe = ("import json, framework, framework.core.config as c; "
             "print(framework.__file__); print(c.CONF_DIR); "
             "print(json.dumps(sorted(p.name for p in c.CONF_DIR.iterdir())))")
    lines = subprocess.run([installed / "bin" / "python", "-c", probe], cwd=tmp_path, env=clean_env(),
                           capture_output=True, text=True, check=True).stdout.splitlines()
    site = installed / "lib"
    assert Path(lines[0]).is_relative_to(site) and Path(lines[1]) == Path(lines[0]).parent / "conf"
    shipped = set(json.loads(lines[2]))
    assert {"config.yaml", "algo", "env", "algo_env", "logger", "distributed", "hydra", "sweep"} <= shipped


def test_the_lightspeed_command_runs_from_another_folder(installed, tmp_path):
    result = subprocess.run([installed / "bin" / "lightspeed", "algo=tabular_q", "env=gridworld", "num_seeds=2",
                             "progress=false", "hydra.run.dir=here"], cwd=tmp_path, env=clean_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "here" / "summary.json").read_text())
    assert summary["final_eval_return"] == 1.0  # both seeds reach the goal on every greedy episode
    assert "python -m framework.tools.evaluate here" in result.stdout
    help_text = subprocess.run([installed / "bin" / "lightspeed", "--help"], cwd=tmp_path, env=clean_env(),
                               capture_output=True, text=True, timeout=60).stdout
    assert "algo: apex, d4pg, dqn, r2d2, tabular_q" in help_text and "lightspeed [group=option ...]" in help_text
