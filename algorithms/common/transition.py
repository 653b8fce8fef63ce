"""The DQN family's replay item: one n-step transition, as the actors' windows build it (nstep.py), the frame
replay rebuilds it (frame_replay.py) and the learner's TD errors read it (targets.py)."""
from typing import NamedTuple

import jax


class Transition(NamedTuple):
    """One n-step transition, or a batch of them along leading axes (a pytree: the buffers store it as it is)."""

    obs: jax.Array  # the observation the item starts at
    action: jax.Array  # the action taken there
    n_step_return: jax.Array  # the discounted rewards of up to n steps, up to the first episode end
    bootstrap_obs: jax.Array  # the observation after the last step that counts, whose value the target adds
    bootstrap_discount: jax.Array  # what that value is discounted by: discount^m, or 0 after a termination
    valid: jax.Array  # float32 1.0 where the item is complete and usable (a full window, no reset step), else 0.0
