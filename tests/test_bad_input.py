"""Bad input through run.py: non-zero exit, one paragraph naming the key, never a traceback."""
import pytest
from conftest import ROOT, run_cli, run_python

GRID = ["algo=tabular_q", "env=gridworld"]
CASES = {
    "unknown algo lists the known ones": (["algo=nope"], ["algo='nope'", "unknown algo", "tabular_q"]),
    "unknown env lists the known ones": (["env=nope"], ["env='nope'", "unknown env", "cartpole, gridworld"]),
    "wrong type": (["num_seeds=abc"], ["num_seeds", "abc"]),
    "seed beyond uint32": (["seed=4294967296"], ["seed", "4294967296", "at most 4294967295"]),
    "float for an int": (["total_env_steps=1e5"], ["total_env_steps"]),
    "out of range": ([*GRID, "algo.epsilon=1.5"], ["algo.epsilon", "1.5", "<= 1"]),
    "not a number": (["algo.learning_rate=nan"], ["algo.learning_rate", "nan", "finite"]),
    "zero size": ([*GRID, "algo.num_agents=0"], ["algo.num_agents", "0", ">= 1"]),
    "unknown key": (["algo.foo=1"], ["algo.foo"]),
    "misspelt key": (["algo=dqn", "algo.learning_rat=0.001"], ["algo.learning_rat", "did you mean algo.learning_rate"]),
    "misspelt run key": (["total_env_step=20000"], ["total_env_step", "did you mean total_env_steps"]),
    "misspelt option": (["algo=dqnn"], ["algo='dqnn'", "did you mean dqn"]),
    "wall on the start cell": ([*GRID, "env.walls=[[7,11]]"], ["env.start", "[7, 11]", "wall"]),
    "walls enclose the goal": ([*GRID, "env.walls=[[0,1],[1,0]]"], ["env.walls", "goal"]),
    "cell outside the grid": ([*GRID, "env.goal=[8,0]"], ["env.goal", "[8, 0]"]),
    "algorithm that cannot use the env": (["algo=tabular_q", "env=cartpole"], ["env", "cartpole", "tabular_q"]),
    "batch larger than the buffer": (["algo.batch_size=4096", "algo.buffer_size=2048"], ["algo.batch_size", "4096"]),
    "a budget in which learning never starts": (["algo=dqn", "algo.batch_size=5000", "total_env_steps=4096"],
                                                ["algo.batch_size=5000", "never learn", "total_env_steps=4,096"]),
    "replay larger than memory": (["algo=dqn", "algo.buffer_size=2000000000"], ["algo.buffer_size", "free memory"]),
    "more devices than exist": (["num_devices=3"], ["num_devices", "3", "at most the 1 devices"]),
    "unknown distributed option": (["distributed=cloud"], ["distributed", "cloud", "auto, local"]),
    "process id outside the cluster": (["distributed.num_processes=2", "distributed.process_id=2",
                                        "distributed.coordinator_address=127.0.0.1:1234"],
                                       ["distributed.process_id", "2"]),
    "cluster without a coordinator": (["distributed.num_processes=2"],
                                      ["distributed.coordinator_address", "host:port"]),
    "unknown matmul precision": (["matmul_precision=bf16"], ["matmul_precision", "bf16", "null", "highest"]),
}


@pytest.mark.parametrize("overrides, expected", CASES.values(), ids=CASES.keys())
def test_bad_input_is_one_clear_paragraph(overrides, expected, tmp_path):
    result = run_cli(*overrides, run_dir=tmp_path / "run", timeout=120)
    assert result.returncode == 2, result.stderr  # 2: a config error (3: a diverged run, 1: a crash)
    assert "Traceback" not in result.stderr + result.stdout
    message = result.stderr.strip()
    assert message.startswith("Invalid config: ") and "\n" not in message, message
    assert "+" not in message, message  # not Hydra's hint to add the key
    for piece in expected:
        assert piece in message, f"{piece!r} not in {message!r}"
    assert not (tmp_path / "run").exists(), "a refused run left its folder"


def test_a_refused_run_keeps_a_run_dir_that_holds_more_than_hydras_files(tmp_path):
    """Only a dir holding nothing but what the refused job wrote goes: one with anything else (a checkpoint) stays."""
    (tmp_path / "checkpoints").mkdir()
    result = run_cli("algo=dqn", "algo.batch_size=5000", "total_env_steps=4096", run_dir=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr
    assert sorted(entry.name for entry in tmp_path.iterdir()) == [".hydra", "checkpoints", "run.log"]


def test_unwritable_run_dir_is_reported_before_anything_runs(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    result = run_cli("total_env_steps=1000", run_dir=blocker / "run", timeout=120)
    assert result.returncode == 2
    assert "hydra.run.dir" in result.stderr and "Traceback" not in result.stderr + result.stdout


WITHOUT_GYMNAX = """import runpy, sys
sys.modules["gymnax"] = None  # an interpreter without the gymnax extra: importing it raises ImportError
sys.path.insert(0, sys.argv.pop(1))
sys.argv[0] = "run.py"
runpy.run_path(sys.path[0] + "/run.py", run_name="__main__")
"""


@pytest.mark.parametrize("env", ["gymnax", "minatar"])
def test_an_env_whose_extra_is_missing_names_the_pip_install_in_one_line(env, tmp_path):
    script = tmp_path / "without_gymnax.py"
    script.write_text(WITHOUT_GYMNAX)
    result = run_python(str(ROOT), f"env={env}", "progress=false", f"hydra.run.dir={tmp_path / 'run'}",
                        script=script, timeout=120)
    assert result.returncode == 2, result.stderr
    message = result.stderr.strip()
    assert "Traceback" not in message and "\n" not in message, message
    assert message.endswith('pip install "lightspeed[gymnax]".') and "gymnax is not installed" in message
    assert not (tmp_path / "run").exists()
