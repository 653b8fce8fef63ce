"""Environment wrappers that keep the functional contract."""
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from framework.env import Environment, StepResult


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

    def max_episode_steps(self, params: Any) -> int:
        return self.env.max_episode_steps(params)

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
