"""The keys a run draws from: every seed's init and evaluation keys from the run's one seed, and a rollout's
keys cut from one draw (both shapes use them, so a host run replays the single program's streams)."""
import jax
import jax.numpy as jnp

FINAL_EVALUATION = 2**31 - 1  # the final evaluation's number: its keys differ from every periodic one's


def run_keys(seed: jax.Array, evaluation: jax.Array, num_seeds: int) -> tuple[jax.Array, jax.Array]:
    """Every seed's init key, and every seed's key for evaluation number `evaluation` (seed: uint32)."""
    init_key, eval_root_key = jax.random.split(jax.random.key(seed))
    eval_key = jax.random.fold_in(eval_root_key, evaluation)
    return jax.random.split(init_key, num_seeds), jax.random.split(eval_key, num_seeds)


def rollout_draws(key: jax.Array, num_steps: int, num_envs: int) -> tuple[jax.Array, jax.Array]:
    """A whole rollout's keys at once: an act key and an env key per env step, each [num_steps, num_envs], cut
    from one draw of random words. Every draw site is a threefry loop for XLA to compile and run: one per
    rollout instead of a split per step. A host actor takes its envs' columns of the act keys, so an env's
    stream is the same whichever thread steps it."""
    key_words = jax.random.key_data(key).shape[-1]
    words = jax.random.bits(key, (num_steps, num_envs, 2 * key_words), jnp.uint32)
    impl = jax.random.key_impl(key)
    return (jax.random.wrap_key_data(words[..., :key_words], impl=impl),
            jax.random.wrap_key_data(words[..., key_words:], impl=impl))
