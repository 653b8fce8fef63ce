"""The functional environment contract (gymnax-1.0 compatible) and its auto-reset step.

    obs, state = env.reset(key, params)
    obs, state, reward, terminated, truncated, info = env.step(key, state, action, params)
    obs, state, reward, terminated, truncated, info = env.step_env(key, state, action, params)

An env says what its observations and actions are with `observation_space(params)` and `action_space(params)`
(framework/core/spaces.py: Discrete or Box); a discrete-action env may define `num_actions` alone instead.

`terminated` is a real end (no bootstrap); `truncated` is a time limit (bootstrap from
`info["final_observation"]`, the observation before the automatic reset). An env may also draw
itself (`render(state, params) -> uint8 [H, W, 3]`, gymnax-style) for `framework.tools.evaluate --gif`.
`EpisodeStatistics` wraps any env with the bookkeeping of finished episodes every algorithm logs.
"""
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from lightspeed.framework.core.spaces import Box, Discrete, Space

StepResult = tuple[jax.Array, Any, jax.Array, jax.Array, jax.Array, dict[str, Any]]


def dtype_bounds(dtype: np.dtype) -> tuple[Any, Any]:
    """The widest (low, high) of a dtype: infinite for floats, its range for integers, 0 and 1 for bools."""
    if dtype.kind == "f":
        return -np.inf, np.inf
    if dtype.kind in "iu":
        return np.iinfo(dtype).min, np.iinfo(dtype).max
    return 0, 1


class Environment:
    """Subclasses implement `reset_env`, `step_env`, `default_params` and the properties."""

    name: str = "environment"
    # False when `step_env` ignores its key: `step` then hands the whole key to the reset.
    stochastic_transitions: bool = True
    # Steps per second of real time, for animations of `render`'s frames.
    render_fps: int = 30

    @property
    def default_params(self) -> Any:
        raise NotImplementedError

    @property
    def num_actions(self) -> int:
        """How many discrete actions there are (a discrete-action env defines this or `action_space`)."""
        if type(self).action_space is Environment.action_space:
            raise NotImplementedError(f"{self.name} defines neither num_actions nor action_space")
        space = self.action_space(self.default_params)
        if not isinstance(space, Discrete):
            raise AttributeError(f"{self.name}'s actions are {space.describe()}: it has no number of actions")
        return space.n

    @property
    def observation_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def action_space(self, params: Any) -> Space:
        """The actions `step` takes (default: Discrete(num_actions))."""
        return Discrete(self.num_actions)

    def observation_space(self, params: Any) -> Space:
        """The observations it gives (default: an unbounded Box of observation_shape, of `observation_dtype` if the
        env has one, else float32)."""
        dtype = np.dtype(getattr(self, "observation_dtype", np.float32))
        return Box(*dtype_bounds(dtype), self.observation_shape, dtype)

    def max_episode_steps(self, params: Any) -> int:
        """An upper bound on episode length (a static int), used to size evaluation."""
        raise NotImplementedError

    def reset_env(self, key: jax.Array, params: Any) -> tuple[jax.Array, Any]:
        raise NotImplementedError

    def step_env(self, key: jax.Array, state: Any, action: jax.Array, params: Any) -> StepResult:
        raise NotImplementedError

    @property
    def renders(self) -> bool:
        """True when this env implements `render` (or `render_episode`)."""
        return (type(self).render is not Environment.render
                or type(self).render_episode is not Environment.render_episode)

    def render(self, state: Any, params: Any) -> np.ndarray:
        """One frame (uint8 [H, W, 3]) of a single, unbatched state; optional."""
        raise NotImplementedError(f"{self.name} cannot render")

    def render_episode(self, states: list[Any], params: Any) -> list[np.ndarray]:
        """The frames of an episode's states; an env may draw more than one state per frame (a path)."""
        return [self.render(state, params) for state in states]

    def reset(self, key: jax.Array, params: Any = None) -> tuple[jax.Array, Any]:
        return self.reset_env(key, self.default_params if params is None else params)

    def step(self, key: jax.Array, state: Any, action: jax.Array, params: Any = None) -> StepResult:
        """Step, then reset where the episode ended; the pre-reset observation goes in info."""
        params = self.default_params if params is None else params
        step_key, reset_key = jax.random.split(key) if self.stochastic_transitions else (key, key)
        obs, next_state, reward, terminated, truncated, info = self.step_env(step_key, state, action, params)
        reset_obs, reset_state = self.reset_env(reset_key, params)
        done = terminated | truncated
        next_state = jax.tree.map(lambda r, s: jnp.where(done, r, s), reset_state, next_state)
        info = {**info, "final_observation": obs}
        return jnp.where(done, reset_obs, obs), next_state, reward, terminated, truncated, info


def can_render(env: Environment) -> bool:
    """Whether the env (or the one a wrapper holds) draws itself."""
    env = getattr(env, "env", env)
    return env.renders


@struct.dataclass
class EpisodeStatisticsState:
    env_state: Any
    episode_return: jax.Array  # running return of the current episode
    episode_length: jax.Array
    returned_episode_return: jax.Array  # return of the last finished episode
    returned_episode_length: jax.Array


class EpisodeStatistics(Environment):
    """Adds the return and length of the last finished episode to `info`."""

    def __init__(self, env: Environment):
        self.env = env
        self.name = env.name
        self.stochastic_transitions = env.stochastic_transitions
        self.render_fps = env.render_fps

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.env, attribute)

    @property
    def default_params(self) -> Any:
        return self.env.default_params

    @property
    def num_actions(self) -> int:
        return self.env.num_actions

    @property
    def observation_shape(self) -> tuple[int, ...]:
        return self.env.observation_shape

    def action_space(self, params: Any) -> Space:
        return self.env.action_space(params)

    def observation_space(self, params: Any) -> Space:
        return self.env.observation_space(params)

    def max_episode_steps(self, params: Any) -> int:
        return self.env.max_episode_steps(params)

    def render(self, state: EpisodeStatisticsState, params: Any) -> np.ndarray:
        return self.env.render(state.env_state, params)

    def render_episode(self, states: list[EpisodeStatisticsState], params: Any) -> list[np.ndarray]:
        return self.env.render_episode([state.env_state for state in states], params)

    def reset_env(self, key: jax.Array, params: Any) -> tuple[jax.Array, EpisodeStatisticsState]:
        obs, env_state = self.env.reset_env(key, params)
        zero = jnp.zeros((), jnp.float32)
        return obs, EpisodeStatisticsState(env_state, zero, jnp.zeros((), jnp.int32), zero, jnp.zeros((), jnp.int32))

    def _count(self, state: EpisodeStatisticsState, result: StepResult) -> StepResult:
        obs, env_state, reward, terminated, truncated, info = result
        done = terminated | truncated
        episode_return = state.episode_return + reward
        episode_length = state.episode_length + 1
        new_state = EpisodeStatisticsState(
            env_state,
            jnp.where(done, 0.0, episode_return),
            jnp.where(done, 0, episode_length),
            jnp.where(done, episode_return, state.returned_episode_return),
            jnp.where(done, episode_length, state.returned_episode_length),
        )
        info = {**info, "returned_episode_return": new_state.returned_episode_return,
                "returned_episode_length": new_state.returned_episode_length, "returned_episode": done}
        return obs, new_state, reward, terminated, truncated, info

    def step_env(self, key: jax.Array, state: EpisodeStatisticsState, action: jax.Array, params: Any) -> StepResult:
        return self._count(state, self.env.step_env(key, state.env_state, action, params))

    def step(self, key: jax.Array, state: EpisodeStatisticsState, action: jax.Array, params: Any = None) -> StepResult:
        params = self.default_params if params is None else params
        return self._count(state, self.env.step(key, state.env_state, action, params))
