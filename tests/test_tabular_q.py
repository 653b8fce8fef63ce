"""Tabular Q-learning against value iteration, its targets by hand, and its exploration."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import compose_config

from lightspeed.algorithms.common.exploration import epsilon_greedy, greedy_with_random_ties
from lightspeed.algorithms.tabular_q import TabularQConfig, make_tabular_q
from lightspeed.envs import make
from lightspeed.framework.app.train import train

MOVES = ((0, 1), (1, 0), (0, -1), (-1, 0))
DISCOUNT = 0.9
WALLED = ("env.height=6", "env.width=8", "env.start=[0,7]", "env.goal=[0,0]",
          "env.walls=[[0,4],[1,4],[2,4],[3,4],[4,4]]")


def value_iteration(height, width, walls, goal, discount, sweeps=500):
    """V* of the grid by Bellman backups on an independent model of the moves."""
    walls = {tuple(w) for w in walls}
    values = np.zeros((height, width))
    for _ in range(sweeps):
        new = np.zeros_like(values)
        for row in range(height):
            for col in range(width):
                if (row, col) in walls or (row, col) == tuple(goal):
                    continue
                outcomes = []
                for d_row, d_col in MOVES:
                    nxt = (min(max(row + d_row, 0), height - 1), min(max(col + d_col, 0), width - 1))
                    nxt = (row, col) if nxt in walls else nxt
                    outcomes.append(1.0 if nxt == tuple(goal) else discount * values[nxt])
                new[row, col] = max(outcomes)
        values = new
    return values


def greedy_path(q_table, start, goal, walls=(), limit=200):
    """Cells from start following argmax Q (ties by lowest index; a converged table has none)."""
    height, width = q_table.shape[:2]
    walls = {tuple(w) for w in walls}
    cell, path = tuple(start), [tuple(start)]
    while cell != tuple(goal) and len(path) <= limit:
        d_row, d_col = MOVES[int(np.argmax(q_table[cell]))]
        nxt = (min(max(cell[0] + d_row, 0), height - 1), min(max(cell[1] + d_col, 0), width - 1))
        cell = cell if nxt in walls else nxt
        path.append(cell)
    return path


# the default grid is slow-marked: the walled one (longer paths, cells no step enters) is the harder check
@pytest.mark.parametrize("grid", [pytest.param((), marks=pytest.mark.slow), WALLED],
                         ids=["default grid", "grid with walls"])
def test_greedy_policy_follows_a_shortest_path_with_optimal_values(grid, tmp_path):
    cfg = compose_config("algo=tabular_q", "env=gridworld", *grid, "num_seeds=2", "total_env_steps=20000000",
                         "eval_every=20000000", "log_every=20000000", f"algo.discount={DISCOUNT}")
    summary = train(cfg, tmp_path)
    q_tables = np.load(tmp_path / "q_table.npy")
    env_cfg = cfg.env
    v_star = value_iteration(env_cfg.height, env_cfg.width, env_cfg.walls, env_cfg.goal, DISCOUNT)
    shortest = round(np.log(v_star[tuple(env_cfg.start)]) / np.log(DISCOUNT)) + 1
    for q_table in q_tables.reshape(-1, *q_tables.shape[2:]):
        path = greedy_path(q_table, env_cfg.start, env_cfg.goal, env_cfg.walls)
        assert path[-1] == tuple(env_cfg.goal) and len(path) - 1 == shortest
        for cell in path[:-1]:
            assert abs(q_table[cell].max() - v_star[cell]) < 0.05, (cell, q_table[cell], v_star[cell])
    assert all(s["final_eval_return"] == 1.0 for s in summary["seeds"])


def _one_agent(epsilon=0.0, **env_overrides):
    env, params = make("gridworld", **env_overrides)
    config = TabularQConfig(num_agents=1, steps_per_update=1, epsilon=epsilon, learning_rate=0.5, discount=DISCOUNT)
    algorithm = make_tabular_q(config, env, params)
    return algorithm, algorithm.init(jax.random.key(0))


def test_terminal_step_does_not_bootstrap():
    algorithm, state = _one_agent(height=1, width=3, start=[0, 1], goal=[0, 2])
    q_values = state.q_values.at[0, 0, 1].set(jnp.array([0.2, 0.0, 0.0, 0.0]))  # greedy: move right
    q_values = q_values.at[0, 0, 2].set(5.0)  # the goal's (never used) values must not leak in
    state, _ = jax.jit(algorithm.update)(state.replace(q_values=q_values))
    np.testing.assert_allclose(state.q_values[0, 0, 1, 0], 0.2 + 0.5 * (1.0 - 0.2), rtol=1e-6)


def test_truncated_step_bootstraps_from_the_final_cell():
    algorithm, state = _one_agent(height=1, width=3, start=[0, 0], goal=[0, 2], max_steps=1)
    q_values = state.q_values.at[0, 0, 0].set(jnp.array([0.3, 0.0, 0.0, 0.0]))
    q_values = q_values.at[0, 0, 1].set(jnp.array([0.8, 0.1, 0.0, 0.0]))
    state, _ = jax.jit(algorithm.update)(state.replace(q_values=q_values))
    np.testing.assert_allclose(state.q_values[0, 0, 0, 0], 0.3 + 0.5 * (DISCOUNT * 0.8 - 0.3), rtol=1e-6)
    assert tuple(state.obs[0]) == (0, 0), "the truncated episode was not reset to the start"


def _chi_square(counts, probabilities):
    expected = probabilities * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("epsilon", [0.0, 0.3, 1.0])
def test_epsilon_greedy_frequencies(epsilon):
    q_values = jnp.array([1.0, 0.5, 1.0, 0.2])  # two greedy actions tied
    draws = 200_000
    uniforms = jax.random.uniform(jax.random.key(1), (draws,))
    actions = epsilon_greedy(jnp.broadcast_to(q_values, (draws, 4)), epsilon, uniforms)
    counts = np.bincount(np.asarray(actions), minlength=4)
    expected = np.full(4, epsilon / 4) + np.array([0.5, 0.0, 0.5, 0.0]) * (1 - epsilon)
    observed = counts > 0
    assert np.array_equal(observed, expected > 0)
    # 99.9% critical value of chi-square with 3 degrees of freedom is 16.27
    assert _chi_square(counts[observed], expected[observed]) < 16.27


def test_greedy_ties_are_uniform():
    draws = 120_000
    actions = greedy_with_random_ties(jnp.zeros((draws, 3)), jax.random.uniform(jax.random.key(2), (draws,)))
    counts = np.bincount(np.asarray(actions), minlength=3)
    assert _chi_square(counts, np.full(3, 1 / 3)) < 13.82  # 99.9%, 2 degrees of freedom


@pytest.mark.slow
def test_random_starts_learn_the_optimal_policy_from_every_cell(tmp_path):
    walls = [[r, 6] for r in range(0, 9)] + [[5, c] for c in range(7, 11)]
    cfg = compose_config("algo=tabular_q", "env=gridworld", "env.height=12", "env.width=12", "env.start=[11,11]",
                         "env.goal=[0,0]", f"env.walls={walls}", "env.random_start=true", "env.max_steps=200",
                         "algo.num_agents=16",
                         "total_env_steps=80000000", "eval_every=80000000", "log_every=80000000")
    train(cfg, tmp_path)
    q_table = np.load(tmp_path / "q_table.npy")[0].mean(axis=0)
    v_star = value_iteration(12, 12, walls, [0, 0], DISCOUNT)
    wall_cells = {tuple(w) for w in walls}
    for row in range(12):
        for col in range(12):
            if (row, col) in wall_cells or (row, col) == (0, 0):
                continue
            shortest = round(np.log(v_star[row, col]) / np.log(DISCOUNT)) + 1
            assert len(greedy_path(q_table, [row, col], [0, 0], walls)) - 1 == shortest, (row, col)
            assert abs(q_table[row, col].max() - v_star[row, col]) < 0.05


def test_the_picture_draws_each_agents_own_greedy_path():
    """Two agents that take different routes: each path is its own, not the path of their mean table."""
    from lightspeed.algorithms.tabular_q import greedy_paths

    env, env_params = make("gridworld", height=2, width=3, start=[1, 2], goal=[0, 0])
    algorithm = make_tabular_q(TabularQConfig(num_agents=2), env, env_params)
    right, down, left, up = range(4)
    preferred = [{(1, 2): up, (0, 2): left, (0, 1): left}, {(1, 2): left, (1, 1): left, (1, 0): up}]
    tables = np.zeros((2, 2, 3, 4), np.float32)
    for agent, moves in enumerate(preferred):
        for cell, action in moves.items():
            tables[(agent, *cell, action)] = 1.0
    paths = greedy_paths(env, env_params, algorithm, jnp.asarray(tables))
    assert paths == [[(1, 2), (0, 2), (0, 1), (0, 0)], [(1, 2), (1, 1), (1, 0), (0, 0)]]
