"""GridWorld: transitions, rewards, time limit, auto-reset, observations, random starts, validation."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lightspeed.envs.gridworld import GridWorld, GridWorldConfig, GridWorldState, make_gridworld, shortest_path_lengths
from lightspeed.framework.core.errors import ConfigError
from lightspeed.framework.core.registry import build_config

# 4x5 grid used throughout:     col 0 1 2 3 4
#                          row 0    G . . . .
#                              1    . . # . .
#                              2    . # . . .
#                              3    . . . . S
WALLS = [[1, 2], [2, 1]]
SMALL = dict(height=4, width=5, start=[3, 4], goal=[0, 0], walls=WALLS, step_reward=-0.1, max_steps=6)
RIGHT, DOWN, LEFT, UP = 0, 1, 2, 3


def make_env(**overrides) -> GridWorld:
    return GridWorld(GridWorldConfig(**{**SMALL, **overrides}))


@pytest.fixture(scope="module")
def env() -> GridWorld:
    return make_env()


@pytest.fixture(scope="module")
def batched_step_env(env):
    """step_env vmapped over (cell, time, action), compiled once for the module."""
    def step(cells, times, actions):
        states = GridWorldState(cell=cells, time=times)
        return jax.vmap(env.step_env, (None, 0, 0, None))(jax.random.key(0), states, actions, env.default_params)
    return jax.jit(step)


def run_cases(batched_step_env, cases):
    """cases: (cell, time, action) tuples -> numpy outputs of one batched step."""
    cells = jnp.asarray([c[0] for c in cases], dtype=jnp.int32)
    times = jnp.asarray([c[1] for c in cases], dtype=jnp.int32)
    actions = jnp.asarray([c[2] for c in cases], dtype=jnp.int32)
    obs, state, reward, terminated, truncated, info = batched_step_env(cells, times, actions)
    return jax.tree.map(np.asarray, (obs, state, reward, terminated, truncated))


def test_properties(env):
    assert env.name == "gridworld" and env.num_actions == 4
    assert env.observation_shape == (2,) and (env.observation_encoding, env.observation_kind) == ("cell", "cell")
    assert env.grid_shape == (4, 5)
    assert env.walls.dtype == bool and env.walls.shape == (4, 5)
    assert sorted(map(list, np.argwhere(env.walls))) == sorted(WALLS)
    assert env.max_episode_steps(env.default_params) == 6
    assert env.stochastic_transitions is False


def test_border_moves_are_clipped(batched_step_env):
    cases = [
        ([0, 4], 0, RIGHT, [0, 4]),  # right edge
        ([3, 2], 0, DOWN, [3, 2]),  # bottom edge
        ([2, 0], 0, LEFT, [2, 0]),  # left edge
        ([0, 3], 0, UP, [0, 3]),  # top edge
        ([3, 4], 0, RIGHT, [3, 4]),  # bottom-right corner, both outward moves
        ([3, 4], 0, DOWN, [3, 4]),
        ([0, 3], 0, RIGHT, [0, 4]),  # ordinary moves still work next to a border
        ([3, 4], 0, UP, [2, 4]),
    ]
    obs, state, reward, terminated, truncated = run_cases(batched_step_env, [c[:3] for c in cases])
    np.testing.assert_array_equal(state.cell, [c[3] for c in cases])
    np.testing.assert_array_equal(obs, state.cell)
    np.testing.assert_allclose(reward, -0.1)
    assert not terminated.any() and not truncated.any()
    np.testing.assert_array_equal(state.time, 1)


def test_moves_into_walls_stay(batched_step_env):
    cases = [
        ([1, 1], 0, RIGHT, [1, 1]),  # wall (1,2) to the right
        ([1, 1], 0, DOWN, [1, 1]),  # wall (2,1) below
        ([2, 2], 0, UP, [2, 2]),  # wall (1,2) above
        ([2, 2], 0, LEFT, [2, 2]),  # wall (2,1) to the left
        ([0, 2], 0, DOWN, [0, 2]),
        ([3, 1], 0, UP, [3, 1]),
        ([2, 2], 0, DOWN, [3, 2]),  # the free direction still moves
    ]
    obs, state, reward, terminated, truncated = run_cases(batched_step_env, [c[:3] for c in cases])
    np.testing.assert_array_equal(state.cell, [c[3] for c in cases])
    np.testing.assert_allclose(reward, -0.1)
    assert not terminated.any()


def test_all_transitions_match_reference(env, batched_step_env):
    height, width = env.grid_shape
    walls = env.walls
    cases, expected = [], []
    for row in range(height):
        for col in range(width):
            if walls[row, col]:
                continue
            for action, (d_row, d_col) in enumerate([(0, 1), (1, 0), (0, -1), (-1, 0)]):
                r, c = min(max(row + d_row, 0), height - 1), min(max(col + d_col, 0), width - 1)
                cases.append(([row, col], 0, action))
                expected.append([row, col] if walls[r, c] else [r, c])
    obs, state, reward, terminated, truncated = run_cases(batched_step_env, cases)
    np.testing.assert_array_equal(state.cell, expected)
    at_goal = np.all(np.asarray(expected) == [0, 0], axis=1)
    np.testing.assert_array_equal(terminated, at_goal)
    np.testing.assert_allclose(reward, np.where(at_goal, 1.0, -0.1), rtol=1e-6)


def test_entering_goal_and_truncation(batched_step_env):
    cases = [
        ([0, 1], 0, LEFT),  # enters the goal early: terminated only
        ([1, 0], 2, UP),  # enters the goal from below
        ([0, 1], 5, LEFT),  # enters the goal on the last step: terminated and truncated
        ([3, 3], 4, LEFT),  # time becomes 5 < 6: nothing
        ([3, 3], 5, LEFT),  # time becomes 6 == max_steps: truncated
        ([0, 2], 5, RIGHT),  # truncated away from the goal
    ]
    obs, state, reward, terminated, truncated = run_cases(batched_step_env, cases)
    np.testing.assert_array_equal(terminated, [True, True, True, False, False, False])
    np.testing.assert_array_equal(truncated, [False, False, True, False, True, True])
    np.testing.assert_allclose(reward, [1.0, 1.0, 1.0, -0.1, -0.1, -0.1], rtol=1e-6)
    np.testing.assert_array_equal(state.time, [1, 3, 6, 5, 6, 6])
    assert reward.dtype == np.float32 and terminated.dtype == bool and truncated.dtype == bool


def test_auto_reset_after_goal_and_time_limit(env):
    params = env.default_params
    states = GridWorldState(cell=jnp.asarray([[0, 1], [3, 3], [3, 3]], jnp.int32),
                            time=jnp.asarray([0, 5, 1], jnp.int32))
    actions = jnp.asarray([LEFT, LEFT, LEFT], jnp.int32)
    keys = jax.random.split(jax.random.key(1), 3)
    step = jax.jit(jax.vmap(env.step, (0, 0, 0, None)))
    obs, state, reward, terminated, truncated, info = jax.tree.map(np.asarray, step(keys, states, actions, params))
    # Both ended episodes come back at the start with time 0; the third carries on.
    np.testing.assert_array_equal(obs, [[3, 4], [3, 4], [3, 2]])
    np.testing.assert_array_equal(state.cell, [[3, 4], [3, 4], [3, 2]])
    np.testing.assert_array_equal(state.time, [0, 0, 2])
    np.testing.assert_array_equal(info["final_observation"], [[0, 0], [3, 2], [3, 2]])
    np.testing.assert_array_equal(terminated, [True, False, False])
    np.testing.assert_array_equal(truncated, [False, True, False])
    np.testing.assert_allclose(reward, [1.0, -0.1, -0.1], rtol=1e-6)


def test_reset_returns_start(env):
    obs, state = jax.jit(env.reset)(jax.random.key(3), env.default_params)
    np.testing.assert_array_equal(obs, [3, 4])
    assert obs.dtype == jnp.int32 and int(state.time) == 0


def test_one_hot_observation():
    env = make_env(observation="one_hot")
    assert env.observation_shape == (20,) and (env.observation_encoding, env.observation_kind) == ("one_hot", "vector")
    params = env.default_params
    obs, state = env.reset(jax.random.key(0), params)
    assert obs.shape == (20,) and obs.dtype == jnp.float32
    np.testing.assert_array_equal(np.flatnonzero(obs), [3 * 5 + 4])
    assert float(obs.sum()) == 1.0
    obs, state, reward, terminated, truncated, info = jax.jit(env.step)(jax.random.key(0), state, jnp.int32(UP), params)
    np.testing.assert_array_equal(np.flatnonzero(obs), [2 * 5 + 4])
    np.testing.assert_array_equal(state.cell, [2, 4])


def test_random_start_covers_free_non_goal_cells():
    env = make_env(random_start=True)
    reset = jax.jit(jax.vmap(env.reset, (0, None)))
    keys = jax.random.split(jax.random.key(7), 4000)
    free = {(r, c) for r, c in np.argwhere(~env.walls)}
    for goal in ([0, 0], [3, 4], [2, 3]):
        params = env.default_params.replace(goal=jnp.asarray(goal, jnp.int32))
        obs, state = reset(keys, params)
        cells, counts = np.unique(np.asarray(state.cell), axis=0, return_counts=True)
        assert {tuple(c) for c in cells} == free - {tuple(goal)}
        # 4000 draws over 17 cells: about 235 each; far below means a biased draw.
        assert counts.min() > 150
        np.testing.assert_array_equal(state.time, 0)


def test_shortest_path_lengths():
    walls = np.zeros((4, 5), bool)
    walls[1, 2] = walls[2, 1] = True
    distances = shortest_path_lengths(4, 5, walls, [0, 0])
    assert distances[0, 0] == 0 and distances[3, 4] == 7 and distances[2, 2] == 6
    assert distances[1, 2] == -1 and distances[2, 1] == -1
    walls[0, 1] = walls[1, 0] = True  # seal the goal in its corner
    distances = shortest_path_lengths(4, 5, walls, [0, 0])
    assert distances[0, 0] == 0 and (distances[~walls] == -1).sum() == 4 * 5 - 4 - 1


def test_registry_builds_env():
    config = build_config("env", "gridworld", {"height": 3, "width": 3, "start": [2, 2], "observation": "one_hot"})
    env, params = make_gridworld(config)
    assert env.grid_shape == (3, 3) and env.observation_shape == (9,)
    np.testing.assert_array_equal(params.start, [2, 2])


@pytest.mark.parametrize("overrides, key, fragment", [
    ({"start": [8, 0]}, "env.start", "outside the grid"),
    ({"goal": [0, 12]}, "env.goal", "outside the grid"),
    ({"start": [7]}, "env.start", "2 integers"),
    ({"walls": [[1, 1, 1]]}, "env.walls[0]", "2 integers"),
    ({"walls": [[0, 0], [9, 9]]}, "env.walls[1]", "outside the grid"),
    ({"walls": [[7, 11]]}, "env.start", "the start cell is a wall"),
    ({"walls": [[0, 0]]}, "env.goal", "the goal cell is a wall"),
    ({"goal": [7, 11]}, "env.goal", "different from env.start"),
    ({"walls": [[0, 1], [1, 0]]}, "env.walls", "cut the goal off from the start"),
    ({"walls": [[6, 0], [7, 1]], "random_start": True}, "env.walls", "cut off from the goal"),
    ({"observation": "pixels"}, "env.observation", "null (the algorithm chooses), cell or one_hot"),
    ({"height": 0}, "env.height", "an integer >= 1"),
    ({"height": 100000000}, "env.height", "from 1 to 1024"),
    ({"width": 2.5}, "env.width", "an integer >= 1"),
    ({"height": 1, "width": 1, "start": [0, 0]}, "env.width", "at least 2 cells"),
    ({"step_reward": float("nan")}, "env.step_reward", "finite"),
    ({"max_steps": 0}, "env.max_steps", "an integer >= 1"),
    ({"random_start": "yes"}, "env.random_start", "true or false"),
    ({"colour": "red"}, "env.colour", "unknown key"),
])
def test_validation_errors(overrides, key, fragment):
    with pytest.raises(ConfigError) as error:
        build_config("env", "gridworld", overrides)
    message = str(error.value)
    assert error.value.key == key
    assert message.startswith(f"Invalid config: {key}=") and fragment in message
    assert "\n" not in message


def test_walls_that_leave_a_pocket_are_fine_without_random_start():
    # The unreachable pocket at (7, 0) matters only when episodes may start there.
    config = build_config("env", "gridworld", {"walls": [[6, 0], [7, 1]]})
    assert config.walls == [[6, 0], [7, 1]]
