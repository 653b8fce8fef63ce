"""The actor part DQN and Ape-X share: act epsilon-greedily, turn each env step into an n-step replay item.

The same two functions run inside the single program (a JAX env stepped between them) and in the
actor threads of framework/sebulba/actor.py (a host env stepped between two jitted calls).
"""
from typing import Any, Optional

import jax

from algorithms.common.exploration import epsilon_greedy
from algorithms.common.nstep import NStepWindow, oldest_transition, push


def act(network: Any, params: Any, obs: jax.Array, epsilons: jax.Array, uniforms: jax.Array) -> jax.Array:
    """One action per env: epsilon-greedy (an epsilon per env, or one for all) from one uniform per env."""
    return epsilon_greedy(network.apply(params, obs), epsilons, uniforms)


def record(window: NStepWindow, obs: jax.Array, actions: jax.Array, reward: jax.Array, terminated: jax.Array,
           truncated: jax.Array, final_obs: jax.Array, n: int, discount: float,
           acted: Optional[jax.Array] = None) -> tuple[NStepWindow, dict]:
    """Push one step of every env into its window; the item that starts at the window's oldest step.

    `final_obs` is the step's true next observation (before any reset). `acted` [num_envs] is False where
    a host engine spent the step on a reset (gymnasium's NEXT_STEP autoreset): such a step is kept in the
    window, so every env's window stays aligned, but no item starts at it, and no return spans it, as the
    episode before it ended (and cut the return) on the previous step.
    """
    step = {"obs": obs, "action": actions, "reward": reward, "terminated": terminated, "truncated": truncated,
            "next_obs": final_obs}
    if acted is not None:
        step["acted"] = acted
    window = push(window, step, n)
    return window, oldest_transition(window, discount)
