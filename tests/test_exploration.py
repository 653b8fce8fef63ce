"""A rollout's bulk draws: uniforms spread evenly over [0, 1), every env step gets its own key."""
import jax
import numpy as np

from algorithms.common.exploration import rollout_draws


def test_rollout_draws_are_uniform_and_keys_distinct():
    uniforms, env_keys = rollout_draws(jax.random.key(0), 500, 64)
    assert uniforms.shape == env_keys.shape == (500, 64)
    values = np.asarray(uniforms).ravel()
    assert values.min() >= 0.0 and values.max() < 1.0
    counts = np.histogram(values, bins=50, range=(0.0, 1.0))[0]
    expected = len(values) / 50
    # 99.9% critical value of chi-square with 49 degrees of freedom is 85.4
    assert ((counts - expected) ** 2 / expected).sum() < 85.4
    words = np.asarray(jax.random.key_data(env_keys)).reshape(-1, 2)
    assert len(np.unique(words, axis=0)) == 500 * 64
    # the keys feed the envs like split keys do: their draws are independent of the uniforms
    draws = np.asarray(jax.vmap(jax.vmap(jax.random.uniform))(env_keys)).ravel()
    assert abs(np.corrcoef(values, draws)[0, 1]) < 0.02
