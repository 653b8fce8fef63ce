"""Action selection that spends one uniform number per decision (random bits are the cost here)."""
import jax
import jax.numpy as jnp


def greedy_with_random_ties(q_values: jax.Array, uniform: jax.Array) -> jax.Array:
    """argmax over the last axis, ties broken uniformly at random by `uniform` in [0, 1)."""
    is_max = q_values == q_values.max(axis=-1, keepdims=True)
    num_max = is_max.sum(axis=-1)
    rank = jnp.minimum(jnp.floor(uniform * num_max), num_max - 1).astype(jnp.int32)
    num_actions = q_values.shape[-1]
    # maxima among actions 0..i, counted with a triangular mask: XLA's CPU cumsum (a
    # reduce-window) costs ~1.5 us per call once vmapped, more than the rest of a step
    at_or_before = jnp.arange(num_actions)[None, :] <= jnp.arange(num_actions)[:, None]
    maxima_so_far = (is_max[..., None, :] & at_or_before).sum(axis=-1)
    # the chosen action is the first whose count of maxima exceeds the rank (counting from 0)
    return jnp.argmax(maxima_so_far > rank[..., None], axis=-1).astype(jnp.int32)


def epsilon_greedy(q_values: jax.Array, epsilon: jax.Array | float, uniform: jax.Array) -> jax.Array:
    """Epsilon-greedy with random tie-breaking from a single uniform per decision.

    u < epsilon explores; rescaled within its branch, u is again uniform on [0, 1) and picks
    the random action or breaks the tie among greedy actions.
    """
    num_actions = q_values.shape[-1]
    explore = uniform < epsilon
    explore_uniform = uniform / jnp.maximum(epsilon, 1e-12)
    exploit_uniform = (uniform - epsilon) / jnp.maximum(1.0 - epsilon, 1e-12)
    random_action = jnp.minimum(jnp.floor(explore_uniform * num_actions), num_actions - 1).astype(jnp.int32)
    return jnp.where(explore, random_action, greedy_with_random_ties(q_values, exploit_uniform))


def actor_epsilons(num_actors: int, epsilon: float, alpha: float) -> jax.Array:
    """Ape-X's ladder eps_i = eps^(1 + alpha * i / (N - 1)); a single actor uses eps."""
    fractions = jnp.arange(num_actors) / max(num_actors - 1, 1)
    return jnp.asarray(epsilon, jnp.float32) ** (1.0 + alpha * fractions)

