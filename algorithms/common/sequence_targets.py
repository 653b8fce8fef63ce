"""R2D2's targets along a stored sequence: n-step double-Q returns under the value rescaling h, the steps
whose target is known, and the sequence's priority (Kapturowski et al., 2019).

A sequence may run across an episode's end: step i's successor belongs to the same episode unless step i ended
it (terminated or truncated) or the next observation begins one (`start`: a reset, a restarted stream). An
n-step window stops there: after a termination it does not bootstrap; after a truncation or a cut it would have
to bootstrap from an observation the sequence does not hold (the final one, before the reset), so that step has
no target (masked; a few steps per truncated episode). A window also stops at the sequence's last step, which
it bootstraps from (a shorter return).
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp

RESCALE_EPSILON = 1e-3  # h's linear term (Pohlen et al., 2018; R2D2)


def rescale(x: jax.Array, epsilon: float = RESCALE_EPSILON) -> jax.Array:
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + epsilon x: squashes large returns so one network fits every scale."""
    return jnp.sign(x) * (jnp.sqrt(jnp.abs(x) + 1.0) - 1.0) + epsilon * x


def unrescale(x: jax.Array, epsilon: float = RESCALE_EPSILON) -> jax.Array:
    """h^-1(x) = sign(x) (((sqrt(1 + 4 epsilon (|x| + 1 + epsilon)) - 1) / (2 epsilon))^2 - 1), its root written as
    2a / (sqrt(1 + 4 epsilon a) + 1), a = |x| + 1 + epsilon, which float32 computes without cancellation (the
    subtraction form loses ~3 digits at epsilon 1e-3)."""
    a = jnp.abs(x) + 1.0 + epsilon
    root = 2.0 * a / (jnp.sqrt(1.0 + 4.0 * epsilon * a) + 1.0)
    return jnp.sign(x) * (jnp.square(root) - 1.0)


class SequenceSteps(NamedTuple):
    """A sequence's steps as the targets read them, time first: every field [T, ...]."""

    action: jax.Array  # int32
    reward: jax.Array
    terminated: jax.Array  # the step ended its episode: no bootstrap
    truncated: jax.Array  # the step cut its episode (a time limit): its bootstrap is not in the sequence
    start: jax.Array  # the step's observation begins an episode
    acted: jax.Array  # False: the engine spent the step on a reset (no target, no loss)


class SequenceTargets(NamedTuple):
    target: jax.Array  # [T] h(n-step return + discount^m h^-1(Q_target(s', argmax Q_online(s'))))
    valid: jax.Array  # [T] float: 1 where the step has a target (acted, a known bootstrap, not the last step)


def n_step_targets(q_online: jax.Array, q_target: jax.Array, steps: SequenceSteps, n_step: int, discount: float,
                   rescaled: bool = True) -> SequenceTargets:
    """Every step's n-step double-Q target over one sequence: q_online and q_target [T, A] at its observations."""
    length = steps.reward.shape[0]
    squash, expand = (rescale, unrescale) if rescaled else (lambda x: x, lambda x: x)
    best = jnp.argmax(q_online, axis=-1)
    value = expand(jnp.take_along_axis(q_target, best[:, None], axis=-1)[:, 0])  # [T] at each observation
    next_start = jnp.concatenate([steps.start[1:], jnp.zeros(1, bool)])
    ended = steps.terminated | steps.truncated | next_start  # the step's successor is not its episode's

    def ahead(x: jax.Array, j: int, fill) -> jax.Array:
        """x at step t + j for every t (`fill` past the end)."""
        return jnp.concatenate([x[j:], jnp.full((j,), fill, x.dtype)])

    position = jnp.arange(length)
    total = jnp.zeros(length)
    scale = jnp.ones(length)  # discount^j
    open_ = jnp.ones(length, bool)  # the window of step t still runs
    known = jnp.ones(length, bool)
    for j in range(n_step):
        terminated, ends = ahead(steps.terminated, j, False), ahead(ended, j, True)
        total = total + open_ * scale * ahead(steps.reward, j, 0.0)
        scale = scale * discount
        last = (j == n_step - 1) | (position + j >= length - 2)  # the next observation is the sequence's last
        bootstraps = open_ & ~ends & last
        total = total + bootstraps * scale * ahead(value, j + 1, 0.0)
        known = known & ~(open_ & ends & ~terminated)
        open_ = open_ & ~ends & ~last
    valid = known & steps.acted & (position < length - 1)
    return SequenceTargets(squash(total), valid.astype(jnp.float32))


def sequence_priority(td_errors: jax.Array, valid: jax.Array, eta: float) -> jax.Array:
    """eta max|delta| + (1 - eta) mean|delta| over a sequence's valid steps [..., T] (R2D2); 0 with none."""
    magnitude = jnp.abs(td_errors) * valid
    count = valid.sum(axis=-1)
    mean = magnitude.sum(axis=-1) / jnp.maximum(count, 1.0)
    return jnp.where(count > 0, eta * magnitude.max(axis=-1) + (1.0 - eta) * mean, 0.0)
