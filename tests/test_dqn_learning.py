"""DQN learns: CartPole to a greedy return >= 475 and the GridWorld from one-hot observations."""
import json

import pytest

from conftest import run_cli


def _solved(run_dir):
    return [s["solved_at_env_steps"] for s in json.loads((run_dir / "summary.json").read_text())["seeds"]]


def test_dqn_solves_cartpole_on_two_seeds(tmp_path):
    result = run_cli("algo=dqn", "env=cartpole", "num_seeds=2", "target_return=475", run_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    solved = _solved(tmp_path)
    assert all(steps is not None and steps <= 100_000 for steps in solved), solved


def test_dqn_reaches_the_goal_from_one_hot_cells(tmp_path):
    result = run_cli("algo=dqn", "env=gridworld", "env.observation=one_hot", "target_return=1.0",
                     "total_env_steps=60000", run_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    assert all(steps is not None for steps in _solved(tmp_path))


@pytest.mark.slow
def test_dqn_solves_cartpole_on_ten_seeds_within_100k_steps(tmp_path):
    result = run_cli("algo=dqn", "env=cartpole", "num_seeds=10", "target_return=475", "total_env_steps=100000",
                     run_dir=tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr
    solved = _solved(tmp_path)
    assert all(steps is not None and steps <= 100_000 for steps in solved), solved
