"""A plain (not editable) `pip install .` runs: conf/ ships inside the package and the `lightspeed` command works
from any folder, with nothing of the repository on its path."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("pyproject.toml", "README.md", "lightspeed", "framework", "algorithms", "envs", "conf")


def run_ok(*argv) -> str:
    """A setup command's stdout, after checking that it succeeded (its stderr in the failure)."""
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(map(str, argv))}\n{result.stderr[-3000:]}"
    return result.stdout


def dependency_dirs() -> list[str]:
    """Where this interpreter finds lightspeed's dependencies: its own site-packages, a venv's where the suite runs in
    one (`venv --system-site-packages` would expose the base interpreter's instead)."""
    return sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv with lightspeed installed from a wheel built of a copy of the source. Its dependencies are this
    interpreter's, named by path in a .pth file: as plain paths, whose own .pth files are not read, so this
    interpreter's editable lightspeed (a .pth and a finder there) is not seen. Nothing downloads; the repository
    itself is never on its path."""
    base = tmp_path_factory.mktemp("install")
    source = base / "source"
    source.mkdir()
    for name in SHIPPED:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, source / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                            if (ROOT / name).is_dir() else {}))
    wheels = base / "wheels"
    # the build backend is this interpreter's setuptools (the test extra asks for one that builds wheels alone)
    run_ok(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", wheels, source)
    shutil.rmtree(source)  # what runs now is what the install put in the venv
    venv = base / "venv"
    run_ok(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    site = run_ok(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip()
    (Path(site) / "dependencies.pth").write_text("\n".join(dependency_dirs()) + "\n")
    (wheel,) = wheels.glob("lightspeed-*.whl")
    run_ok(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel)
    return venv


def clean_env() -> dict:
    """This environment without a PYTHONPATH that could point back at the repository."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


PROBE = """
import importlib.metadata, importlib.util, json, sys
top_level = [name for name in ("framework", "algorithms", "envs", "conf") if importlib.util.find_spec(name)]
import lightspeed
import lightspeed.algorithms as algorithms, lightspeed.envs as envs, lightspeed.framework as framework
import lightspeed.framework.core.config as config
print(json.dumps({"top_level": top_level, "modules": [m.__file__ for m in (framework, algorithms, envs, lightspeed)],
                  "conf": str(config.CONF_DIR), "shipped": sorted(p.name for p in config.CONF_DIR.iterdir()),
                  "path": sys.path, "dist": str(importlib.metadata.distribution("lightspeed").locate_file(""))}))
"""


def test_the_installed_package_holds_its_config_and_no_repository_path(installed, tmp_path):
    seen = json.loads(subprocess.run([installed / "bin" / "python", "-c", PROBE], cwd=tmp_path, env=clean_env(),
                                     capture_output=True, text=True, check=True).stdout)
    site = installed / "lib"
    # the wheel's copy, with its metadata, in the venv: not the repository, nor this interpreter's editable install
    assert all(Path(module).is_relative_to(site) for module in seen["modules"]), seen["modules"]
    package = Path(seen["modules"][3]).parent
    assert [Path(module).parent.parent for module in seen["modules"][:3]] == [package] * 3  # all under lightspeed/
    assert Path(seen["dist"]).is_relative_to(site) and Path(seen["conf"]) == package / "conf"
    assert seen["top_level"] == []  # no generic top-level name is taken before lightspeed is imported
    assert not any(Path(entry).resolve() == ROOT for entry in seen["path"] if entry)
    assert {"config.yaml", "algo", "env", "algo_env", "logger", "distributed", "hydra", "sweep"} <= set(seen["shipped"])


def test_the_python_api_example_runs_in_a_project_with_its_own_envs_package(installed, tmp_path):
    """docs/python-api.md's worked example, in a folder whose envs/ is a regular package of its own, against the
    installed wheel: env.id=envs.hallway:Hallway-v0 finds the project's module."""
    from test_docs import blocks_of

    env_module, script = [block for block in blocks_of(ROOT / "docs" / "python-api.md") if block.lang == "python"]
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "__init__.py").write_text('"""This project\'s own environments."""\n')
    (tmp_path / env_module.save).write_text(env_module.code)
    (tmp_path / "train.py").write_text(script.code)
    result = subprocess.run([installed / "bin" / "python", "train.py"], cwd=tmp_path, env=clean_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "final returns per seed: [1.0, 1.0]" in result.stdout and "did you mean algo.learning_rate" in result.stdout
    assert json.loads((tmp_path / "runs" / "hallway" / "summary.json").read_text())["final_eval_return"] == 1.0


def test_the_lightspeed_command_runs_a_projects_own_env_from_its_folder(installed, tmp_path):
    """`lightspeed env=gymnasium env.id=envs.hallway:Hallway-v0` in a project folder whose envs/ package holds the env
    (docs/python-api.md's): the console script finds the folder's modules, as `python -c` would."""
    from test_docs import blocks_of

    env_module = next(block for block in blocks_of(ROOT / "docs" / "python-api.md") if block.lang == "python")
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "__init__.py").write_text("")
    (tmp_path / env_module.save).write_text(env_module.code)
    result = subprocess.run([installed / "bin" / "lightspeed", "algo=dqn", "env=gymnasium", "algo_env=dqn_gymnasium",
                             "env.id=envs.hallway:Hallway-v0", "total_env_steps=4000", "num_seeds=2",
                             "progress=false", "hydra.run.dir=here"], cwd=tmp_path, env=clean_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "here" / "summary.json").read_text())
    assert summary["final_eval_return"] == 1.0  # both seeds walk to the hallway's end on every greedy episode
    assert "python -m lightspeed.framework.tools.evaluate here" in result.stdout
    help_text = subprocess.run([installed / "bin" / "lightspeed", "--help"], cwd=tmp_path, env=clean_env(),
                               capture_output=True, text=True, timeout=60).stdout
    assert "algo: apex, d4pg, dqn, ppo, r2d2, tabular_q" in help_text and "lightspeed [group=option ...]" in help_text
