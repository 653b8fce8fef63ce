"""The replay a DQN or Ape-X learner keeps, behind one interface, chosen by the env's observations.

- items: the n-step transitions the actors build in their windows (algorithms/common/nstep.py), each with its
  observation and bootstrap observation whole; every env but a frame-stacking one.
- frames (algorithms/common/frame_replay.py): for envs whose observation is a stack of the last frames, one new
  per step (Atari's 84x84x4, `env.frame_stack`): the actors send each step's newest frame and flags, the replay
  keeps each frame once and rebuilds stacks and n-step returns when it samples (a stacked item pair is 56 KB,
  a frame 7 KB). The actors still keep their windows, for Ape-X's initial priorities.

Both sample the same batch: a Transition (algorithms/common/transition.py) with a leading batch axis.
"""
from typing import Any, Callable, NamedTuple, Optional

import jax

from lightspeed.algorithms.common.frame_replay import FrameStep, make_frame_replay
from lightspeed.algorithms.common.nstep import empty_window, oldest_transition
from lightspeed.algorithms.common.prioritized_replay import make_prioritized_replay
from lightspeed.algorithms.common.transition import Transition
from lightspeed.algorithms.common.uniform_replay import make_uniform_replay
from lightspeed.framework.core.errors import check

FRAME_STEP_KEYS = ("action", "reward", "terminated", "truncated", "acted", "start", "fresh")
Record = Transition | FrameStep  # what an actor sends the replay: its n-step items, or a frame replay's steps


class ReplayItems(NamedTuple):
    """What an actor's `observe` hands the learner for one vector step: its records and their initial priorities."""

    record: Record
    priority: Optional[jax.Array]  # [num_envs]; None: uniform replay


def count_filled(filled: jax.Array, added: int, learning_starts: int) -> jax.Array:
    """Items inserted so far, counted up to `learning_starts` (all a learner's `ready` reads; it cannot overflow)."""
    return jax.numpy.minimum(filled + added, learning_starts)


class Replay(NamedTuple):
    init: Callable[[jax.Array], Any]  # the actors' first observations [num_envs, ...] -> an empty replay
    record: Callable[[Transition, dict], Record]  # (the window's n-step items, the host step) -> what an actor sends
    add: Callable[..., Any]  # (state, records [T, num_envs, ...], priorities [T, num_envs] or None) -> state
    sample: Callable[..., tuple[Transition, Any, Any]]  # (state, draws [batch]) -> (batch, indices, probabilities)
    set_priorities: Optional[Callable[..., Any]]  # prioritized: (state, indices, raw priorities) -> state
    frames: bool  # records are frame steps, not n-step items
    stored_priorities: Optional[Callable[[Any], jax.Array]] = None  # prioritized items: every slot's raw priority


def frame_step(step: dict) -> FrameStep:
    """A host step as a frame replay stores it: the newest frame of each observation and the step's flags."""
    return FrameStep(frame=step["obs"][..., -1], next_frame=step["final_obs"][..., -1],
                     **{key: step[key] for key in FRAME_STEP_KEYS})


def example_item(obs: jax.Array, n_step: int, discount: float, action: Optional[jax.ShapeDtypeStruct] = None
                 ) -> Transition:
    """One item's shapes and dtypes for envs whose observations are `obs` [num_envs, ...] (and actions `action`)."""
    return jax.tree.map(lambda x: x[0], oldest_transition(empty_window(obs, n_step, action=action), discount))


def uniform_replay(env: Any, num_envs: int, capacity: int, batch_size: int, n_step: int, discount: float) -> Replay:
    """DQN's: items in one flat buffer (uniform_replay.py), or frames per env."""
    if getattr(env, "frame_stack", None):
        return frame_replay(env, num_envs, capacity, batch_size, n_step, discount, None)
    replay = make_uniform_replay(capacity, batch_size)

    def add(state: Any, items: Transition, priorities: None) -> Any:
        # [steps, envs, ...] -> one sequence of items for the buffer
        return replay.add(state, jax.tree.map(lambda x: x.reshape(1, -1, *x.shape[2:])[0], items))

    return Replay(init=lambda obs: replay.init(example_item(obs, n_step, discount)), record=lambda items, step: items,
                  add=add, sample=lambda state, bits: (replay.sample(state, bits), None, None), set_priorities=None,
                  frames=False)


def prioritized_replay(env: Any, num_envs: int, capacity: int, batch_size: int, n_step: int, discount: float,
                       priority_exponent: float, action: Optional[jax.ShapeDtypeStruct] = None) -> Replay:
    """Ape-X's: items in a row per env (prioritized_replay.py), or frames per env, one sum tree over them.
    `action`: one env's action as items hold it (default: an integer [])."""
    if getattr(env, "frame_stack", None):
        return frame_replay(env, num_envs, capacity, batch_size, n_step, discount, priority_exponent)
    replay = make_prioritized_replay(capacity, num_envs, batch_size, priority_exponent)
    by_env = lambda x: jax.numpy.swapaxes(x, 0, 1)  # [steps, envs, ...] -> [envs, steps, ...]: a row per env
    add = lambda state, items, priorities: replay.add(state, jax.tree.map(by_env, items), by_env(priorities))
    return Replay(init=lambda obs: replay.init(example_item(obs, n_step, discount, action)),
                  record=lambda items, step: items, add=add,
                  sample=replay.sample, set_priorities=replay.set_priorities, frames=False,
                  stored_priorities=replay.stored_priorities)


def frame_replay(env: Any, num_envs: int, capacity: int, batch_size: int, n_step: int, discount: float,
                 priority_exponent: Optional[float]) -> Replay:
    height, width, stack = env.observation_shape
    check_frame_ring(capacity, num_envs, stack, n_step)
    replay = make_frame_replay(num_envs, capacity // num_envs, (height, width), env.observation_dtype, stack, n_step,
                               discount, batch_size, priority_exponent)
    return Replay(init=lambda obs: replay.init(), record=lambda items, step: frame_step(step), add=replay.add,
                  sample=replay.sample, set_priorities=replay.set_priorities, frames=True)


def check_frame_ring(capacity: int, num_envs: int, stack: int, n_step: int) -> None:
    """Refuse, naming the key, a ring per env too short for one item: a stack of frames and n_step more."""
    per_env = capacity // num_envs
    check(per_env >= stack + 1, "algo.buffer_size", capacity, f"at least {num_envs * (stack + n_step)}",
          f"each of the {num_envs} envs' rings must hold a stack of {stack} frames and n_step more")
    check(stack + n_step <= per_env, "algo.n_step", n_step, f"at most {per_env - stack}",
          f"each env's ring of algo.buffer_size / {num_envs} = {per_env} frames must hold a stack of {stack} "
          "frames and n_step more")


def replay_learning_start(config: Any) -> tuple[str, int]:
    """A replay learner's `learning_start` (framework.core.config.check_learning_can_start): the key that sets when
    a seed's learner first learns, and after how many env steps (a transition per env step; the first batch is
    drawn once replay holds algo.learning_starts transitions and at least a batch)."""
    return max(("algo.learning_starts", config.learning_starts), ("algo.batch_size", config.batch_size),
               key=lambda pair: pair[1])


def check_actor_replay_sizes(config: Any) -> None:
    """An actor population's replay keys (Ape-X, D4PG): one iteration's transitions fit, and so does a batch."""
    rows = config.num_actors * config.envs_per_actor
    check(config.buffer_size >= rows * config.rollout_length, "algo.buffer_size", config.buffer_size,
          f"at least num_actors * envs_per_actor * rollout_length ({rows * config.rollout_length})",
          "one iteration's transitions must fit")
    check(config.batch_size <= config.buffer_size, "algo.batch_size", config.batch_size,
          f"at most algo.buffer_size ({config.buffer_size})", "a batch cannot be larger than the buffer")
