"""Box actions for a deterministic policy: the map between a policy's [-1, 1]^A and a Box's bounds, and the
exploration noise added in between (the continuous twin of the epsilon ladder: a sigma per actor, Gaussian or an
Ornstein-Uhlenbeck process). All in half ranges, so that one sigma means the same on every dimension."""
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from lightspeed.framework.core.errors import ConfigError

NOISES = ("gaussian", "ou")


class Bounds(NamedTuple):
    """A Box's middle and half range per entry, flattened: env action = middle + half_range * a, a in [-1, 1]^A."""

    middle: np.ndarray  # [A]
    half_range: np.ndarray  # [A]
    shape: tuple[int, ...]  # the Box's own shape (A entries)

    def to_env(self, normalised: jax.Array) -> jax.Array:
        """[..., A] in half ranges -> [..., *shape] env actions."""
        action = self.middle + self.half_range * normalised
        return action.reshape(*normalised.shape[:-1], *self.shape).astype(jnp.float32)

    def to_normalised(self, action: jax.Array) -> jax.Array:
        """[..., *shape] env actions -> [..., A] in half ranges."""
        flat = action.reshape(*action.shape[: action.ndim - len(self.shape)], -1)
        return (flat - self.middle) / self.half_range


def action_bounds(space: Any) -> Bounds:
    """The Box's middle and half range; infinite or empty bounds are a config error (a tanh policy needs both ends)."""
    low, high = np.asarray(space.low, np.float32).ravel(), np.asarray(space.high, np.float32).ravel()
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(high > low)):
        raise ConfigError("env", space.describe(), "an env whose Box actions have finite bounds, low < high",
                          "a deterministic policy squashes its actions into the bounds")
    return Bounds((high + low) / 2, (high - low) / 2, tuple(space.shape))


def sigma_ladder(num_actors: int, sigma_max: float, sigma_min: float) -> np.ndarray:
    """Actor i's noise scale: geometric from sigma_max (actor 0) to sigma_min (the last); one actor: sigma_max."""
    if num_actors == 1 or sigma_min == sigma_max:
        return np.full(num_actors, sigma_max, np.float32)
    if sigma_min == 0:  # a geometric ladder cannot reach 0: the last actor alone is greedy
        return np.append(sigma_max * 0.5 ** np.arange(num_actors - 1), 0.0).astype(np.float32)
    return (sigma_max * (sigma_min / sigma_max) ** (np.arange(num_actors) / (num_actors - 1))).astype(np.float32)


def ornstein_uhlenbeck_step(previous: jax.Array, draw: jax.Array, sigma: jax.Array, theta: float, dt: float
                            ) -> jax.Array:
    """One step of the mean-zero OU process from `previous` with the standard normal `draw`."""
    return previous - theta * previous * dt + sigma * np.sqrt(dt) * draw


def next_noise(kind: str, previous: jax.Array, start: jax.Array, draw: jax.Array, sigma: jax.Array, theta: float,
               dt: float) -> jax.Array:
    """This step's noise from a standard normal draw: Gaussian forgets `previous`; an OU process continues it, from
    zero where an episode starts."""
    if kind == "ou":
        return ornstein_uhlenbeck_step(jnp.where(start, 0.0, previous), draw, sigma, theta, dt)
    return sigma * draw


def with_noise(normalised: jax.Array, noise: jax.Array) -> jax.Array:
    """The policy's action moved by the noise, kept inside the bounds: no action outside them reaches an env."""
    return jnp.clip(normalised + noise, -1.0, 1.0)
