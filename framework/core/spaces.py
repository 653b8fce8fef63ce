"""What an env's observations and actions are (gymnax's `observation_space(params)` / `action_space(params)`):

    Discrete(n, start=0)                 one of n integer actions, start .. start + n - 1
    Box(low, high, shape, dtype)         an array of `shape`, each entry within [low, high] (its bounds may be
                                         infinite; low and high broadcast to `shape`)

Algorithms say which action kinds they act in (`register_algorithm(..., acts=("discrete",))`); the registry refuses
an env whose actions are another kind before anything compiles.
"""
import dataclasses
from typing import Any, Union

import jax.numpy as jnp
import numpy as np

DISCRETE, BOX = "discrete", "box"  # the kinds an algorithm declares it acts in


@dataclasses.dataclass(frozen=True)
class Discrete:
    """One of `n` integer actions, `start` .. `start + n - 1`."""

    n: int
    start: int = 0

    kind = DISCRETE

    def __post_init__(self) -> None:
        if not (isinstance(self.n, (int, np.integer)) and self.n >= 1):
            raise ValueError(f"Discrete(n={self.n!r}): n is a positive int")

    def describe(self) -> str:
        return f"Discrete({self.n})" if self.start == 0 else f"Discrete({self.n}, start={self.start})"


@dataclasses.dataclass(frozen=True, eq=False)
class Box:
    """An array of `shape`, each entry within [`low`, `high`] (its bounds may be infinite; `low` and `high`
    broadcast to `shape`)."""

    low: np.ndarray
    high: np.ndarray
    shape: tuple[int, ...]
    dtype: np.dtype = np.dtype(np.float32)

    kind = BOX

    def __post_init__(self) -> None:
        shape, dtype = tuple(int(size) for size in self.shape), np.dtype(self.dtype)
        low, high = (np.broadcast_to(np.asarray(bound, dtype), shape).copy() for bound in (self.low, self.high))
        if np.any(low > high):
            raise ValueError(f"Box(low={low}, high={high}): low is above high somewhere")
        for name, value in (("shape", shape), ("dtype", dtype), ("low", low), ("high", high)):
            object.__setattr__(self, name, value)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Box) and (self.shape, self.dtype) == (other.shape, other.dtype)
                and np.array_equal(self.low, other.low) and np.array_equal(self.high, other.high))

    def __hash__(self) -> int:
        return hash((self.shape, self.dtype.str))

    def describe(self) -> str:
        uniform = self.low.size and np.all(self.low == self.low.flat[0]) and np.all(self.high == self.high.flat[0])
        bounds = f"[{self.low.flat[0]:g}, {self.high.flat[0]:g}]" if uniform else "per-entry bounds"
        return f"Box(shape={self.shape}, {self.dtype.name}, {bounds})"


Space = Union[Discrete, Box]


def clip_actions(space: Space, actions: Any) -> Any:
    """Actions as an env may take them: Box actions clipped to the bounds (an out-of-bounds action never reaches an
    env, and what is recorded is what the env took); Discrete ones as they are. Numpy in, numpy out; JAX likewise."""
    if not isinstance(space, Box):
        return actions
    clip = np.clip if isinstance(actions, np.ndarray) else jnp.clip
    return clip(actions, space.low, space.high)


def from_gymnasium(space: object) -> Space:
    """A gymnasium (or gymnax) Discrete or Box space as the contract's; anything else is a ValueError."""
    name = type(space).__name__
    if name == "Discrete":
        return Discrete(int(space.n), int(getattr(space, "start", 0)))
    if name == "Box":
        return Box(np.asarray(space.low), np.asarray(space.high), tuple(space.shape), np.dtype(space.dtype))
    raise ValueError(f"a {name} space: only Discrete and Box are supported")
