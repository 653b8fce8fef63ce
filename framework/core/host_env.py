"""The host env contract: an env stepped in Python (by actor threads or Ray actor processes) for a JAX learner.

`HostEnvironment` is what the framework sees of such an env (its spaces; `vector_env` for the actors,
`evaluation_env` for one evaluation episode); `HostStep` is the one step every actor consumes, on the JAX
contract (framework/core/env.py): `terminated` is a real end (no bootstrap), `truncated` a time limit (bootstrap
from `final_obs`, the true next observation before any reset); `acted=False` marks an engine's reset step (no
transition). A fault in an env's own code is a `HostEnvError`. Observations reach networks encoded:
Discrete one-hot float32, Box as they are. `host_evaluate` plays evaluation episodes, each reproducible
from its seed. Adapters (gymnasium's, in envs/gymnasium_vector.py; Atari's) implement this contract.
"""
import dataclasses
import traceback
from typing import Any, Callable, Optional, Sequence

import gymnasium
import numpy as np
from gymnasium import spaces

from lightspeed.framework.core.env import Environment
from lightspeed.framework.core.spaces import Box, Discrete, Space, from_gymnasium

# numpy's legacy RandomState (MinAtar's package, many users' envs) takes seeds in [0, 2**32) only
SEED_SPACE = 2**32
DEFAULT_TIMEOUT_S = 60.0  # env.timeout_s of every host env: how long a step may take before it is a fault
ON_ERROR_CHOICES = ("stop", "restart")  # env.on_error of every host env: end the run, or new envs
MAX_VECTOR_ENVS = 2**20  # a vector env reset with seed s seeds its env i with s + i


class HostEnvError(RuntimeError):
    """An env (or the worker process holding it) failed; names the env id, the env index or the worker (or
    `where`, for an engine that does not say which env failed)."""

    def __init__(self, env_id: str, env_index: Optional[int], detail: str, worker: Optional[int] = None,
                 where: Optional[str] = None):
        self.env_id, self.env_index, self.detail, self.worker = env_id, env_index, detail, worker
        where = where or (f"env index {env_index}" if env_index is not None else f"worker {worker}")
        in_worker = f" (worker process {worker})" if env_index is not None and worker is not None else ""
        super().__init__(f"The host env {env_id!r} failed at {where}{in_worker}: {detail}. The env's own code "
                         "raised or stopped answering; the run's env.on_error decides whether it stops or restarts.")


def derived_seed(*numbers: int) -> int:
    """A host env seed hashed from non-negative `numbers` (a run's seed, a thread, an env step ...): apart for
    different numbers, and with room below 2**32 for a vector env's s + i."""
    state = np.random.SeedSequence(list(numbers)).generate_state(1, np.uint64)[0]
    return int(state % (SEED_SPACE - MAX_VECTOR_ENVS))


def describe(error: BaseException) -> str:
    """One line: the exception's type, message and the line that raised it."""
    frames = traceback.extract_tb(error.__traceback__)
    place = f" (raised at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(error).__name__}: {error}{place}".replace("\n", " ")


# ---------------------------------------------------------------------------------------------------
# Spaces, observations and steps.


def encoded_shape(space: spaces.Space) -> tuple[int, ...]:
    return (int(space.n),) if isinstance(space, spaces.Discrete) else tuple(int(n) for n in space.shape)


def encoded_dtype(space: spaces.Space) -> np.dtype:
    return np.dtype(np.float32) if isinstance(space, spaces.Discrete) else np.dtype(space.dtype)


def encode_observations(space: spaces.Space, raw: np.ndarray) -> np.ndarray:
    """A batch of raw observations [N, ...] as networks take them: Discrete one-hot float32, Box as is."""
    if not isinstance(space, spaces.Discrete):
        return np.array(raw, dtype=space.dtype)
    indices = np.asarray(raw, np.int64) - int(space.start)
    one_hot = np.zeros((len(indices), int(space.n)), np.float32)
    one_hot[np.arange(len(indices)), indices] = 1.0
    return one_hot


class HostEnvironment(Environment):
    """An env stepped on the host in Python (framework/sebulba/trainer.py) as the framework sees it: the spaces an
    algorithm sizes itself from. Nothing of it runs in JAX: `reset_env` and `step_env` do not exist, and `host`
    tells the trainer so. Subclasses add `vector_env(num_envs, timeout_s)` for the actors and
    `evaluation_env(render_mode)` for one evaluation episode."""

    host = True

    def __init__(self, name: str, actions: int | Space, observation_shape: tuple[int, ...],
                 observation_dtype: np.dtype):
        """`actions`: the action space, or a number of discrete actions."""
        self.name = name
        self._action_space = actions if isinstance(actions, (Discrete, Box)) else Discrete(int(actions))
        self._observation_shape, self.observation_dtype = observation_shape, observation_dtype

    @property
    def default_params(self) -> None:
        return None

    def action_space(self, params: Any = None) -> Space:
        return self._action_space

    @property
    def observation_shape(self) -> tuple[int, ...]:
        return self._observation_shape


@dataclasses.dataclass
class HostStep:
    obs: np.ndarray  # [N, ...] what each env acts on next (after any reset)
    reward: np.ndarray  # [N] float32 (0 where not acted)
    terminated: np.ndarray  # [N] bool
    truncated: np.ndarray  # [N] bool
    final_obs: np.ndarray  # [N, ...] the transition's true next obs (pre-reset where it ended; == obs otherwise)
    acted: np.ndarray  # [N] bool: False where the engine used this step to reset (NEXT_STEP): no transition
    episode_return: np.ndarray  # [N] float32: return of the episode that ended at this step (valid where ended)
    episode_length: np.ndarray  # [N] int32, likewise
    ended: np.ndarray  # [N] bool: terminated | truncated, for acted envs
    started: np.ndarray  # [N] bool: `obs` is an episode's first observation (a reset came before it)


# ---------------------------------------------------------------------------------------------------
# Evaluation.


def env_action(space: Space) -> Callable[[Any], Any]:
    """One policy action as the env takes it: a discrete index shifted to the space's start, or a Box action as
    an array of its dtype clipped to its bounds (an out-of-bounds action never reaches the env)."""
    if isinstance(space, Discrete):
        return lambda action: int(action) + space.start
    return lambda action: np.clip(np.asarray(action, space.dtype).reshape(space.shape), space.low, space.high)


def env_actions(space: Space, actions: np.ndarray) -> np.ndarray:
    """A batch of policy actions [N, ...] as a vector env takes them (see env_action)."""
    if isinstance(space, Discrete):
        return np.asarray(actions).astype(np.int64) + space.start
    batch = np.asarray(actions, space.dtype).reshape((-1, *space.shape))
    return np.clip(batch, space.low, space.high)


class EpisodeExploration:
    """Evaluation's epsilon-greedy choice for one episode, from a generator of its own seeded by the episode's
    seed: the episode replays the same whatever else plays beside it."""

    STREAM = 7  # the generator's second seed word: apart from the env's own use of the episode seed

    def __init__(self, episode_seed: int, epsilon: float, num_actions: int):
        self.rng = np.random.default_rng([episode_seed, self.STREAM])
        self.epsilon, self.num_actions = epsilon, num_actions

    def __call__(self, greedy_action: int) -> int:
        explore, random_action = self.rng.random(), int(self.rng.integers(self.num_actions))
        return random_action if explore < self.epsilon else greedy_action


def host_evaluate(make_env: Callable[[], gymnasium.Env], act: Callable[[np.ndarray, np.ndarray], Any],
                  episode_seeds: Sequence[int], num_envs: int, epsilon: float = 0.0) -> np.ndarray:
    """The undiscounted return of each greedy (epsilon-greedy) episode [len(episode_seeds)] (float64).

    `num_envs` episodes run at once; `act(obs, start)` always gets a full batch [num_envs, ...] (idle slots hold
    zeros, so a jitted act compiles once) and `start` [num_envs], True where a slot's episode begins (its policy
    state, a recurrent one, starts there). Episode e plays in an env of its own, reset with seed `episode_seeds[e]`:
    its result depends on nothing else (an env may keep state across resets, as MinAtar's sticky last action
    does; its exploration draws are its own), so replaying it with the same seed reproduces it, as long as the
    env honours seeds.
    """
    num_episodes = len(episode_seeds)
    slots: list[Optional[tuple[int, gymnasium.Env]]] = [None] * num_envs
    explorations: list[Optional[EpisodeExploration]] = [None] * num_envs
    returns = np.zeros(num_episodes, np.float64)
    starting = np.zeros(num_envs, bool)
    next_episode = 0
    batch = encode = to_env = None
    try:
        while True:
            for slot in range(num_envs):
                if slots[slot] is None and next_episode < num_episodes:
                    env = make_env()
                    obs, _ = env.reset(seed=int(episode_seeds[next_episode]))
                    if batch is None:  # every env has the first one's spaces (read once: wrappers make reads slow)
                        space, to_env = env.observation_space, env_action(from_gymnasium(env.action_space))
                        batch = np.zeros((num_envs, *encoded_shape(space)), encoded_dtype(space))
                        # a Box observation is written as it is (the batch casts it); a Discrete one one-hot encoded
                        encode = (lambda obs: obs) if isinstance(space, spaces.Box) else (
                            lambda obs, space=space: encode_observations(space, np.asarray(obs)[None])[0])
                    batch[slot] = encode(obs)
                    slots[slot] = (next_episode, env)
                    starting[slot] = True
                    if epsilon > 0:
                        explorations[slot] = EpisodeExploration(int(episode_seeds[next_episode]), epsilon,
                                                                int(env.action_space.n))
                    next_episode += 1
            running = [slot for slot in range(num_envs) if slots[slot] is not None]
            if not running:
                return returns
            actions = list(np.asarray(act(batch.copy(), starting.copy())))  # act may keep its input
            starting[:] = False
            for slot in running:
                episode, env = slots[slot]
                action = actions[slot] if epsilon == 0 else explorations[slot](actions[slot])
                obs, reward, terminated, truncated, _ = env.step(to_env(action))
                returns[episode] += float(reward)
                batch[slot] = encode(obs)
                if terminated or truncated:
                    env.close()
                    slots[slot] = None
                    batch[slot] = 0
    finally:
        for held in slots:
            if held is not None:
                held[1].close()
