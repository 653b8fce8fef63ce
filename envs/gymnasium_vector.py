"""gymnasium's envs as host envs: id resolution, the one-step adapter and worker processes.

    vector = make_vector_env("CartPole-v1", num_envs=8, num_workers=2, autoreset_mode=AutoresetMode.SAME_STEP)
    env = HostVectorEnv(vector, "CartPole-v1")
    obs = env.reset(seed=0)                    # env i seeded 0 + i
    step = env.step(actions)                   # a HostStep, whatever the engine's autoreset mode

`HostStep` (framework/core/host_env.py) is the one step every actor consumes. gymnasium's three
autoreset modes are normalized: SAME_STEP's final observation comes
from `info["final_obs"]`; NEXT_STEP's step after an end is a reset step, flagged `acted=False` (the action
was ignored and no transition exists); DISABLED envs are reset by the adapter itself right after they end.
Discrete observations become one-hot float32 vectors; Box observations keep their dtype (MinAtar's bool).

`make_vector_env` builds gymnasium's in-process SyncVectorEnv (num_workers=0) or `WorkerVectorEnv`: k
worker processes (forkserver, never fork: the parent runs JAX) each holding a slice of the envs, the
observations in shared memory. An exception inside any env becomes a `HostEnvError` naming the env id and
index; a worker that hangs past `timeout_s` or dies becomes one naming the worker. Every env is capped by
gymnasium's TimeLimit.
"""
import dataclasses
import difflib
import functools
import importlib
import multiprocessing
import multiprocessing.connection
import signal
import sys
import time
from typing import Any, Callable, Optional, Sequence

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv
from gymnasium.vector.utils import batch_space

from lightspeed.framework.core.errors import ConfigError, PluginError
from lightspeed.framework.core.host_env import (
    DEFAULT_TIMEOUT_S,
    HostEnvError,
    HostStep,
    describe,
    encode_observations,
    encoded_dtype,
    encoded_shape,
    env_actions,
)
from lightspeed.framework.core.spaces import from_gymnasium

# gymnasium 1.x loads no plugins: these namespaces are registered by calling their package's function
NAMESPACE_REGISTRATIONS = {"MinAtar": ("minatar.gym", "register_envs")}
MINATAR_GAMES = ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")
# suggested for a mistyped id even before the MinAtar package is imported
KNOWN_IDS = tuple(f"MinAtar/{game}-v{version}" for game in MINATAR_GAMES for version in (0, 1))
# MinAtar registers no step cap; gymnax's MinAtar envs stop at these
MINATAR_STEP_CAP, MINATAR_STEP_CAPS = 1000, {"Freeway": 2500}
# the pip install that brings a missing module, by its top-level name
PIP_EXTRAS = {"minatar": "lightspeed[minatar]", "ale_py": "lightspeed[atari]", "Box2D": "gymnasium[box2d]",
              "mujoco": "lightspeed[mujoco]", "pygame": "gymnasium[classic-control]"}
START_TIMEOUT_S = 120.0  # a worker's start imports and builds its envs: a slower answer than a step's
CLOSE_GRACE_S = 1.0  # how long close() waits for workers to close their envs before terminating them


# ---------------------------------------------------------------------------------------------------
# Resolving an env id: friendly errors before anything starts.


def pip_hint(module: str) -> str:
    top_level = module.split(".")[0]
    known = PIP_EXTRAS.get(top_level)
    return f'pip install "{known}"' if known else f"install the package that provides {top_level!r}"


def import_for_id(module: str, env_id: str) -> None:
    """Import the module an id names or needs; a failure is a ConfigError naming the missing dependency."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        missing = error.name or module
        raise ConfigError("env.id", env_id, f"an id whose module imports: {pip_hint(missing)}",
                          f"importing {module!r} failed: no module named {missing!r}") from None
    except Exception as error:  # any failure at import is the module's; name it
        raise ConfigError("env.id", env_id, "an id whose module imports", f"importing {module!r} failed: "
                          f"{describe(error)}") from None


def register_namespace(env_id: str) -> None:
    """Register a known namespace's ids (MinAtar/...) when the id names one that is not registered yet."""
    namespace = env_id.split("/")[0] if "/" in env_id else None
    if namespace not in NAMESPACE_REGISTRATIONS or any(key.startswith(f"{namespace}/") for key in gymnasium.registry):
        return
    module, function = NAMESPACE_REGISTRATIONS[namespace]
    import_for_id(module, env_id)
    getattr(importlib.import_module(module), function)()


def closest_ids(env_id: str) -> list[str]:
    return difflib.get_close_matches(env_id, sorted({*gymnasium.registry, *KNOWN_IDS}), n=5, cutoff=0.6)


def resolve_spec(env_id: str) -> gymnasium.envs.registration.EnvSpec:
    """The registered spec of `env_id` (`module:Id` imports the module first); ConfigError when unknown."""
    module, name = env_id.split(":", 1) if ":" in env_id else (None, env_id)
    if module is not None:
        import_for_id(module, env_id)
    register_namespace(name)
    spec = gymnasium.registry.get(name)
    if spec is None:
        close = closest_ids(name)
        allowed = (f"a registered gymnasium id; the closest: {', '.join(close)}" if close else
                   "a registered gymnasium id (gymnasium.pprint_registry() lists them), or module:Id to import one")
        raise ConfigError("env.id", env_id, allowed, "no env is registered under this id")
    return spec


def step_cap(env_id: str, spec: gymnasium.envs.registration.EnvSpec, max_episode_steps: Optional[int]) -> int:
    """The step cap every episode is truncated at: explicit, else the registered one, else MinAtar's."""
    if max_episode_steps is not None:
        return max_episode_steps
    if spec.max_episode_steps is not None:
        return spec.max_episode_steps
    if spec.namespace == "MinAtar":
        return MINATAR_STEP_CAPS.get(spec.name, MINATAR_STEP_CAP)
    raise ConfigError("env.max_episode_steps", None, "an integer >= 1, the step cap at which every episode is "
                      "truncated", f"{env_id} is registered without a step cap, so it needs an explicit one")


# ---------------------------------------------------------------------------------------------------
# One env: made from a picklable factory (worker processes build their own), faults tagged with its index.


def channels_last(obs: np.ndarray) -> np.ndarray:
    return np.moveaxis(obs, 0, -1)


def channels_last_space(space: spaces.Box) -> spaces.Box:
    return spaces.Box(channels_last(space.low), channels_last(space.high), dtype=space.dtype)


class TagFaults(gymnasium.Wrapper):
    """Any exception in the env's step or reset becomes a HostEnvError naming the env id and index."""

    def __init__(self, env: gymnasium.Env, env_id: str, index: int):
        super().__init__(env)
        self.env_id, self.index = env_id, index

    def _tagged(self, call: Callable, *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except HostEnvError:
            raise
        except Exception as error:  # the env's own code: any exception is its fault
            raise HostEnvError(self.env_id, self.index, describe(error)) from error

    def step(self, action: Any) -> Any:
        return self._tagged(self.env.step, action)

    def reset(self, **kwargs: Any) -> Any:
        return self._tagged(self.env.reset, **kwargs)


@dataclasses.dataclass(frozen=True)
class EnvFactory:
    """Builds one capped env; picklable, so a worker process builds its envs from the parent's spec
    (ids registered only in the parent, like a test's or MinAtar's, work there too)."""

    env_id: str
    spec: gymnasium.envs.registration.EnvSpec
    kwargs: dict
    max_episode_steps: int
    channels_first: bool = False  # declared by the config: [C, H, W] images are transposed to [H, W, C]

    def make(self, index: Optional[int] = None) -> gymnasium.Env:
        """The env; with an index, its faults are HostEnvErrors naming it."""
        try:
            env = gymnasium.make(self.spec, max_episode_steps=self.max_episode_steps, **self.kwargs)
        except Exception as error:  # the env's constructor: any exception is its fault
            if index is None:
                raise
            raise HostEnvError(self.env_id, index, f"building the env failed: {describe(error)}") from error
        if self.channels_first:
            space = channels_last_space(env.observation_space)
            env = gymnasium.wrappers.TransformObservation(env, channels_last, space)
        return env if index is None else TagFaults(env, self.env_id, index)


def env_factory(env_id: str, kwargs: Optional[dict] = None, max_episode_steps: Optional[int] = None,
                channels_first: bool = False) -> EnvFactory:
    spec = resolve_spec(env_id)
    return EnvFactory(env_id, spec, dict(kwargs or {}), step_cap(env_id, spec, max_episode_steps), channels_first)


# ---------------------------------------------------------------------------------------------------
# Spaces and observations.


def space_problems(action_space: spaces.Space, observation_space: spaces.Space) -> list[tuple[str, str]]:
    """(reason, allowed) for each space the host-env layer cannot take."""
    problems = []
    if not isinstance(action_space, (spaces.Discrete, spaces.Box)):
        problems.append((f"its action space is {action_space}: {type(action_space).__name__} actions are not "
                         "supported", "an env whose action space is Discrete or Box"))
    if not isinstance(observation_space, (spaces.Box, spaces.Discrete)):
        problems.append((f"its observation space is {type(observation_space).__name__}, which no network here takes",
                         "an env whose observation space is a Box (an array) or Discrete (one-hot encoded)"))
    return problems


def check_spaces(env_id: str, action_space: spaces.Space, observation_space: spaces.Space) -> None:
    for reason, allowed in space_problems(action_space, observation_space):
        raise ConfigError("env.id", env_id, allowed, reason)


# ---------------------------------------------------------------------------------------------------
# The normalized step.


def autoreset_mode_of(vector_env: VectorEnv, name: str) -> AutoresetMode:
    mode = vector_env.metadata.get("autoreset_mode")
    if mode is None:
        raise PluginError("env", name, "its vector env's metadata has no 'autoreset_mode'",
                          "a gymnasium>=1.1 VectorEnv whose metadata['autoreset_mode'] is an AutoresetMode")
    return AutoresetMode(mode)


def final_observations(obs: np.ndarray, info: dict) -> np.ndarray:
    """SAME_STEP: the pre-reset observations gymnasium keeps in info["final_obs"] where an episode ended."""
    final = np.array(obs)
    for index in np.flatnonzero(info.get("_final_obs", np.zeros(len(obs), bool))):
        final[index] = info["final_obs"][index]
    return final


class HostVectorEnv:
    """Any gymnasium VectorEnv, of any autoreset mode, as HostSteps; episode returns counted here."""

    def __init__(self, vector_env: VectorEnv, name: str):
        self.env, self.name = vector_env, name
        self.autoreset_mode = autoreset_mode_of(vector_env, name)
        check_spaces(name, vector_env.single_action_space, vector_env.single_observation_space)
        self._observation_space = vector_env.single_observation_space
        self.action_space = from_gymnasium(vector_env.single_action_space)
        self.num_envs = int(vector_env.num_envs)
        self.info: dict = {}  # the engine's info of the last reset or step, for adapters that read more of it
        self.observation_shape = encoded_shape(self._observation_space)
        self.observation_dtype = encoded_dtype(self._observation_space)
        self._clear_episodes()

    def _clear_episodes(self) -> None:
        self._returns = np.zeros(self.num_envs, np.float64)
        self._lengths = np.zeros(self.num_envs, np.int64)
        self._resetting = np.zeros(self.num_envs, bool)  # NEXT_STEP: these envs' next step is a reset step

    def _encode(self, raw: np.ndarray) -> np.ndarray:
        return encode_observations(self._observation_space, raw)

    def reset(self, seed: int) -> np.ndarray:
        """Every env reset, env i seeded `seed + i`; their observations [N, ...]."""
        obs, self.info = self.env.reset(seed=int(seed))
        self._clear_episodes()
        return self._encode(obs)

    def step(self, actions: np.ndarray) -> HostStep:
        actions = env_actions(self.action_space, actions)
        obs, reward, terminated, truncated, info = self.env.step(actions)
        self.info = info
        terminated, truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)
        acted = ~self._resetting
        ended = (terminated | truncated) & acted
        final = final_observations(obs, info) if self.autoreset_mode == AutoresetMode.SAME_STEP else obs
        if self.autoreset_mode == AutoresetMode.DISABLED and ended.any():
            reset_obs, _ = self.env.reset(options={"reset_mask": ended.copy()})
            obs = np.where(ended.reshape((-1,) + (1,) * (np.ndim(obs) - 1)), reset_obs, obs)
        if self.autoreset_mode == AutoresetMode.NEXT_STEP:
            self._resetting = ended.copy()
        reward = np.where(acted, np.asarray(reward, np.float64), 0.0)
        self._returns += reward
        self._lengths += acted
        episode_return, episode_length = np.where(ended, self._returns, 0.0), np.where(ended, self._lengths, 0)
        self._returns[ended], self._lengths[ended] = 0.0, 0
        return HostStep(obs=self._encode(obs), reward=reward.astype(np.float32), terminated=terminated & acted,
                        truncated=truncated & acted, final_obs=self._encode(final), acted=acted,
                        episode_return=episode_return.astype(np.float32),
                        episode_length=episode_length.astype(np.int32), ended=ended,
                        # NEXT_STEP resets on the step after an end; the other modes at once
                        started=~acted if self.autoreset_mode == AutoresetMode.NEXT_STEP else ended.copy())

    def close(self) -> None:
        self.env.close()


# ---------------------------------------------------------------------------------------------------
# Worker processes: each holds a slice of the envs in a SyncVectorEnv of the requested autoreset mode.


def worker_slices(num_envs: int, num_workers: int) -> list[tuple[int, int]]:
    """[start, stop) of each worker's envs, as even as possible."""
    bounds = np.linspace(0, num_envs, num_workers + 1).round().astype(int)
    return [(int(start), int(stop)) for start, stop in zip(bounds[:-1], bounds[1:], strict=True)]


def env_info(info: dict, index: int) -> dict:
    """One env's info out of a batched gymnasium info dict (the keys whose `_key` mask holds for it)."""
    single = {}
    for key, value in info.items():
        if f"_{key}" not in info or not info[f"_{key}"][index]:
            continue
        single[key] = env_info(value, index) if isinstance(value, dict) else value[index]
    return single


def run_worker(conn: multiprocessing.connection.Connection, factory: EnvFactory, start: int, stop: int,
               autoreset_mode: AutoresetMode, buffer: Any, shape: tuple[int, ...], dtype: str) -> None:
    """A worker's loop: commands from the parent, observations into shared memory, the rest by pipe."""
    # Ctrl-C reaches the whole process group: the parent handles it, a worker must not die of it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        vector = SyncVectorEnv([functools.partial(factory.make, index) for index in range(start, stop)],
                               autoreset_mode=autoreset_mode)
        observations = np.frombuffer(buffer, dtype=dtype).reshape((-1, *shape))[start:stop]
        conn.send(("ok", None))
        while True:
            command, payload = conn.recv()
            if command == "close":
                vector.close()
                conn.send(("ok", None))
                return
            if command == "reset":
                obs, info = vector.reset(**payload)
                result = info
            else:
                obs, reward, terminated, truncated, info = vector.step(payload)
                result = (reward, terminated, truncated, info)
            observations[:] = obs
            conn.send(("ok", result))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return  # the parent is gone
    except HostEnvError as error:
        send_quietly(conn, ("error", (error.env_index, error.detail)))
    except Exception as error:  # reported to the parent, which raises it
        send_quietly(conn, ("error", (None, describe(error))))


def send_quietly(conn: multiprocessing.connection.Connection, message: Any) -> None:
    try:
        conn.send(message)
    except (OSError, ValueError):
        pass  # the parent is gone; nothing to tell


class WorkerVectorEnv(VectorEnv):
    """A gymnasium VectorEnv whose envs live in `num_workers` processes, a slice of envs each."""

    def __init__(self, factory: EnvFactory, num_envs: int, num_workers: int, autoreset_mode: AutoresetMode,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        self.factory, self.timeout_s = factory, timeout_s
        self._processes: list[multiprocessing.Process] = []
        self._conns: list[multiprocessing.connection.Connection] = []
        probe = factory.make()  # the spaces, as AsyncVectorEnv learns them
        self.single_observation_space, self.single_action_space = probe.observation_space, probe.action_space
        probe.close()
        self.num_envs = num_envs
        self.metadata = {"autoreset_mode": AutoresetMode(autoreset_mode)}
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.closed = False
        self._slices = worker_slices(num_envs, num_workers)
        shape, dtype = tuple(self.single_observation_space.shape), np.dtype(self.single_observation_space.dtype)
        # forkserver, never fork: a forked child of a process running JAX's threads can deadlock
        context = multiprocessing.get_context("forkserver")
        # workers fork from a server that has imported this module (numpy, gymnasium) once; __main__ as by default
        context.set_forkserver_preload(["__main__", __name__])
        buffer = context.RawArray("B", num_envs * int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
        self._observations = np.frombuffer(buffer, dtype=dtype).reshape((num_envs, *shape))
        try:
            for worker, (start, stop) in enumerate(self._slices):
                parent_end, child_end = context.Pipe()
                process = context.Process(target=run_worker, name=f"host-env-{factory.env_id}-{worker}", daemon=True,
                                          args=(child_end, factory, start, stop, self.metadata["autoreset_mode"],
                                                buffer, shape, dtype.str))
                process.start()
                child_end.close()
                self._processes.append(process)
                self._conns.append(parent_end)
            self._gather(range(num_workers), "start")
        except BaseException:
            self.close()
            raise

    @property
    def worker_pids(self) -> list[int]:
        return [process.pid for process in self._processes]

    def _answer(self, worker: int, command: str) -> Any:
        conn, (start, stop) = self._conns[worker], self._slices[worker]
        timeout_s = max(self.timeout_s, START_TIMEOUT_S) if command == "start" else self.timeout_s
        if not conn.poll(timeout_s):
            raise HostEnvError(self.factory.env_id, None, f"it holds envs {start} to {stop - 1} and gave no answer "
                               f"to {command} within {timeout_s:g} s (an env hung)", worker)
        try:
            status, payload = conn.recv()
        except (EOFError, OSError):
            self._processes[worker].join(1.0)
            raise HostEnvError(self.factory.env_id, None, f"it holds envs {start} to {stop - 1} and exited during "
                               f"{command} (exit code {self._processes[worker].exitcode})", worker) from None
        if status == "error":
            index, detail = payload
            raise HostEnvError(self.factory.env_id, index, detail, worker)
        return payload

    def _gather(self, workers: Sequence[int], command: str) -> list[Any]:
        """Every listed worker's answer; on any failure all workers are stopped first."""
        try:
            return [self._answer(worker, command) for worker in workers]
        except HostEnvError:
            self.close()
            raise

    def _send(self, workers: Sequence[int], command: str, payloads: Sequence[Any]) -> None:
        if self.closed:
            raise HostEnvError(self.factory.env_id, None, f"{command} after close", None)
        for worker, payload in zip(workers, payloads, strict=True):
            self._conns[worker].send((command, payload))

    def _batched_info(self, workers: Sequence[int], infos: Sequence[dict]) -> dict:
        """The workers' infos as one batched dict, built the way SyncVectorEnv builds it."""
        batched: dict = {}
        for worker, info in zip(workers, infos, strict=True):
            start, stop = self._slices[worker]
            for local in range(stop - start):
                batched = self._add_info(batched, env_info(info, local), start + local)
        return batched

    def reset(self, *, seed: Any = None, options: Optional[dict] = None) -> tuple[np.ndarray, dict]:
        seeds = ([seed + index for index in range(self.num_envs)] if isinstance(seed, int) else
                 [None] * self.num_envs if seed is None else list(seed))
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        workers = [worker for worker, (start, stop) in enumerate(self._slices)
                   if mask is None or mask[start:stop].any()]
        payloads = [{"seed": seeds[start:stop],
                     "options": options if mask is None else {**options, "reset_mask": mask[start:stop]}}
                    for start, stop in (self._slices[worker] for worker in workers)]
        self._send(workers, "reset", payloads)
        infos = self._gather(workers, "reset")
        return self._observations.copy(), self._batched_info(workers, infos)

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        actions = np.asarray(actions)
        workers = range(len(self._slices))
        self._send(workers, "step", [actions[start:stop] for start, stop in self._slices])
        answers = self._gather(workers, "step")
        reward, terminated, truncated = (np.concatenate([answer[field] for answer in answers]) for field in range(3))
        return (self._observations.copy(), reward, terminated, truncated,
                self._batched_info(workers, [answer[3] for answer in answers]))

    def close_extras(self, **kwargs: Any) -> None:
        """Ask every worker to close its envs, then terminate what has not exited: no process is left."""
        for conn in self._conns:
            send_quietly(conn, ("close", None))
        deadline = time.monotonic() + CLOSE_GRACE_S
        for process in self._processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self._processes:
            if process.is_alive():
                process.terminate()
                process.join(1.0)
            if process.is_alive():
                process.kill()
                process.join()
        for conn in self._conns:
            conn.close()

    def close(self, **kwargs: Any) -> None:
        if not self.closed:
            self.close_extras()
            self.closed = True

    def __del__(self) -> None:
        # at interpreter exit multiprocessing itself terminates the (daemonic) workers, and pipes are torn down
        if not getattr(self, "closed", True) and not sys.is_finalizing():
            self.close()


def make_vector_env(env_id: str, num_envs: int, kwargs: Optional[dict] = None, max_episode_steps: Optional[int] = None,
                    num_workers: int = 0, autoreset_mode: AutoresetMode = AutoresetMode.NEXT_STEP,
                    channels_first: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S) -> VectorEnv:
    """`num_envs` capped envs of `env_id`: in this process (num_workers=0) or spread over worker processes."""
    factory = env_factory(env_id, kwargs, max_episode_steps, channels_first)
    return build_vector_env(factory, num_envs, num_workers, autoreset_mode, timeout_s)


def build_vector_env(factory: EnvFactory, num_envs: int, num_workers: int = 0,
                     autoreset_mode: AutoresetMode = AutoresetMode.NEXT_STEP,
                     timeout_s: float = DEFAULT_TIMEOUT_S) -> VectorEnv:
    """`make_vector_env` from a resolved factory."""
    if not (isinstance(num_workers, int) and 0 <= num_workers <= num_envs):
        raise ConfigError("env.num_workers", num_workers, f"an integer from 0 (in-process) to the number of envs "
                          f"({num_envs})")
    if num_workers == 0:
        return SyncVectorEnv([functools.partial(factory.make, index) for index in range(num_envs)],
                             autoreset_mode=autoreset_mode)
    return WorkerVectorEnv(factory, num_envs, num_workers, autoreset_mode, timeout_s)


