"""Learning that holds: default runs end solved (the final 100-episode greedy evaluation), and GridWorld
greedy policies take a shortest path. CI runs two seeds of each; `-m slow` runs ten."""
import collections
import json

import jax
import jax.numpy as jnp
import pytest
from conftest import compose_config, run_cli

from lightspeed.framework.anakin.trainer import build
from lightspeed.framework.core.config import validated
from lightspeed.framework.run.policy import read_policy

TARGET = 475.0
SEED_BASE = 31  # never used to tune the defaults (tuned on seed=100, 200, 300)


def run_summary(tmp_path, *overrides) -> dict:
    result = run_cli(*overrides, run_dir=tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr
    return json.loads((tmp_path / "summary.json").read_text())


def finals(summary: dict) -> list[float]:
    return [seed["final_eval_return"] for seed in summary["seeds"]]


def assert_ends_solved(summary: dict) -> None:
    assert summary["final_eval_episodes"] == 100
    assert all(final >= TARGET for final in finals(summary)), finals(summary)


@pytest.mark.parametrize("algo", ["dqn", "apex", "ppo"])
def test_the_default_cartpole_run_ends_solved_on_two_seeds(tmp_path, algo):
    assert_ends_solved(run_summary(tmp_path, f"algo={algo}", "env=cartpole", "num_seeds=2", f"seed={SEED_BASE}"))


def test_with_a_target_every_seed_is_sustained_solved_and_its_best_policy_holds(tmp_path):
    summary = run_summary(tmp_path, "algo=dqn", "env=cartpole", "num_seeds=2", f"seed={SEED_BASE}",
                          f"target_return={TARGET}")
    assert summary["solved_seeds"] == 2
    # the stop rule, whenever this CPU's floats solve them: the run ends at the evaluation that solved the last seed
    assert summary["env_steps"] == max(seed["solved_at_env_steps"] for seed in summary["seeds"])
    # The run stops when the last seed is solved; one solved earlier trains on meanwhile and may slip: on
    # the Intel Xeon of 2026-12-02 seed 31 solved at 25,600 env steps and ended at 401.6 at the stop
    # (35,840). Its best policy, kept beside the final one, is what holds on the final 100 episodes.
    assert summary["final_eval_episodes"] == 100
    assert all(seed["best_policy_eval_return"] >= TARGET for seed in summary["seeds"]), summary["seeds"]


# Ape-X with its CartPole target (apex_cartpole.yaml: each seed ends once solved, with its best policy) ended 10/10
# here on 2026-12-07, as without a target (150k env steps); the early stop without the best policy had left one at 468
@pytest.mark.slow
@pytest.mark.parametrize("algo", ["dqn", "apex", "ppo"])
@pytest.mark.parametrize("target", [None, pytest.param(TARGET, id="target")])
def test_ten_seeds_end_solved_and_stay_solved(tmp_path, algo, target):
    # no target: null, not left out (apex_cartpole.yaml sets one of its own)
    summary = run_summary(tmp_path, f"algo={algo}", "env=cartpole", "num_seeds=10", f"seed={SEED_BASE}",
                          f"target_return={target if target else 'null'}")
    assert_ends_solved(summary)
    if target:
        assert summary["solved_seeds"] == 10


def shortest_path_length(height: int, width: int, walls, start, goal) -> int:
    """Breadth-first search over the 4-connected grid (an independent reference for the env's own)."""
    blocked = {tuple(w) for w in walls}
    distance, queue = {tuple(start): 0}, collections.deque([tuple(start)])
    while queue:
        row, col = queue.popleft()
        for d_row, d_col in ((0, 1), (1, 0), (0, -1), (-1, 0)):
            cell = (row + d_row, col + d_col)
            if 0 <= cell[0] < height and 0 <= cell[1] < width and cell not in blocked and cell not in distance:
                distance[cell] = distance[(row, col)] + 1
                queue.append(cell)
    return distance[tuple(goal)]


def greedy_path_lengths(run_dir, overrides, num_seeds: int, agents: int = 1) -> list[int]:
    """Steps each saved final policy (and each of its agents) takes from the start to the goal (None: never)."""
    train_cfg = validated(compose_config(*overrides))
    env, env_params, algorithm = build(train_cfg)
    lengths = []
    for seed in range(num_seeds):
        policy, _ = read_policy(run_dir, seed, "final")
        for agent in range(agents):
            obs, state = env.reset_env(jax.random.key(0), env_params)
            policy_state = algorithm.act_init(jnp.int32(agent))  # episode e follows agent e (tabular Q)
            for step in range(1, env.max_episode_steps(env_params) + 1):
                action, policy_state = algorithm.act(jax.tree.map(jnp.asarray, policy), policy_state, obs,
                                                     jnp.bool_(step == 1), jax.random.key(step))
                obs, state, _, terminated, truncated, _ = env.step_env(jax.random.key(0), state, action, env_params)
                if terminated or truncated:
                    break
            lengths.append(step if terminated else None)
    return lengths


GRIDWORLD_RUNS = {
    "dqn": ("algo=dqn", "env=gridworld", "env.observation=one_hot", "num_seeds=2", "total_env_steps=60000"),
    "tabular_q": ("algo=tabular_q", "env=gridworld", "num_seeds=2", "algo.num_agents=8", "total_env_steps=1200000"),
}


@pytest.mark.parametrize("name", GRIDWORLD_RUNS)
def test_gridworld_greedy_policies_take_a_shortest_path(tmp_path, name):
    overrides = (*GRIDWORLD_RUNS[name], f"seed={SEED_BASE}")
    summary = run_summary(tmp_path, *overrides)
    cfg = validated(compose_config(*overrides)).env
    shortest = shortest_path_length(cfg.height, cfg.width, cfg.walls, cfg.start, cfg.goal)
    agents = 8 if name == "tabular_q" else 1
    assert greedy_path_lengths(tmp_path, overrides, 2, agents) == [shortest] * 2 * agents
    assert all(final == 1.0 for final in finals(summary))


@pytest.mark.slow
def test_apex_gridworld_greedy_policies_take_a_shortest_path(tmp_path):
    overrides = ("algo=apex", "env=gridworld", "env.observation=one_hot", "num_seeds=6", "total_env_steps=100000",
                 f"seed={SEED_BASE}")
    run_summary(tmp_path, *overrides)
    cfg = validated(compose_config(*overrides)).env
    shortest = shortest_path_length(cfg.height, cfg.width, cfg.walls, cfg.start, cfg.goal)
    assert greedy_path_lengths(tmp_path, overrides, 6) == [shortest] * 6
