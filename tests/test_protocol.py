"""The evaluation protocol: sustained solves, best policies, stability, and the final evaluation."""
import json

import jax
import numpy as np
import pytest
from conftest import compose_config, run_cli

from lightspeed.framework.anakin.trainer import build
from lightspeed.framework.core.config import validated
from lightspeed.framework.core.evaluation import make_evaluate
from lightspeed.framework.core.keys import FINAL_EVALUATION, run_keys
from lightspeed.framework.run.policy import read_policy
from lightspeed.framework.run.protocol import BestPolicies, EvaluationHistory, seed_results


def history_of(returns_per_evaluation, target=475.0, window=3, every=1000):
    history = EvaluationHistory(len(returns_per_evaluation[0]), target, window)
    for index, returns in enumerate(returns_per_evaluation):
        history.record((index + 1) * every, np.array(returns, dtype=float), seconds=float(index))
    return history


def test_a_seed_that_reaches_the_target_once_and_falls_is_not_solved():
    history = history_of([[500, 100], [120, 480], [500, 490], [90, 500], [500, 200]])
    assert history.solved_at_env_steps == [None, 4000]  # seed 1: three in a row, the third at 4000
    assert history.solved_at_seconds == [None, 3.0]
    assert not history.all_solved


def test_solved_names_the_last_evaluation_of_the_first_full_window_and_stays():
    history = history_of([[475, 10], [480, 20], [500, 30], [0, 40], [500, 50]], window=3)
    assert history.solved_at_env_steps == [3000, None]  # a later fall does not unsolve it
    assert history_of([[500]], window=1).solved_at_env_steps == [1000]
    assert history_of([[500], [500]], window=3).solved_at_env_steps == [None]  # fewer evaluations than the window


def test_all_solved_stops_only_when_every_seed_is_solved_and_never_without_a_target():
    assert history_of([[500, 500]] * 3).all_solved
    assert not history_of([[500, 500]] * 3, target=None).all_solved
    assert history_of([[500, 500]] * 3, target=None).solved_at_env_steps == [None, None]


def test_the_best_evaluation_keeps_the_later_one_of_ties():
    history = EvaluationHistory(2, None, 3)
    improved = [history.record(1000 * (i + 1), np.array(r, dtype=float), 0.0).tolist()
                for i, r in enumerate([[10, 5], [30, 5], [30, 4], [20, 6]])]
    assert improved == [[True, True], [True, True], [True, False], [False, True]]
    assert history.best_eval_return == [30.0, 6.0]
    assert history.best_at_env_steps == [3000, 4000]


def test_stability_is_the_fraction_of_evaluations_after_the_first_hit_still_at_the_target():
    history = history_of([[100, 500, 10], [475, 400, 10], [500, 500, 10], [300, 500, 10], [480, 476, 10]])
    # seed 0: first hit at evaluation 2; after it 500, 300, 480 -> 2/3. Seed 1: after 400, 500, 500, 476 -> 3/4
    assert history.stability(0) == pytest.approx(2 / 3)
    assert history.stability(1) == pytest.approx(3 / 4)
    assert history.stability(2) is None  # never reached
    assert history_of([[1, 1], [500, 1]]).stability(0) is None  # reached at the last evaluation: nothing after
    assert history_of([[500]], target=None).stability(0) is None


def test_stability_counts_an_evaluation_exactly_at_the_target():
    # first hit at evaluation 1; after it 475 (at the target: counts), 474, 475.5 -> 2/3
    history = history_of([[100], [480], [475], [474], [475.5]])
    assert history.stability(0) == pytest.approx(2 / 3)
    np.testing.assert_array_equal(history.after_first_hit(0), [475.0, 474.0, 475.5])
    assert history_of([[100], [474]]).after_first_hit(0) is None  # never reached
    np.testing.assert_array_equal(history_of([[100], [475]]).after_first_hit(0), [])  # reached at the last one
    assert history_of([[500]], target=None).after_first_hit(0) is None


def test_stability_after_a_single_later_evaluation():
    assert history_of([[100], [480], [300]]).stability(0) == 0.0
    assert history_of([[100], [480], [476]]).stability(0) == 1.0


def test_a_wrong_number_of_seeds_is_an_error_not_a_silent_truncation():
    history = history_of([[500, 100]])
    with pytest.raises(ValueError):
        history.record(2000, np.array([500.0]), 1.0)
    with pytest.raises(ValueError):
        seed_results(history_of([[500, 100]]), np.ones((2, 3)), np.ones((1, 3)))


def test_the_history_records_every_evaluation_as_plain_numbers():
    history = history_of([[500, 100], [480, 480.5], [500, 490]])
    assert history.env_steps == [1000, 2000, 3000]
    assert history.returns == [[500.0, 100.0], [480.0, 480.5], [500.0, 490.0]]
    assert all(type(value) is float for evaluation in history.returns for value in evaluation)
    assert history.best_eval_return == [500.0, 490.0] and history.best_at_env_steps == [3000, 3000]
    assert history.solved_at_env_steps == [3000, None] and history.solved_at_seconds == [2.0, None]


def test_history_survives_its_json_round_trip():
    history = history_of([[500, 100], [480, 480], [500, 490]])
    restored = EvaluationHistory(2, 475.0, 3)
    saved = json.loads(json.dumps(history.to_dict()))
    assert saved == {"env_steps": [1000, 2000, 3000], "returns": [[500.0, 100.0], [480.0, 480.0], [500.0, 490.0]],
                     "solved_at_env_steps": [3000, None], "solved_at_seconds": [2.0, None],
                     "best_eval_return": [500.0, 490.0], "best_at_env_steps": [3000, 3000]}
    restored.load(saved)
    assert restored.to_dict() == history.to_dict()
    assert all(type(getattr(restored, key)) is list for key in saved)
    # a resumed run goes on from the restored history: seed 1's third evaluation in a row at the target solves it
    improved = restored.record(4000, np.array([300.0, 476.0]), 3.0)
    assert improved.tolist() == [False, False] and restored.best_eval_return == [500.0, 490.0]
    assert restored.solved_at_env_steps == [3000, 4000] and restored.solved_at_seconds == [2.0, 3.0]


def test_seed_results_by_hand():
    history = history_of([[100, 10], [480, 20], [500, 30], [470, 40]])
    final_returns, best_policy_returns = np.array([[1.0, 2, 6], [4, 4, 4]]), np.array([[3.0, 5, 7], [0, 1, 2]])
    rows = seed_results(history, final_returns, best_policy_returns)
    assert rows == [
        {"seed_index": 0, "final_eval_return": 3.0, "final_eval_std": pytest.approx(np.sqrt(14 / 3)),
         "best_policy_eval_return": 5.0, "best_eval_return": 500.0, "best_at_env_steps": 3000,
         "solved_at_env_steps": None, "solved_at_seconds": None, "stability": 0.5, "evaluations_after_target": 2},
        {"seed_index": 1, "final_eval_return": 4.0, "final_eval_std": 0.0, "best_policy_eval_return": 1.0,
         "best_eval_return": 40.0, "best_at_env_steps": 4000, "solved_at_env_steps": None, "solved_at_seconds": None,
         "stability": None, "evaluations_after_target": None},
    ]
    solved = seed_results(history_of([[500], [480], [490]], window=2), np.ones((1, 2)), np.ones((1, 2)))[0]
    assert (solved["solved_at_env_steps"], solved["solved_at_seconds"]) == (2000, 1.0)
    assert (solved["stability"], solved["evaluations_after_target"]) == (1.0, 2)
    assert all(type(solved[key]) is float for key in ("final_eval_return", "final_eval_std", "best_policy_eval_return"))


@pytest.mark.parametrize("seed_axis", [0, 1])
def test_best_policies_take_only_the_improved_seeds(seed_axis):
    shape = (2, 3, 4) if seed_axis == 1 else (3, 4)  # [device, seed, ...] or [seed, ...]
    best = BestPolicies({"w": np.zeros(shape), "b": np.zeros(shape[:-1])}, seed_axis)
    best.keep(np.array([True, False, True]), {"w": np.ones(shape), "b": np.ones(shape[:-1])})
    assert best.policies["w"].shape == shape and best.policies["b"].shape == shape[:-1]
    per_seed = best.policies["w"].swapaxes(0, seed_axis).reshape(3, -1).mean(axis=1)
    assert per_seed.tolist() == [1.0, 0.0, 1.0]
    assert best.policies["b"].swapaxes(0, seed_axis).reshape(3, -1).mean(axis=1).tolist() == [1.0, 0.0, 1.0]


SHORT_DQN = ("algo=dqn", "env=cartpole", "target_return=null",
             "num_seeds=2", "seed=3", "total_env_steps=16384", "eval_every=2048",
             "log_every=2048", "eval_episodes=4", "final_eval_episodes=6", "algo.learning_starts=500")


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("protocol") / "run"
    result = run_cli(*SHORT_DQN, run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    train_cfg = validated(compose_config(*SHORT_DQN))
    env, env_params, algorithm = build(train_cfg)
    return run_dir, json.loads((run_dir / "summary.json").read_text()), env, env_params, algorithm, result.stdout


def returns_of(policy, env, env_params, algorithm, episodes, evaluation, seed_index):
    """One seed's returns with the keys the run used for evaluation number `evaluation`."""
    evaluate = jax.jit(make_evaluate(env, env_params, algorithm, episodes))
    keys = run_keys(np.uint32(3), np.int32(evaluation), 2)[1]
    return np.asarray(evaluate(policy, keys[seed_index]))


def test_the_final_evaluation_plays_final_eval_episodes_with_the_saved_final_policy(short_run):
    run_dir, summary, env, env_params, algorithm, _ = short_run
    assert summary["final_eval_episodes"] == 6
    for seed in summary["seeds"]:
        policy, meta = read_policy(run_dir, seed["seed_index"], "final")
        assert meta["kind"] == "final" and meta["algo"]["name"] == "dqn"
        returns = returns_of(policy, env, env_params, algorithm, 6, FINAL_EVALUATION, seed["seed_index"])
        assert returns.shape == (6,)
        assert seed["final_eval_return"] == pytest.approx(returns.mean())
        assert seed["final_eval_std"] == pytest.approx(returns.std())
    assert summary["final_eval_return"] == pytest.approx(np.mean([s["final_eval_return"] for s in summary["seeds"]]))


def test_the_saved_best_policy_reproduces_its_best_evaluation(short_run):
    run_dir, summary, env, env_params, algorithm, _ = short_run
    evaluations = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for seed in summary["seeds"]:
        index = seed["seed_index"]
        curve = [(e["env_steps"], e["eval/return_per_seed"][index]) for e in evaluations if "eval/return" in e]
        best_steps, best_return = max(curve, key=lambda point: (point[1], point[0]))  # ties: the later one
        assert (seed["best_at_env_steps"], seed["best_eval_return"]) == (best_steps, pytest.approx(best_return))
        policy, _ = read_policy(run_dir, index, "best")
        # the periodic evaluation's number is its chunk's: 2048 env steps a chunk
        returns = returns_of(policy, env, env_params, algorithm, 4, best_steps // 2048 - 1, index)
        assert returns.mean() == pytest.approx(best_return)
        best_final = returns_of(policy, env, env_params, algorithm, 6, FINAL_EVALUATION, index)
        assert seed["best_policy_eval_return"] == pytest.approx(best_final.mean())


def test_the_log_shows_the_headline_numbers_and_the_result(short_run):
    *_, stdout = short_run
    lines = stdout.strip().splitlines()
    # the log's own lines are short; the closing lines hold the run dir, as long as the machine's tmp path
    assert all(len(line) < 160 for line in lines if not line.startswith(("outputs in", "play the saved")))
    log = [line for line in lines if not line.startswith("settings: ")]  # conf/algo_env's file, named first
    assert "env steps" in log[0] and "eval" in log[0] and "loss" in lines[-4]
    assert lines[-3].startswith("final greedy return") and "over 6 episodes per seed" in lines[-3]  # then the outputs
