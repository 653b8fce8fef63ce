"""framework/run/loop.py: what both drivers' runs end with, on hand-made evaluations (no program runs)."""
import types

import numpy as np

from lightspeed.framework.run.loop import RunLoop
from lightspeed.framework.run.protocol import BestPolicies


def a_loop(num_seeds: int, target: float | None, window: int = 2) -> RunLoop:
    train = types.SimpleNamespace(num_seeds=num_seeds, target_return=target, solve_window=window, resume=False)
    initial = BestPolicies({"w": np.zeros(num_seeds)}, seed_axis=0)
    return RunLoop(train, None, None, None, None, lambda: 0.0, None, None, initial, writer=False)


def evaluate(loop: RunLoop, env_steps: int, returns: list[float], policy_value: float) -> None:
    """An evaluation whose policies hold `policy_value` for every seed."""
    policies = {"w": np.full(len(returns), policy_value)}
    loop.evaluated({"env_steps": env_steps}, np.array(returns), lambda: policies)


def test_a_solved_seed_ends_with_its_best_policy_and_the_others_with_the_last():
    loop = a_loop(2, target=475.0)
    evaluate(loop, 100, [500.0, 100.0], policy_value=1.0)
    evaluate(loop, 200, [480.0, 200.0], policy_value=2.0)  # seed 0: two in a row >= 475, solved here
    evaluate(loop, 300, [100.0, 500.0], policy_value=3.0)  # it collapses afterwards; seed 1 peaks once
    assert loop.history.solved_at_env_steps == [200, None] and loop.progress.evaluations == 3
    final = loop.final_policies({"w": np.array([4.0, 4.0])})  # what the program holds at the end
    assert final["w"].tolist() == [1.0, 4.0]  # seed 0: its best by its solve (500 > 480); seed 1: the last
    assert loop.best.policies["w"].tolist() == [1.0, 3.0]


def test_without_a_target_every_seed_ends_with_the_policy_it_has():
    loop = a_loop(2, target=None)
    for step, value in ((100, 1.0), (200, 2.0)):
        evaluate(loop, step, [500.0, 500.0], policy_value=value)
    assert loop.final_policies({"w": np.array([7.0, 8.0])})["w"].tolist() == [7.0, 8.0]
    assert loop.solved() is None


def test_a_later_tie_is_the_best_and_a_solve_keeps_what_was_best_then():
    loop = a_loop(1, target=475.0, window=1)
    evaluate(loop, 100, [500.0], policy_value=1.0)  # solved at once: ends with this policy
    evaluate(loop, 200, [500.0], policy_value=2.0)  # a later tie becomes the best, not the result
    assert loop.best.policies["w"].tolist() == [2.0]
    assert loop.final_policies({"w": np.array([9.0])})["w"].tolist() == [1.0]
    assert loop.kept_policies()["ended"]["w"].tolist() == [1.0] and loop.solved() == "1/1"
