"""Any gymnax environment, discrete or continuous actions, on this project's contract.

    python run.py env=gymnax env.id=Acrobot-v1 env.params.max_steps_in_episode=300
    python run.py algo=d4pg env=gymnax env.id=Pendulum-v1

gymnax 1.0's `step_env` gives (obs, state, reward, terminated, info) and `is_truncated(state,
params)` the time limit; both are kept apart as `terminated` and `truncated`, and the auto-reset
step with `info["final_observation"]` is `framework.core.env.Environment.step`. `env.params.*`
overrides fields of the env's own params; `env.sticky_actions` adds MinAtar's sticky actions (each
step repeats the previous action with that chance; env=minatar sets the paper's 0.1). gymnax costs
~1 s to import: only when this env is built.
"""
import dataclasses
import fnmatch
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from lightspeed.framework.core.env import Environment, StepResult
from lightspeed.framework.core.errors import ConfigError, check, check_installed, check_number
from lightspeed.framework.core.registry import register_env
from lightspeed.framework.core.spaces import Space, from_gymnasium

# MinAtar's channels are 0/1 floats in gymnax; as booleans a 1M-transition replay takes 8x less memory
BOOLEAN_OBSERVATIONS = "-MinAtar"


@dataclasses.dataclass
class GymnaxConfig:
    name: str = "gymnax"  # the registered name of the env that env=gymnax (and env=minatar) chooses
    id: str = "CartPole-v1"  # a gymnax id: gymnax.registered_envs (the algorithm says which action kinds it takes)
    # the ids this env option takes (a glob): env=minatar, with MinAtar's own run settings, "*-MinAtar"
    id_pattern: str = "*"
    # Overrides of the env's own params (gymnax's EnvParams), e.g. {max_steps_in_episode: 200}.
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    # the chance that a step repeats the previous action instead of the chosen one (MinAtar's
    # sticky_action_prob: 0.1 in its paper, which gymnax leaves out), in training and evaluation alike;
    # discrete actions only
    sticky_actions: float = 0.0

    def validate(self) -> None:
        """Types only: the ids and params are gymnax's and are checked when it is imported."""
        check(isinstance(self.id, str) and self.id != "", "env.id", self.id, "a gymnax environment id, e.g. Acrobot-v1")
        check(isinstance(self.params, dict) and all(isinstance(k, str) for k in self.params), "env.params",
              self.params, "a mapping of the env's param names to values")
        check_number("env.sticky_actions", self.sticky_actions, 0, 1, high_inclusive=False)


def overridden_params(env_id: str, params: Any, overrides: dict[str, Any]) -> Any:
    """gymnax's params with scalar fields replaced; unknown names and wrong types are config errors."""
    scalars = {field.name: np.asarray(getattr(params, field.name)) for field in dataclasses.fields(params)
               if np.ndim(getattr(params, field.name)) == 0}
    replaced = {}
    for name, value in overrides.items():
        check(name in scalars, f"env.params.{name}", value, f"a scalar param of {env_id}: {', '.join(sorted(scalars))}",
              "unknown param")
        integer = np.issubdtype(scalars[name].dtype, np.integer)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        check(number and (not integer or float(value).is_integer()), f"env.params.{name}", value,
              f"{'an integer' if integer else 'a number'} (its default is {scalars[name].item()})")
        replaced[name] = int(value) if integer else float(value)
    return params.replace(**replaced)


CELL_PIXELS = 24
# one colour per MinAtar channel (up to Seaquest's 10); where channels overlap the later one shows
CHANNEL_COLOURS = np.array([[230, 75, 53], [77, 187, 213], [0, 160, 135], [60, 84, 136], [243, 155, 127],
                            [132, 145, 180], [145, 209, 194], [220, 0, 0], [126, 97, 72], [176, 156, 133]], np.uint8)


def draw_channels(observation: np.ndarray) -> np.ndarray:
    """An [H, W, C] grid of 0/1 channels as coloured cells on black, CELL_PIXELS a cell."""
    occupied = observation.astype(bool)
    topmost = occupied.shape[-1] - 1 - np.argmax(occupied[..., ::-1], axis=-1)
    colours = CHANNEL_COLOURS[topmost % len(CHANNEL_COLOURS)]
    frame = np.where(occupied.any(axis=-1)[..., None], colours, 0).astype(np.uint8)
    return frame.repeat(CELL_PIXELS, axis=0).repeat(CELL_PIXELS, axis=1)


@struct.dataclass
class StickyState:
    env_state: Any  # gymnax's own
    last_action: jax.Array  # what a sticky step repeats (0, MinAtar's no-op, after a reset)


class GymnaxEnv(Environment):
    """A gymnax env behind this project's contract; observations cast to booleans for MinAtar."""

    render_fps = 10  # MinAtar's frames, slow enough to follow

    def __init__(self, gymnax_env: Any, env_id: str, params: Any, observation_space: Any, one_hot: bool,
                 action_space: Space, sticky_actions: float = 0.0):
        self._env, self._params = gymnax_env, params
        self._sticky_actions = sticky_actions
        self.name = env_id
        self._boolean = env_id.endswith(BOOLEAN_OBSERVATIONS)
        # a Discrete observation (FrozenLake's cell index) becomes a one-hot vector a network can take
        self._one_hot_size = int(observation_space.n) if one_hot else None
        self._observation_shape = (self._one_hot_size,) if one_hot else tuple(int(n) for n in observation_space.shape)
        self._action_space = action_space

    @property
    def default_params(self) -> Any:
        return self._params

    def action_space(self, params: Any) -> Space:
        return self._action_space

    @property
    def observation_shape(self) -> tuple[int, ...]:
        return self._observation_shape

    def max_episode_steps(self, params: Any) -> int:
        return int(params.max_steps_in_episode)

    def _observe(self, obs: jax.Array) -> jax.Array:
        if self._one_hot_size is not None:
            return jax.nn.one_hot(obs, self._one_hot_size, dtype=jnp.float32)
        return obs.astype(jnp.bool_) if self._boolean else obs

    @property
    def renders(self) -> bool:
        return len(self._observation_shape) == 3  # image observations draw as their grid of channels

    def render(self, state: Any, params: Any) -> np.ndarray:
        env_state = state.env_state if self._sticky_actions else state
        return draw_channels(np.asarray(self._env.get_obs(env_state, params)))

    def reset_env(self, key: jax.Array, params: Any) -> tuple[jax.Array, Any]:
        obs, state = self._env.reset_env(key, params)
        if self._sticky_actions:
            state = StickyState(state, jnp.zeros((), jnp.int32))
        return self._observe(obs), state

    def step_env(self, key: jax.Array, state: Any, action: jax.Array, params: Any) -> StepResult:
        if not self._sticky_actions:
            return self._step_gymnax(key, state, action, params)
        sticky_key, key = jax.random.split(key)
        action = jnp.where(jax.random.uniform(sticky_key) < self._sticky_actions, state.last_action, action)
        obs, env_state, *rest = self._step_gymnax(key, state.env_state, action, params)
        return (obs, StickyState(env_state, jnp.asarray(action, jnp.int32)), *rest)

    def _step_gymnax(self, key: jax.Array, state: Any, action: jax.Array, params: Any) -> StepResult:
        obs, state, reward, terminated, _ = self._env.step_env(key, state, action, params)
        truncated = self._env.is_truncated(state, params)
        return (self._observe(obs), state, jnp.asarray(reward, jnp.float32), jnp.asarray(terminated, jnp.bool_),
                jnp.asarray(truncated, jnp.bool_), {})


@register_env("gymnax", config=GymnaxConfig)
def make_gymnax(config: GymnaxConfig) -> tuple[GymnaxEnv, Any]:
    check_installed("gymnax", "gymnax", "env", config.name)
    import gymnax  # ~1 s, and only for this env
    from gymnax.environments import spaces

    registered = [env_id for env_id in gymnax.registered_envs if fnmatch.fnmatchcase(env_id, config.id_pattern)]
    allowed = f"a gymnax id: {', '.join(registered)}"
    elsewhere = config.id in gymnax.registered_envs  # a gymnax id, but not one this env option takes
    check(config.id in registered, "env.id", config.id, allowed,
          f"this env option takes {config.id_pattern} ids only" if elsewhere else "not a gymnax environment")
    gymnax_env, params = gymnax.make(config.id)
    try:
        action_space = from_gymnasium(gymnax_env.action_space(params))
    except ValueError as error:
        raise ConfigError("env.id", config.id, f"{allowed} with Discrete or Box actions", str(error)) from None
    check(config.sticky_actions == 0 or action_space.kind == "discrete", "env.sticky_actions", config.sticky_actions,
          "0 for an env with continuous actions", f"{config.id}'s actions are {action_space.describe()}")
    params = overridden_params(config.id, params, config.params)
    space = gymnax_env.observation_space(params)
    return GymnaxEnv(gymnax_env, config.id, params, space, isinstance(space, spaces.Discrete), action_space,
                     config.sticky_actions), params
