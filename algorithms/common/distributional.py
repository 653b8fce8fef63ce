"""A categorical return distribution on fixed, evenly spaced atoms (Bellemare et al., 2017), as D4PG's critic
keeps it: the n-step target distribution is moved onto the atoms by the L2 (Cramer) projection."""
import jax
import jax.numpy as jnp


def atoms(v_min: float, v_max: float, num_atoms: int) -> jax.Array:
    """The support: `num_atoms` values evenly spaced from v_min to v_max."""
    return jnp.linspace(v_min, v_max, num_atoms, dtype=jnp.float32)


def categorical_projection(values: jax.Array, probabilities: jax.Array, support: jax.Array) -> jax.Array:
    """Probabilities on `support` [M] (evenly spaced) of a distribution with `probabilities` [K] at `values` [K].

    Each value, clipped into the support, gives its mass to the two atoms around it in proportion to its
    closeness (all of it to an atom it falls on): a hat function of width one atom gap around every atom.
    """
    gap = support[1] - support[0]
    clipped = jnp.clip(values, support[0], support[-1])
    closeness = jnp.maximum(1.0 - jnp.abs(clipped[None, :] - support[:, None]) / gap, 0.0)  # [M, K], <= 1
    return closeness @ probabilities


def n_step_target(n_step_return: jax.Array, bootstrap_discount: jax.Array, next_probabilities: jax.Array,
                  support: jax.Array) -> jax.Array:
    """The projected distribution of G + discount^m Z(s', pi(s')) for one item: G and discount^m scalars,
    next_probabilities [M] the target critic's at the bootstrap observation."""
    return categorical_projection(n_step_return + bootstrap_discount * support, next_probabilities, support)


def mean(probabilities: jax.Array, support: jax.Array) -> jax.Array:
    """The expected return of distributions [..., M]."""
    return probabilities @ support
