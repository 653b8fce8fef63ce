"""GridWorld: a deterministic 4-action grid with walls, a goal worth 1.0 and a time limit.

Cells are (row, col) with row 0 at the top. Actions 0..3 move right, down, left, up; moves
are clipped at the border and a move into a wall leaves the agent where it is. Entering the
goal gives reward 1.0 and terminates; every other step gives `step_reward`. The episode is
truncated when `time` reaches `max_steps`, independently of termination (as gymnasium's
TimeLimit does).

Everything that fixes an array shape (grid size, wall mask, observation kind, the candidate
start cells) lives on the env object; the values a sweep may vary live in `GridWorldParams`.
"""
import collections
import dataclasses
from collections.abc import Sequence
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from lightspeed.framework.core.env import Environment, StepResult
from lightspeed.framework.core.errors import check, check_number, check_positive_int
from lightspeed.framework.core.registry import register_env

MAX_SIDE = 1024  # rows or columns: a 1024x1024 grid is validated in about a second

ENCODINGS = {"cell": "cell", "one_hot": "vector"}  # env.observation -> the kind of observation it gives
# (row, col) displacement of actions 0..3: right, down, left, up.
ACTION_MOVES = ((0, 1), (1, 0), (0, -1), (-1, 0))


@dataclasses.dataclass
class GridWorldConfig:
    name: str = "gridworld"  # the registered name of the env that env=gridworld chooses
    height: int = 8  # rows of the grid
    width: int = 12  # columns of the grid
    # [row, col] where every episode starts (unless random_start)
    start: list[int] = dataclasses.field(default_factory=lambda: [7, 11])
    # [row, col] whose entry gives reward 1 and ends the episode
    goal: list[int] = dataclasses.field(default_factory=lambda: [0, 0])
    # Cells [row, col] that cannot be entered.
    walls: list[list[int]] = dataclasses.field(default_factory=list)
    # Reward for every step that does not enter the goal.
    step_reward: float = 0.0
    # Episodes are truncated (not terminated) after this many steps.
    max_steps: int = 100
    # Start each episode in a uniformly random free cell other than the goal.
    random_start: bool = False
    # "cell": int32 (row, col) for tabular agents; "one_hot": float32 [height*width] for networks;
    # null: what the algorithm consumes (see ENCODINGS).
    observation: Optional[str] = None

    def validate(self) -> None:
        """Raise a ConfigError naming the first bad key; pure Python, no JAX."""
        for key in ("height", "width"):
            check_positive_int(f"env.{key}", getattr(self, key))
            # found by fuzzing: a 1e8-row grid made the reachability check below run for minutes
            check(getattr(self, key) <= MAX_SIDE, f"env.{key}", getattr(self, key), f"an integer from 1 to {MAX_SIDE}",
                  "the grid is checked cell by cell and every agent keeps a Q-value per cell")
        check(self.height * self.width >= 2, "env.width", self.width,
              "a grid of at least 2 cells (height * width >= 2)",
              "a 1x1 grid has no room for a start and a distinct goal")
        check_number("env.step_reward", self.step_reward)
        check_positive_int("env.max_steps", self.max_steps)
        check(isinstance(self.random_start, bool), "env.random_start", self.random_start, "true or false")
        check(self.observation is None or self.observation in ENCODINGS, "env.observation", self.observation,
              f"null (the algorithm chooses), {' or '.join(ENCODINGS)}")
        _check_cell("env.start", self.start, self.height, self.width)
        _check_cell("env.goal", self.goal, self.height, self.width)
        check(_is_sequence(self.walls), "env.walls", self.walls, "a list of [row, col] cells")
        for index, wall in enumerate(self.walls):
            _check_cell(f"env.walls[{index}]", wall, self.height, self.width)
        walls = walls_mask(self.height, self.width, self.walls)
        start, goal = tuple(self.start), tuple(self.goal)
        not_a_wall = "a cell that is not listed in env.walls"
        check(not walls[start], "env.start", _plain(self.start), not_a_wall, "the start cell is a wall")
        check(not walls[goal], "env.goal", _plain(self.goal), not_a_wall, "the goal cell is a wall")
        check(start != goal, "env.goal", _plain(self.goal), "a cell different from env.start",
              "the goal is the start cell")
        distances = shortest_path_lengths(self.height, self.width, walls, goal)
        check(distances[start] >= 0, "env.walls", _plain(self.walls),
              "walls that leave a path of free cells (4-neighbour moves) from env.start to env.goal",
              "the walls cut the goal off from the start")
        if self.random_start:
            stranded = [[int(r), int(c)] for r, c in np.argwhere(~walls & (distances < 0))]
            check(not stranded, "env.walls", _plain(self.walls),
                  "walls that let every free cell reach env.goal when env.random_start is true",
                  f"random starts could begin in cells cut off from the goal, e.g. {stranded[:5]}")


def _is_sequence(value: Any) -> bool:
    # OmegaConf's ListConfig is a Sequence too, so accept any non-string sequence.
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _plain(value: Any) -> Any:
    # Show ListConfig values as plain lists in error messages.
    return [_plain(item) for item in value] if _is_sequence(value) else value


def _check_cell(key: str, value: Any, height: int, width: int) -> None:
    """A [row, col] list of two integers inside the grid."""
    allowed = f"a list [row, col] of 2 integers with 0 <= row < {height} and 0 <= col < {width}"
    ok = _is_sequence(value) and len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    check(ok, key, _plain(value), allowed)
    check(0 <= value[0] < height and 0 <= value[1] < width, key, _plain(value), allowed, "the cell is outside the grid")


def walls_mask(height: int, width: int, walls: Sequence[Sequence[int]]) -> np.ndarray:
    """A bool [height, width] array, True on wall cells."""
    mask = np.zeros((height, width), dtype=bool)
    for row, col in walls:
        mask[row, col] = True
    return mask


def shortest_path_lengths(height: int, width: int, walls_mask: np.ndarray, goal: Sequence[int]) -> np.ndarray:
    """BFS distance (in moves) from every cell to `goal`; -1 for walls and unreachable cells."""
    distances = np.full((height, width), -1, dtype=np.int64)
    goal = (int(goal[0]), int(goal[1]))
    if walls_mask[goal]:
        return distances
    distances[goal] = 0
    frontier = collections.deque([goal])
    while frontier:
        row, col = frontier.popleft()
        # Moves are reversible (clipping and walls only cancel a move), so BFS from the goal works.
        for d_row, d_col in ACTION_MOVES:
            r, c = row + d_row, col + d_col
            if 0 <= r < height and 0 <= c < width and not walls_mask[r, c] and distances[r, c] < 0:
                distances[r, c] = distances[row, col] + 1
                frontier.append((r, c))
    return distances


@struct.dataclass
class GridWorldState:
    cell: jax.Array  # int32[2]: (row, col)
    time: jax.Array  # int32: steps taken in this episode


@struct.dataclass
class GridWorldParams:
    start: jax.Array  # int32[2]
    goal: jax.Array  # int32[2]
    step_reward: jax.Array  # float32
    max_steps: jax.Array  # int32


class GridWorld(Environment):
    name = "gridworld"
    # step_env is deterministic, so Environment.step gives the whole key to the reset.
    stochastic_transitions = False
    render_fps = 5

    def __init__(self, config: GridWorldConfig | None = None):
        config = GridWorldConfig() if config is None else config
        config.validate()
        self._height, self._width = config.height, config.width
        self._walls = walls_mask(config.height, config.width, config.walls)
        self._walls.setflags(write=False)
        self._observation = config.observation or "cell"  # built directly, outside an algorithm: cells
        self._random_start = config.random_start
        # Free cells in row-major order; random starts draw from these (minus the goal).
        self._free_cells = np.argwhere(~self._walls).astype(np.int32)
        self._default_params = GridWorldParams(
            start=jnp.asarray(config.start, dtype=jnp.int32),
            goal=jnp.asarray(config.goal, dtype=jnp.int32),
            step_reward=jnp.asarray(config.step_reward, dtype=jnp.float32),
            max_steps=jnp.asarray(config.max_steps, dtype=jnp.int32),
        )

    @property
    def default_params(self) -> GridWorldParams:
        return self._default_params

    @property
    def num_actions(self) -> int:
        return len(ACTION_MOVES)

    @property
    def observation_shape(self) -> tuple[int, ...]:
        return (2,) if self._observation == "cell" else (self._height * self._width,)

    @property
    def grid_shape(self) -> tuple[int, int]:
        return self._height, self._width

    @property
    def walls(self) -> np.ndarray:
        """Bool [height, width], True on walls (a copy: the env's own mask stays fixed)."""
        return self._walls.copy()

    @property
    def observation_encoding(self) -> str:
        return self._observation

    @property
    def observation_kind(self) -> str:
        return ENCODINGS[self._observation]

    @property
    def random_start(self) -> bool:
        return self._random_start

    @property
    def free_cells(self) -> np.ndarray:
        """int32 [num_free, 2]: every non-wall cell in row-major order."""
        return self._free_cells.copy()

    def max_episode_steps(self, params: GridWorldParams) -> int:
        return int(params.max_steps)

    def observation(self, cell: jax.Array) -> jax.Array:
        """The agent's view of `cell` (int32[2])."""
        if self._observation == "cell":
            return cell
        flat_index = cell[0] * self._width + cell[1]
        return (jnp.arange(self._height * self._width, dtype=jnp.int32) == flat_index).astype(jnp.float32)

    def render(self, state: GridWorldState, params: GridWorldParams) -> np.ndarray:
        return self.render_episode([state], params)[0]

    def render_episode(self, states: list[GridWorldState], params: GridWorldParams) -> list[np.ndarray]:
        """Each frame shows the path walked so far, from the episode's first cell."""
        cells = [tuple(int(v) for v in np.asarray(state.cell)) for state in states]
        start, goal = np.asarray(params.start).tolist(), np.asarray(params.goal).tolist()
        return [draw_grid(self._walls, start, goal, cells[: t + 1]) for t in range(len(cells))]

    def reset_env(self, key: jax.Array, params: GridWorldParams) -> tuple[jax.Array, GridWorldState]:
        cell = self._random_free_cell(key, params.goal) if self._random_start else params.start.astype(jnp.int32)
        state = GridWorldState(cell=cell, time=jnp.zeros((), dtype=jnp.int32))
        return self.observation(cell), state

    def _random_free_cell(self, key: jax.Array, goal: jax.Array) -> jax.Array:
        """Uniform over free cells except `goal`, with one draw and no rejection loop."""
        free_cells = jnp.asarray(self._free_cells)
        # Draw among the first n-1 free cells; a draw of the goal is swapped for the last cell.
        index = jax.random.randint(key, (), 0, len(self._free_cells) - 1)
        cell = free_cells[index]
        return jnp.where(jnp.all(cell == goal), free_cells[-1], cell)

    def step_env(self, key: jax.Array, state: GridWorldState, action: jax.Array,
                 params: GridWorldParams) -> StepResult:
        row, col = state.cell[0], state.cell[1]
        # Displacements by comparison instead of a table gather: cheaper when vmapped on CPU.
        d_row = (action == 1).astype(jnp.int32) - (action == 3).astype(jnp.int32)
        d_col = (action == 0).astype(jnp.int32) - (action == 2).astype(jnp.int32)
        next_row = jnp.clip(row + d_row, 0, self._height - 1)
        next_col = jnp.clip(col + d_col, 0, self._width - 1)
        if self._walls.any():
            # One gather into the flat wall mask; skipped entirely on an open grid.
            blocked = jnp.asarray(self._walls.ravel())[next_row * self._width + next_col]
            next_row = jnp.where(blocked, row, next_row)
            next_col = jnp.where(blocked, col, next_col)
        cell = jnp.stack([next_row, next_col])
        terminated = (next_row == params.goal[0]) & (next_col == params.goal[1])
        reward = jnp.where(terminated, jnp.float32(1.0), params.step_reward.astype(jnp.float32))
        time = state.time + 1
        truncated = time >= params.max_steps
        next_state = GridWorldState(cell=cell, time=time)
        return self.observation(cell), next_state, reward, terminated, truncated, {}


CELL_PIXELS = 32
COLOURS = {"free": (245, 245, 245), "wall": (60, 60, 60), "goal": (80, 180, 80), "start": (190, 210, 240),
           "path": (40, 90, 200), "agent": (220, 50, 50), "grid": (200, 200, 200)}


def draw_grid(walls: np.ndarray, start: Sequence[int], goal: Sequence[int],
              path: Sequence[Sequence[int]]) -> np.ndarray:
    """The grid (walls, start, goal), the cells visited so far joined by a line, the agent at the last one."""
    from PIL import Image, ImageDraw  # Pillow (matplotlib's dependency), only when drawing

    height, width = walls.shape
    image = Image.new("RGB", (width * CELL_PIXELS, height * CELL_PIXELS), COLOURS["free"])
    draw = ImageDraw.Draw(image)
    box = lambda row, col: [col * CELL_PIXELS, row * CELL_PIXELS,
                            (col + 1) * CELL_PIXELS - 1, (row + 1) * CELL_PIXELS - 1]
    centre = lambda row, col: ((col + 0.5) * CELL_PIXELS, (row + 0.5) * CELL_PIXELS)
    for row in range(height):
        for col in range(width):
            kind = "wall" if walls[row, col] else "free"
            kind = "goal" if (row, col) == tuple(goal) else "start" if (row, col) == tuple(start) else kind
            draw.rectangle(box(row, col), fill=COLOURS[kind], outline=COLOURS["grid"])
    if len(path) > 1:
        draw.line([centre(*cell) for cell in path], fill=COLOURS["path"], width=3)
    row, col = path[-1]
    inset = CELL_PIXELS // 5
    x0, y0, x1, y1 = box(row, col)
    draw.ellipse([x0 + inset, y0 + inset, x1 - inset, y1 - inset], fill=COLOURS["agent"])
    return np.asarray(image)


@register_env("gridworld", config=GridWorldConfig, encodings=ENCODINGS)
def make_gridworld(config: GridWorldConfig) -> tuple[GridWorld, GridWorldParams]:
    """The env and its default params from a validated config."""
    env = GridWorld(config)
    return env, env.default_params
