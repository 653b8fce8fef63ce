"""A run names its outputs: its last lines say where the run dir is and what it holds; its plot names the
env id it shows; `framework.tools.evaluate --gif` draws an episode of the evaluation it prints."""
import inspect
import json
import shlex
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import compose_config, run_cli, run_python
from PIL import Image

from lightspeed import envs
from lightspeed.framework.anakin.trainer import build
from lightspeed.framework.core.config import validated
from lightspeed.framework.core.evaluation import make_evaluate, make_record_episode
from lightspeed.framework.run.common import format_outputs, learning_curve_title
from lightspeed.framework.tools import evaluate, report

SHORT_DQN = ("algo=dqn", "env=cartpole", "num_seeds=2", "total_env_steps=4096", "log_every=2048", "eval_every=2048",
             "eval_episodes=2", "final_eval_episodes=8", "algo.learning_starts=500")


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("outputs") / "run"
    result = run_cli(*SHORT_DQN, run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    return run_dir, result.stdout.strip().splitlines()


def test_the_last_lines_name_the_run_dir_and_what_it_holds(short_run):
    run_dir, lines = short_run
    result, outputs, play = lines[-3:]
    assert result.startswith("final greedy return") and "over 8 episodes per seed" in result
    assert outputs.startswith(f"outputs in {run_dir}: summary.json (the result), learning_curve.png, policies/, ")
    listed = [name.split(" (")[0].rstrip("/") for name in outputs.split(": ", 1)[1].split(", ")]
    assert sorted(listed) == sorted(p.name for p in run_dir.iterdir() if not p.name.startswith("."))
    assert {"summary.json", "learning_curve.png", "policies", "metrics.jsonl", "config.yaml"} <= set(listed)
    assert play == f"play the saved policies: python -m lightspeed.framework.tools.evaluate {run_dir}"


def test_the_play_line_runs_and_its_gif_is_the_first_episode_it_prints(short_run, tmp_path, capsys):
    run_dir, lines = short_run
    python, dash_m, module, *args = shlex.split(lines[-1].split(": ", 1)[1])
    assert (python, dash_m, module) == ("python", "-m", "lightspeed.framework.tools.evaluate")
    gif = tmp_path / "episode.gif"
    record = evaluate.main([*args, "--episodes", "8", "--gif", str(gif)])
    summary = json.loads((run_dir / "summary.json").read_text())
    # the run's own final evaluation: the same episodes, the same returns
    assert [seed["mean"] for seed in record["seeds"]] == pytest.approx(
        [seed["final_eval_return"] for seed in summary["seeds"]])
    # the GIF is seed 0's first episode of that evaluation (CartPole: a reward of 1 a step)
    assert record["gif"]["return"] == record["seeds"][0]["returns"][0] == record["gif"]["steps"]
    assert Image.open(gif).n_frames > 1
    assert "seed 0's first episode of the 8 above" in capsys.readouterr().out


def test_a_run_dir_under_the_working_directory_is_shown_relative(tmp_path, monkeypatch):
    (tmp_path / "runs" / "first").mkdir(parents=True)
    (tmp_path / "runs" / "first" / "summary.json").write_text("{}")
    (tmp_path / "runs" / "first" / "checkpoints").mkdir()
    monkeypatch.chdir(tmp_path)
    assert format_outputs(tmp_path / "runs" / "first") == [
        "outputs in runs/first: summary.json (the result), checkpoints/",
        "play the saved policies: python -m lightspeed.framework.tools.evaluate runs/first"]


def test_the_learning_curve_names_the_env_it_shows(short_run):
    run_dir, _ = short_run
    assert Image.open(run_dir / "learning_curve.png").text["Title"] == "dqn on cartpole"


def test_a_minatar_curve_is_titled_with_its_game():
    env, _, _ = build(validated(compose_config("algo=dqn", "env=minatar", "env.id=SpaceInvaders-MinAtar")))
    assert learning_curve_title("dqn", env) == "dqn on SpaceInvaders-MinAtar"


def test_a_recorded_episode_is_the_evaluations_first_episode():
    """With actions drawn from the act key, episodes differ: the recording must use that episode's keys."""
    env, env_params = envs.make("cartpole")

    def act(push_right_probability, state, obs, start, key):
        return jax.random.bernoulli(key, push_right_probability).astype(jnp.int32), state

    episodes = 8
    player = types.SimpleNamespace(act=act, act_init=lambda episode: ())
    evaluate_one = jax.jit(make_evaluate(env, env_params, player, episodes))
    record = jax.jit(make_record_episode(env, env_params, player, episodes))
    for seed in range(4):
        key = jax.random.key(seed)
        returns = np.asarray(evaluate_one(0.5, key))
        assert len(set(returns.tolist())) > 1  # the episodes differ
        states, rewards, steps = record(0.5, key)
        assert float(np.asarray(rewards).sum()) == returns[0] == int(steps)
        assert jax.tree.leaves(states)[0].shape[0] == env.max_episode_steps(env_params) + 1


def test_run_log_holds_every_line_the_run_printed(short_run):
    """run.log, which the last lines and the docs point to, is the run's printed log, line for line."""
    run_dir, lines = short_run
    assert (run_dir / "run.log").read_text().strip().splitlines() == lines  # as the fixture strips stdout


def test_the_path_before_the_layout_by_shape_still_evaluates(short_run):
    """`python -m framework.evaluate RUN_DIR`, the command of older docs (framework/__init__.py's moved modules),
    plays the run's policies as framework.tools.evaluate does."""
    run_dir, _ = short_run
    result = run_python(str(run_dir), "--episodes", "1", module="framework.evaluate")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "mean over seeds" in result.stdout


def test_the_first_line_names_the_algo_env_file_applied(short_run):
    """dqn on cartpole is retuned by conf/algo_env/dqn_cartpole.yaml: the run says so before anything else."""
    _, lines = short_run
    assert lines[0] == "settings: conf/algo_env/dqn_cartpole.yaml, DQN on CartPole (~algo_env leaves them out)"


@pytest.mark.parametrize("tool", [evaluate, report], ids=["evaluate", "report"])
def test_a_tools_help_is_its_whole_docstring(tool, capsys):
    """`--help` shows the module's docstring as written, not its first line cut mid-sentence."""
    with pytest.raises(SystemExit) as exit_status:
        tool.parse_args(["--help"])
    assert exit_status.value.code == 0
    assert inspect.cleandoc(tool.__doc__) in capsys.readouterr().out
