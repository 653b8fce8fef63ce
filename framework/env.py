"""The functional environment contract (gymnax-1.0 compatible) and its auto-reset step.

    obs, state = env.reset(key, params)
    obs, state, reward, terminated, truncated, info = env.step(key, state, action, params)
    obs, state, reward, terminated, truncated, info = env.step_env(key, state, action, params)

`terminated` is a real end (no bootstrap); `truncated` is a time limit (bootstrap from
`info["final_observation"]`, the observation before the automatic reset).
"""
from typing import Any

import jax
import jax.numpy as jnp

StepResult = tuple[jax.Array, Any, jax.Array, jax.Array, jax.Array, dict[str, Any]]


class Environment:
    """Subclasses implement `reset_env`, `step_env`, `default_params` and the properties."""

    name: str = "environment"
    # False when `step_env` ignores its key: `step` then hands the whole key to the reset.
    stochastic_transitions: bool = True

    @property
    def default_params(self) -> Any:
        raise NotImplementedError

    @property
    def num_actions(self) -> int:
        raise NotImplementedError

    @property
    def observation_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def max_episode_steps(self, params: Any) -> int:
        """An upper bound on episode length (a static int), used to size evaluation."""
        raise NotImplementedError

    def reset_env(self, key: jax.Array, params: Any) -> tuple[jax.Array, Any]:
        raise NotImplementedError

    def step_env(self, key: jax.Array, state: Any, action: jax.Array, params: Any) -> StepResult:
        raise NotImplementedError

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
