"""Any gymnasium environment with a discrete action space, stepped on the host by actor threads.

    python run.py env=gymnasium env.id=CartPole-v1 env.num_workers=2
    python run.py env=gymnasium env.id=MinAtar/Breakout-v1          # pip install "lightspeed[minatar]"
    python run.py env=gymnasium env.id=my_package.envs:MyEnv-v0     # imports the module that registers it

The envs run in Python (framework/core/host_env.py), in this process or in `num_workers` worker processes,
each capped at `max_episode_steps` by gymnasium's TimeLimit (default: the id's registered cap; MinAtar
ids 1000, Freeway 2500). `check_env_id` fails on a bad id, a missing dependency or an unsupported space
before anything starts. Image observations given channels first ([C, H, W]) must be declared with
`channels_first=true`: they are transposed to [H, W, C] for the networks, never guessed from the shape.
"""
import dataclasses
import os
import sys
from typing import Any, Callable, Optional

import gymnasium
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from lightspeed.envs.gymnasium_vector import (
    EnvFactory,
    HostVectorEnv,
    build_vector_env,
    check_spaces,
    env_factory,
    pip_hint,
)
from lightspeed.framework.core.errors import ConfigError, check, check_choice, check_positive_int
from lightspeed.framework.core.host_env import (
    DEFAULT_TIMEOUT_S,
    ON_ERROR_CHOICES,
    HostEnvironment,
    describe,
    encoded_dtype,
    encoded_shape,
)
from lightspeed.framework.core.registry import register_env
from lightspeed.framework.core.spaces import from_gymnasium


@dataclasses.dataclass
class GymnasiumConfig:
    """Any gymnasium env with Discrete or Box actions, made by `gymnasium.make(id, **kwargs)` and stepped in Python."""

    name: str = "gymnasium"  # the registered name of the env that env=gymnasium chooses
    id: str = "CartPole-v1"  # a registered gymnasium id, or module:Id to import the module that registers it
    # keyword arguments of the env's constructor (gymnasium.make(id, **kwargs))
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    # the step cap every episode is truncated at; None: the id's registered cap (MinAtar: 1000, Freeway 2500)
    max_episode_steps: Optional[int] = None
    # 0: the envs step in this process; k: in k worker processes holding num_envs / k envs each
    num_workers: int = 0
    # the observation is an image given as [C, H, W] (declared, never guessed): transposed to [H, W, C]
    channels_first: bool = False
    # an env that raises: stop the run (one paragraph naming the env and the env step), or restart the envs of
    # its actor thread (new episodes, reseeded; the n-step windows in progress dropped), counted and logged
    on_error: str = "stop"

    def validate(self) -> None:
        """Types and ranges only: the id itself is checked by `check_env_id`, which imports and builds it."""
        check(isinstance(self.id, str) and self.id != "", "env.id", self.id,
              "a gymnasium environment id, e.g. CartPole-v1 or MinAtar/Breakout-v1")
        check(isinstance(self.kwargs, dict) and all(isinstance(key, str) for key in self.kwargs), "env.kwargs",
              self.kwargs, "a mapping of the env constructor's argument names to values")
        if self.max_episode_steps is not None:
            check_positive_int("env.max_episode_steps", self.max_episode_steps)
        check_positive_int("env.num_workers", self.num_workers, minimum=0)
        check(isinstance(self.channels_first, bool), "env.channels_first", self.channels_first, "true or false")
        check_choice("env.on_error", self.on_error, ON_ERROR_CHOICES)


def probe_env(factory: EnvFactory, env_id: str) -> gymnasium.Env:
    """One env built in this process, its construction failures as config errors."""
    try:
        env = factory.make()
        show_mujoco_warnings_once()
        return env
    except TypeError as error:
        raise ConfigError("env.kwargs", factory.kwargs, f"keyword arguments that {env_id}'s constructor takes",
                          describe(error)) from None
    except (ImportError, gymnasium.error.DependencyNotInstalled) as error:
        missing = getattr(error, "name", None)
        allowed = f"an id whose dependencies are installed: {pip_hint(missing)}" if missing else (
            "an id whose dependencies are installed")
        raise ConfigError("env.id", env_id, allowed, f"building it failed: {describe(error)}") from None


def check_channels(config: GymnasiumConfig, observation_space: spaces.Space) -> None:
    if config.channels_first:
        image = isinstance(observation_space, spaces.Box) and len(observation_space.shape) == 3
        check(image, "env.channels_first", True, "false, unless the observation is an image of shape [C, H, W]",
              f"{config.id}'s observation space is {observation_space}")


def check_env_id(config: GymnasiumConfig) -> EnvFactory:
    """The factory of `config`'s env, once its id, dependencies, kwargs, step cap and spaces are known good.

    Builds one env in this process to read its spaces; every problem is a one-paragraph ConfigError."""
    config.validate()
    factory = env_factory(config.id, config.kwargs, config.max_episode_steps)
    probe = probe_env(factory, config.id)
    try:
        check_spaces(config.id, probe.action_space, probe.observation_space)
        check_channels(config, probe.observation_space)
    finally:
        probe.close()
    return dataclasses.replace(factory, channels_first=config.channels_first)


def make_host_env(config: GymnasiumConfig, num_envs: int, autoreset_mode: AutoresetMode = AutoresetMode.NEXT_STEP,
                  timeout_s: float = DEFAULT_TIMEOUT_S) -> HostVectorEnv:
    """`num_envs` envs of `config` behind the normalized HostStep interface."""
    factory = check_env_id(config)
    return HostVectorEnv(build_vector_env(factory, num_envs, config.num_workers, autoreset_mode, timeout_s), config.id)


def evaluation_env_maker(config: GymnasiumConfig) -> Callable[[], gymnasium.Env]:
    """What `framework.core.host_env.host_evaluate` builds each evaluation episode's env with."""
    return check_env_id(config).make


class GymnasiumEnv(HostEnvironment):
    """A gymnasium id as the framework sees it: its spaces and the makers of its host envs."""

    def __init__(self, config: GymnasiumConfig, factory: EnvFactory):
        self.config, self.factory = config, factory
        probe = factory.make()
        try:
            super().__init__(config.id, from_gymnasium(probe.action_space), encoded_shape(probe.observation_space),
                             encoded_dtype(probe.observation_space))
        finally:
            probe.close()

    def max_episode_steps(self, params: Any = None) -> int:
        return self.factory.max_episode_steps

    def vector_env(self, num_envs: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> HostVectorEnv:
        """`num_envs` envs for actors; SAME_STEP autoreset, so no step is spent on a reset."""
        vector = build_vector_env(self.factory, num_envs, self.config.num_workers, AutoresetMode.SAME_STEP, timeout_s)
        return HostVectorEnv(vector, self.name)

    def evaluation_env(self, render_mode: Optional[str] = None) -> gymnasium.Env:
        """One env for one evaluation episode (framework.core.host_env.host_evaluate); `rgb_array`: one that draws."""
        if render_mode is None:
            return self.factory.make()
        if not os.environ.get("DISPLAY"):  # MuJoCo's renderer wants an OpenGL context: EGL's needs no display
            os.environ.setdefault("MUJOCO_GL", "egl")
        return dataclasses.replace(self.factory, kwargs={**self.factory.kwargs, "render_mode": render_mode}).make()


def show_mujoco_warnings_once() -> None:
    """MuJoCo prints its model compiler's warnings (MuJoCo 4 on HalfCheetah's settotalmass) at every model load, so for
    every env and every evaluation episode: once each is enough. A no-op unless the env imported MuJoCo."""
    mujoco = sys.modules.get("mujoco")
    if mujoco is None or getattr(mujoco.get_mju_user_warning(), "shows_once", False):
        return
    shown: set[str] = set()

    def show_once(text: str) -> None:
        if text not in shown:
            shown.add(text)
            print(f"MuJoCo warning: {text}", file=sys.stderr, flush=True)
    show_once.shows_once = True
    mujoco.set_mju_user_warning(show_once)


@register_env("gymnasium", config=GymnasiumConfig, host=True)
def make_gymnasium(config: GymnasiumConfig) -> tuple[GymnasiumEnv, None]:
    return GymnasiumEnv(config, check_env_id(config)), None
