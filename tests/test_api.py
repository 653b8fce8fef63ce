"""`import lightspeed`: train() runs what the command line runs and returns what the run ended with; bad input is
refused before compiling with no run dir left; the old top-level import names resolve to lightspeed's modules
only where a project has no package of that name; resume=true must name the run it continues."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, run_cli, run_python
from hydra.core.override_parser.overrides_parser import OverridesParser

import lightspeed
from lightspeed.framework.app.api import as_overrides, override_value

VALUES = [True, False, None, 3, -2, 0.001, 1e-8, 2.5, "CartPole-v1", "envs.hallway:Hallway-v0", "two words",
          "it's", "ends\\", "q\\'", "a,b", "true", "null", "path/to/x", "[1]", "={}", "back\\slash", [1, 2],
          ["a", "b c"], {"x": 1, "y": "z w"}, np.float32(0.5), np.int64(7), Path("runs/a")]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_a_setting_reads_back_as_itself_in_hydras_grammar(value):
    parsed = OverridesParser.create().parse_override(f"key={override_value(value)}").value()
    expected = str(value) if isinstance(value, Path) else value.item() if isinstance(value, np.generic) else value
    assert parsed == expected and type(parsed) is type(expected)


def test_settings_become_the_command_lines_overrides():
    overrides = as_overrides("dqn", "gymnasium", {"num_seeds": 3, "algo.learning_rate": 1e-3, "algo_env": None,
                                                 "runtime": {"mode": "lockstep", "num_actor_threads": 2},
                                                 "env.kwargs": {"max_speed": 2}})
    assert overrides == ["algo=dqn", "env=gymnasium", "num_seeds=3", "algo.learning_rate=0.001", "~algo_env",
                         "runtime.mode=lockstep", "runtime.num_actor_threads=2", "env.kwargs={max_speed:2}"]
    with pytest.raises(lightspeed.ConfigError, match="a set cannot be written as a config value"):
        override_value({1, 2})


@pytest.fixture(scope="module")
def gridworld_run(tmp_path_factory) -> "lightspeed.Run":
    return lightspeed.train("tabular_q", "gridworld", run_dir=tmp_path_factory.mktemp("api") / "grid",
                            num_seeds=2, progress=False, total_env_steps=2_000_000)


def test_train_returns_what_the_run_dir_holds(gridworld_run):
    run = gridworld_run
    assert run.summary == json.loads((run.run_dir / "summary.json").read_text())
    assert run.final_returns == [1.0, 1.0] and run.final_return == 1.0 and not run.interrupted
    assert "settings:" not in (run.run_dir / "run.log").read_text().splitlines()[0]  # tabular_q_gridworld: no file
    assert run.evaluate(episodes=4).shape == (2, 4)
    assert np.array_equal(lightspeed.evaluate(run.run_dir, episodes=4), run.evaluate(episodes=4))
    policy = run.policy(seed_index=1)
    assert isinstance(policy, lightspeed.LoadedPolicy) and policy(np.array([0, 0], np.int32)) in range(4)


def test_train_refuses_bad_input_before_compiling_and_leaves_no_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(lightspeed.ConfigError, match=r"did you mean algo\.learning_rate\b"):
        lightspeed.train("dqn", "cartpole", **{"algo.learning_rat": 1e-3})
    with pytest.raises(lightspeed.ConfigError, match="did you mean dqn"):
        lightspeed.train("dqm", "cartpole")
    with pytest.raises(lightspeed.ConfigError, match="batch_size"):  # learning could never start: refused in train
        lightspeed.train("dqn", "cartpole", run_dir="runs/never", total_env_steps=1000, **{"algo.batch_size": 50_000})
    with pytest.raises(lightspeed.ConfigError, match="resume=True with run_dir="):
        lightspeed.train("dqn", "cartpole", resume=True)
    assert list(tmp_path.iterdir()) == []


def test_the_command_line_refuses_resume_without_the_dir_it_continues(tmp_path):
    result = run_cli("algo=dqn", "env=cartpole", "resume=true")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "resume=true with hydra.run.dir=<the dir of the run to continue>" in result.stderr
    result = run_cli("algo=dqn", "env=cartpole", "resume=true", run_dir=tmp_path / "never_ran")
    assert result.returncode == 2 and "none in" in result.stderr
    assert not (tmp_path / "never_ran").exists()  # no checkpoints/ folder made by looking for one


def python_in(folder: Path, code: str, *flags: str) -> subprocess.CompletedProcess:
    """`code` run by a fresh interpreter in `folder`, with this checkout importable as an installed lightspeed is
    (on the path after the folder itself, as site-packages is)."""
    return subprocess.run([sys.executable, *flags, "-c", textwrap.dedent(code)],
                          cwd=folder, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_a_projects_own_envs_and_algorithms_packages_win_over_the_old_names(tmp_path):
    for package in ("envs", "algorithms"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(f"MINE = {package!r}\n")
    (tmp_path / "envs" / "hallway.py").write_text("WHERE = 'mine'\n")
    result = python_in(tmp_path, """
        import lightspeed, lightspeed.envs, lightspeed.framework.core.registry as registry
        import envs, envs.hallway, algorithms
        assert envs.MINE == "envs" and envs.hallway.WHERE == "mine" and algorithms.MINE == "algorithms"
        assert "cartpole" in registry.known("env") and lightspeed.envs is not envs
        print("ok")
        """, "-W", "error::DeprecationWarning")  # no old name resolved to lightspeed's
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr


def test_the_old_names_are_lightspeeds_own_modules_where_no_package_has_them(tmp_path):
    result = python_in(tmp_path, """
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import lightspeed
            from framework.core.registry import register_algorithm
            from framework.registry import register_env
            import envs
        import lightspeed.framework.core.registry as registry
        assert register_algorithm is registry.register_algorithm and register_env is registry.register_env
        assert envs is lightspeed.envs and "cartpole" in registry.known("env")
        print(sorted({str(w.message).split(" moved")[0] for w in caught if w.category is DeprecationWarning}))
        """)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "['envs', 'framework', 'framework.core', 'framework.core.registry', 'framework.registry']\n"


def test_a_checkout_package_imported_by_its_old_name_first_is_not_a_second_copy():
    """From the repository root, `import envs` before lightspeed finds the folder itself: it becomes lightspeed.envs
    (one registry, one set of classes), not a second module of the same files."""
    result = python_in(ROOT, """
        import envs
        import lightspeed.envs
        from framework.core.algorithm import Algorithm
        import lightspeed.framework.core.algorithm as algorithm
        assert envs is lightspeed.envs and Algorithm is algorithm.Algorithm
        print("ok")
        """)
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr


def test_a_gymnasium_id_the_settings_were_not_tuned_for_gets_the_algorithms_own_defaults():
    """dqn_gymnasium.yaml is tuned for CartPole-v1: Acrobot-v1 gets DQNConfig's learning rate, and the first line
    says why; naming the file applies it anyway."""
    from lightspeed.algorithms.dqn import DQNConfig

    def learning_rate(*overrides: str) -> float:
        result = run_python("algo=dqn", "env=gymnasium", *overrides, "--cfg", "job")
        assert result.returncode == 0, result.stderr
        return float(next(line.split(":")[1] for line in result.stdout.splitlines()
                          if line.startswith("  learning_rate:")))

    assert learning_rate() == 0.01  # CartPole-v1: dqn_cartpole.yaml's
    assert learning_rate("env.id=Acrobot-v1") == DQNConfig.learning_rate != 0.01
    assert learning_rate("env.id=Acrobot-v1", "algo_env=dqn_gymnasium") == 0.01
    result = run_cli("algo=dqn", "env=gymnasium", "env.id=Acrobot-v1", "total_env_steps=256", "eval_every=256",
                     "algo.learning_starts=64", "final_eval_episodes=1", "eval_episodes=1")
    assert result.stdout.splitlines()[0] == (
        "settings: none (conf/algo_env/dqn_gymnasium.yaml is tuned for CartPole-v1, not Acrobot-v1: algo=dqn's own "
        "defaults; algo_env=dqn_gymnasium applies it anyway)"), result.stdout + result.stderr
