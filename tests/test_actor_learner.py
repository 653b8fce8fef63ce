"""One algorithm, two shapes: the single-program `update` equals its actor part (act, a JAX env step, observe)
followed by its learner part (insert, learn) on the same state, for DQN and Ape-X."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lightspeed.algorithms.apex import ApexConfig, make_apex
from lightspeed.algorithms.common.networks import select_tree
from lightspeed.algorithms.dqn import DQNConfig, make_dqn
from lightspeed.envs import make
from lightspeed.framework.anakin.compose import single_program
from lightspeed.framework.core.algorithm import ActorStep
from lightspeed.framework.core.devices import DEVICE_AXIS
from lightspeed.framework.core.env import EpisodeStatistics
from lightspeed.framework.core.keys import rollout_draws

DQN = DQNConfig(num_envs=4, buffer_size=256, batch_size=16, learning_starts=32, train_every=16, updates_per_train=3)
APEX = ApexConfig(num_actors=2, envs_per_actor=2, rollout_length=4, buffer_size=256, batch_size=16,
                  learning_starts=32, learner_updates_per_iteration=3, actor_sync_period=2)


def on_one_device(fn):
    """`fn` with a device axis of one learner, as the trainer runs Ape-X (its learner averages over devices)."""
    return lambda *args: jax.tree.map(lambda x: x[0], jax.vmap(fn, axis_name=DEVICE_AXIS)(
        *jax.tree.map(lambda x: x[None], args)))


def by_parts(algorithm, env, env_params, state, steps: int, learning_starts: int):
    """The update rebuilt here from the parts, a Python loop: `steps` vector steps of the actor (each env acts with
    its actor state, the key of its column), one insert, one learn round kept once enough items are in."""
    parts = algorithm.actor_learner
    stats_env = EpisodeStatistics(env)
    step_envs = jax.vmap(stats_env.step, in_axes=(0, 0, 0, None))
    act = jax.vmap(parts.act, in_axes=(None, 0, 0, 0, 0))
    key, rollout_key, learn_key = jax.random.split(state.key, 3)
    act_keys, env_keys = rollout_draws(rollout_key, steps, parts.num_envs)
    params = state.actor_params
    obs, env_state, recorder, env_steps = state.obs, state.env_state, state.recorder, state.env_steps
    start, actor_state = state.start, state.actor_state
    items = []
    for t in range(steps):
        actions, next_actor_state, extras = act(params, actor_state, obs, start, act_keys[t])
        next_obs, env_state, reward, terminated, truncated, info = step_envs(env_keys[t], env_state, actions,
                                                                             env_params)
        step = ActorStep(obs, actions, actions, extras, reward, terminated, truncated, info["final_observation"],
                         acted=jnp.ones(parts.num_envs, bool), start=start,
                         fresh=jnp.full(parts.num_envs, False), actor_state=actor_state)
        recorder, item = parts.observe(params, recorder, step)
        items.append(item)
        obs, start, actor_state = next_obs, terminated | truncated, next_actor_state
        env_steps = env_steps + parts.num_envs
    stack = lambda trees: jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)
    inserted = parts.insert(state.learner, stack(items))
    learned, _ = parts.learn(inserted, learn_key, env_steps)
    ready = parts.ready(inserted)
    # what the learner's readiness should be: its replay holds learning_starts items, and a batch
    enough = env_steps // (parts.num_envs * steps) * parts.block_units >= learning_starts
    return select_tree(ready, learned, inserted), (obs, recorder, actor_state, start, env_steps, key), (ready, enough)


def assert_trees_equal(actual, expected):
    for a, b in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        a, b = (jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x for x in (a, b))
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["dqn", "apex"])
def test_update_equals_actor_part_then_learner_part(name):
    env, env_params = make("cartpole")
    if name == "dqn":
        config, steps = DQN, DQN.train_every // DQN.num_envs
        algorithm = make_dqn(DQN, env, env_params)
        run = lambda fn: jax.jit(fn)
    else:
        config, steps = APEX, APEX.rollout_length
        algorithm = make_apex(APEX, env, env_params)
        run = lambda fn: jax.jit(on_one_device(fn))
    algorithm = single_program(algorithm, env, env_params)
    update = run(algorithm.update)
    state = run(algorithm.init)(jax.random.key(7))
    for _ in range(3):  # past learning_starts: the learner part runs
        state, _ = update(state)
    expected, metrics = update(state)
    assert np.isfinite(metrics["train/loss"])
    learning_starts = max(config.learning_starts, config.batch_size)
    learner, rest, (ready, enough) = run(lambda state: by_parts(algorithm, env, env_params, state, steps,
                                                                learning_starts))(state)
    assert bool(ready) and bool(enough)
    assert_trees_equal(learner, expected.learner)
    assert_trees_equal(rest, (expected.obs, expected.recorder, expected.actor_state, expected.start,
                              expected.env_steps, expected.key))
    moved = jax.tree.map(lambda a, b: not np.array_equal(a, b), learner.train_state.params,
                         state.learner.train_state.params)
    assert all(jax.tree.leaves(moved))  # the round learned: the comparison is not of two untouched states
