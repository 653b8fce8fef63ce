"""Atari 2600 games through the Arcade Learning Environment's C++ vector env (ale-py), stepped by actor threads.

    python run.py algo=apex env=atari env.id=Pong          # pip install "lightspeed[atari]"
    python run.py algo=dqn env=atari env.id=Breakout env.sticky_actions=0.25

The field's protocol (Mnih et al. 2015; Machado et al. 2018 for sticky actions), all done by the engine in C++:
4 frames per step with the max over the last two, 84x84 grayscale, a stack of the last 4 (zero-padded at a
reset, as gymnasium's FrameStackObservation(padding_type="zero")), up to `noop_max` no-ops after FIRE at a
reset (the engine draws 0..noop_max-1), episodes cut at 108k frames (27k steps). The engine runs with neither
reward clipping nor episodic life, so the raw score is always known: training clips rewards to their sign and
ends a transition at a lost life (no bootstrap, but no reset and no stack boundary) here, on the actor side;
evaluation plays whole games in envs of its own, scored raw, epsilon-greedy at `eval_epsilon`.
Observations are declared channels first ([4, 84, 84] from the engine) and handed to networks as [84, 84, 4]:
the last axis is the stack, one new frame per step (`frame_stack`), which lets replay store each frame once.
"""
import contextlib
import dataclasses
import difflib
import re
from typing import Any, Iterator, Optional

import gymnasium
import numpy as np
from gymnasium import spaces

from lightspeed.envs.gymnasium_vector import HostVectorEnv
from lightspeed.framework.core.errors import (
    ConfigError,
    check,
    check_choice,
    check_installed,
    check_number,
    check_positive_int,
)
from lightspeed.framework.core.host_env import (
    DEFAULT_TIMEOUT_S,
    MAX_VECTOR_ENVS,
    ON_ERROR_CHOICES,
    HostEnvError,
    HostEnvironment,
    HostStep,
    describe,
)
from lightspeed.framework.core.registry import register_env

FRAME_SIZE, FRAME_STACK = 84, 4
ENGINE_SEEDS = 2**31 - MAX_VECTOR_ENVS  # the engine takes int32 seeds, env i of a vector env seed + i


@dataclasses.dataclass
class AtariConfig:
    """Atari 2600 games through the Arcade Learning Environment: the DQN paper's frames (84 x 84 grey, 4 stacked),
    sticky actions as a key."""

    name: str = "atari"  # the registered name of the env that env=atari chooses
    id: str = "Pong"  # the game, as in gymnasium's ALE/<id>-v5: Pong, Breakout, SpaceInvaders, MsPacman, ...
    # Machado et al.'s sticky actions: each frame repeats the previous action with this chance (their protocol:
    # 0.25); 0 (default): deterministic emulation, the DQN papers' setting with no-op starts
    sticky_actions: float = 0.0
    noop_max: int = 30  # a reset plays 0..noop_max-1 no-ops (after FIRE), so episodes start apart
    fire_reset: bool = True  # press FIRE at a reset in games that need it to start (Breakout's ball)
    full_action_space: bool = False  # all 18 actions instead of the game's minimal set
    max_episode_frames: int = 108_000  # 27k steps of 4 frames: the evaluation cap of the Ape-X and Rainbow papers
    # training only: clip rewards to their sign and end a transition where a life is lost (the raw score and
    # whole games stay what evaluation and the logged episode returns count)
    clip_rewards: bool = True
    life_loss_terminal: bool = True  # training only: a lost life ends the transition (no bootstrap); the game goes on
    # evaluation acts epsilon-greedily (the DQN papers' 0.001-0.05): a greedy policy can stall a game forever
    eval_epsilon: float = 0.001
    num_threads: int = 0  # the engine's own C++ threads per vector env (0: as many as it sees cores)
    # an exception from the engine (built, reset or stepped): stop the run (default) or give the actor thread new
    # envs, reseeded
    on_error: str = "stop"

    def validate(self) -> None:
        check(isinstance(self.id, str) and self.id != "", "env.id", self.id, "an Atari game, e.g. Pong or Breakout")
        check_number("env.sticky_actions", self.sticky_actions, 0, 1, high_inclusive=False)
        check_positive_int("env.noop_max", self.noop_max, minimum=0)
        check_positive_int("env.max_episode_frames", self.max_episode_frames, minimum=4)
        check_number("env.eval_epsilon", self.eval_epsilon, 0, 1)
        check_positive_int("env.num_threads", self.num_threads, minimum=0)
        check_choice("env.on_error", self.on_error, ON_ERROR_CHOICES)
        for key in ("fire_reset", "full_action_space", "clip_rewards", "life_loss_terminal"):
            check(isinstance(getattr(self, key), bool), f"env.{key}", getattr(self, key), "true or false")


def rom_id(game: str) -> str:
    """gymnasium's CamelCase game name -> ale-py's ROM id (SpaceInvaders -> space_invaders)."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", game).lower()


def camel_case(rom: str) -> str:
    return "".join(part.capitalize() for part in rom.split("_"))


def check_game(config: AtariConfig) -> None:
    """ale-py installed and `config.id` one of its ROMs (they ship in its wheel), else a one-paragraph error."""
    config.validate()
    check_installed("ale_py", "atari", "env", "atari")
    from ale_py import roms
    games = sorted(camel_case(rom) for rom in roms.get_all_rom_ids())
    if rom_id(config.id) not in roms.get_all_rom_ids():
        close = difflib.get_close_matches(config.id, games, n=3, cutoff=0.5)
        hint = f"; closest: {', '.join(close)}" if close else ""
        raise ConfigError("env.id", config.id, f"one of ale-py's {len(games)} games, e.g. Pong, Breakout{hint}",
                          "no such ROM")


def engine(config: AtariConfig, num_envs: int, num_threads: Optional[int] = None) -> Any:
    """ale-py's vector env with the protocol's preprocessing, raw rewards and whole games, NEXT_STEP autoreset."""
    from ale_py.vector_env import AtariVectorEnv

    return AtariVectorEnv(
        game=rom_id(config.id), num_envs=num_envs, num_threads=config.num_threads if num_threads is None else
        num_threads, max_num_frames_per_episode=config.max_episode_frames,
        repeat_action_probability=config.sticky_actions, full_action_space=config.full_action_space,
        autoreset_mode="NextStep", img_height=FRAME_SIZE, img_width=FRAME_SIZE, grayscale=True,
        stack_num=FRAME_STACK, frameskip=4, maxpool=True, noop_max=config.noop_max, episodic_life=False,
        reward_clipping=False, use_fire_reset=config.fire_reset)


def channels_last(obs: np.ndarray) -> np.ndarray:
    """The engine's [..., 4, 84, 84] stacks as networks take them, [..., 84, 84, 4] (the stack last)."""
    return np.ascontiguousarray(np.moveaxis(obs, -3, -1))


@contextlib.contextmanager
def engine_faults(game: str) -> Iterator[None]:
    """An exception from the engine (building, reset or step) as a HostEnvError: env.on_error's to handle. The
    engine does not say which env failed; the error names the line that raised."""
    try:
        yield
    except Exception as error:
        raise HostEnvError(game, None, describe(error), where="its vector engine") from error


class FaultTaggedEngine:
    """The engine whose own calls (reset, step) raise HostEnvErrors; the adapter's code around them is not an
    engine fault (a bug there is a traceback, never restarted under env.on_error=restart)."""

    def __init__(self, vector: Any, game: str):
        self.vector, self.game = vector, game

    def reset(self, **kwargs: Any) -> tuple:
        with engine_faults(self.game):
            return self.vector.reset(**kwargs)

    def step(self, actions: np.ndarray) -> tuple:
        with engine_faults(self.game):
            return self.vector.step(actions)

    def __getattr__(self, name: str) -> Any:  # spaces, metadata, num_envs, close: the engine's own
        return getattr(self.vector, name)


class AtariVectorEnv(HostVectorEnv):
    """The engine's envs as HostSteps for training: raw returns counted, rewards clipped and lost lives
    ending transitions (not episodes) when the config says so."""

    def __init__(self, config: AtariConfig, num_envs: int):
        self.config = config
        with engine_faults(config.id):
            vector = engine(config, num_envs)
        super().__init__(FaultTaggedEngine(vector, config.id), config.id)
        self.observation_shape = (FRAME_SIZE, FRAME_SIZE, FRAME_STACK)

    def reset(self, seed: int) -> np.ndarray:
        obs = super().reset(seed % ENGINE_SEEDS)
        self._lives = np.asarray(self.info["lives"]).copy()
        return channels_last(obs)

    def step(self, actions: np.ndarray) -> HostStep:
        step = super().step(actions)
        lives = np.asarray(self.info["lives"])
        # a reset step (acted False) brings a new game's lives; a game's end is an end anyway
        lost_life = step.acted & ~step.ended & (lives < self._lives)
        self._lives = lives.copy()
        return dataclasses.replace(
            step, obs=channels_last(step.obs), final_obs=channels_last(step.final_obs),
            reward=np.sign(step.reward).astype(np.float32) if self.config.clip_rewards else step.reward,
            terminated=step.terminated | lost_life if self.config.life_loss_terminal else step.terminated)


class AtariEvaluationEnv(gymnasium.Env):
    """One whole game for one evaluation episode (framework.core.host_env.host_evaluate): the training
    preprocessing, raw score, no episodic life; `rgb_array` renders the newest frame, upscaled."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 15}

    def __init__(self, config: AtariConfig, render_mode: Optional[str] = None):
        self.engine, self.render_mode = engine(config, 1, num_threads=1), render_mode
        self.action_space = spaces.Discrete(int(self.engine.single_action_space.n))
        self.observation_space = spaces.Box(0, 255, (FRAME_SIZE, FRAME_SIZE, FRAME_STACK), np.uint8)
        self._obs: Optional[np.ndarray] = None

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[np.ndarray, dict]:
        obs, info = self.engine.reset(seed=None if seed is None else int(seed) % ENGINE_SEEDS)
        self._obs = channels_last(obs[0])
        return self._obs, {"lives": int(info["lives"][0])}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.engine.step(np.array([action], np.int64))
        self._obs = channels_last(obs[0])
        return self._obs, float(reward[0]), bool(terminated[0]), bool(truncated[0]), {"lives": int(info["lives"][0])}

    def render(self) -> np.ndarray:
        frame = np.kron(self._obs[..., -1], np.ones((2, 2), np.uint8))  # 168 x 168: what the agent sees, bigger
        return np.repeat(frame[..., None], 3, axis=-1)

    def close(self) -> None:
        self.engine.close()


class AtariEnv(HostEnvironment):
    """An Atari game as the framework sees it: its spaces, the actors' vector envs and evaluation's single games."""

    frame_stack = FRAME_STACK  # the observation's last axis holds the last 4 frames, one new per step

    def __init__(self, config: AtariConfig):
        self.config, self.eval_epsilon = config, config.eval_epsilon
        probe = engine(config, 1, num_threads=1)
        try:
            super().__init__(config.id, int(probe.single_action_space.n), (FRAME_SIZE, FRAME_SIZE, FRAME_STACK),
                             np.dtype(np.uint8))
        finally:
            probe.close()

    def max_episode_steps(self, params: Any = None) -> int:
        return -(-self.config.max_episode_frames // 4)

    def vector_env(self, num_envs: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> AtariVectorEnv:
        """`num_envs` envs for an actor thread (the engine's C++ steps them; a raised error stays an exception)."""
        return AtariVectorEnv(self.config, num_envs)

    def evaluation_env(self, render_mode: Optional[str] = None) -> AtariEvaluationEnv:
        return AtariEvaluationEnv(self.config, render_mode)


@register_env("atari", config=AtariConfig, host=True)
def make_atari(config: AtariConfig) -> tuple[AtariEnv, None]:
    check_game(config)
    return AtariEnv(config), None
