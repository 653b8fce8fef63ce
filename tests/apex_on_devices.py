"""Ape-X learners on forced CPU devices; run as a script by test_parallel_learners.py, prints JSON.

XLA_FLAGS=--xla_force_host_platform_device_count=4 must be set before JAX starts, hence a script.
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import PartitionSpec  # noqa: E402

from lightspeed.algorithms.apex import ApexConfig, make_apex  # noqa: E402
from lightspeed.algorithms.common.dqn_family import weighted_td_loss  # noqa: E402
from lightspeed.algorithms.common.networks import QNetwork  # noqa: E402
from lightspeed.algorithms.common.targets import huber  # noqa: E402
from lightspeed.algorithms.common.transition import Transition  # noqa: E402
from lightspeed.envs import make  # noqa: E402
from lightspeed.framework.anakin.compose import single_program  # noqa: E402
from lightspeed.framework.anakin.trainer import learner_parallel_programs  # noqa: E402
from lightspeed.framework.core.config import TrainConfig  # noqa: E402
from lightspeed.framework.core.devices import (  # noqa: E402
    DEVICE_AXIS,
    make_mesh,
    mean_over_devices,
    use_compilation_cache,  # noqa: E402
)
from lightspeed.framework.core.evaluation import make_evaluate  # noqa: E402

SMALL = ApexConfig(num_actors=2, envs_per_actor=2, rollout_length=4, buffer_size=256, batch_size=8,
                   learning_starts=16, learner_updates_per_iteration=2, actor_sync_period=2, target_update_period=3)


def after_updates(num_devices: int, num_updates: int = 10, num_seeds: int = 2) -> dict:
    """Largest difference between a device's parameters and device 0's, after `num_updates` iterations."""
    env, env_params = make("cartpole")
    algorithm = single_program(make_apex(SMALL, env, env_params), env, env_params)
    evaluate = make_evaluate(env, env_params, algorithm, num_episodes=2)
    programs = learner_parallel_programs(algorithm, evaluate, make_mesh(num_seeds, True, num_devices), num_updates)
    state, _ = programs.run_chunk(programs.init(jax.random.split(jax.random.key(3), num_seeds)))
    state = jax.device_get(state)
    spread = lambda tree: max(float(np.abs(leaf - leaf[:1]).max()) for leaf in jax.tree.leaves(tree))
    learner = state.learner
    return {"params_spread": spread(learner.train_state.params), "target_spread": spread(learner.target_params),
            "obs_spread": spread(state.obs), "learner_updates": np.asarray(state.learner.updates).tolist(),
            "shape": list(jax.tree.leaves(state.learner.train_state.params)[0].shape)}


def two_devices_against_one(batch_size: int = 16) -> dict:
    """One learner step on a batch split over 2 devices against the same batch on one device."""
    network = QNetwork(num_actions=2, hidden_sizes=(8, 8), dueling=True)
    keys = jax.random.split(jax.random.key(0), 6)
    obs = jax.random.normal(keys[0], (batch_size, 4))
    params = network.init(keys[1], obs)
    target_params = jax.tree.map(lambda p: p + 0.1, params)
    items = Transition(obs=obs, action=jax.random.bernoulli(keys[2], 0.5, (batch_size,)).astype(jnp.int32),
                       n_step_return=jax.random.normal(keys[3], (batch_size,)),
                       bootstrap_obs=jax.random.normal(keys[4], (batch_size, 4)),
                       bootstrap_discount=jnp.where(jnp.arange(batch_size) % 5 == 0, 0.0, 0.97),
                       valid=jnp.ones(batch_size))
    weights = jax.random.uniform(keys[5], (batch_size,), minval=0.1, maxval=1.0)
    optimizer = optax.chain(optax.clip_by_global_norm(40.0), optax.adam(1e-2))

    def one_update(items, weights):
        (loss, _), grads = jax.value_and_grad(weighted_td_loss, has_aux=True)(
            params, target_params, items, weights, network, True, huber)
        grads = mean_over_devices(grads)  # as the learner averages its devices' gradients
        updates, _ = optimizer.update(grads, optimizer.init(params), params)
        return grads, optax.apply_updates(params, updates)

    def on_devices(count: int, batch_spec: PartitionSpec):
        return jax.jit(jax.shard_map(one_update, mesh=make_mesh(1, True, count), in_specs=(batch_spec, batch_spec),
                                     out_specs=PartitionSpec(), check_vma=False))(items, weights)

    split, whole = jax.device_get((on_devices(2, PartitionSpec(DEVICE_AXIS)), on_devices(1, PartitionSpec())))
    difference = lambda a, b: max(float(np.abs(x - y).max())
                                  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))
    largest = lambda tree: max(float(np.abs(x).max()) for x in jax.tree.leaves(tree))
    return {"gradient_difference": difference(split[0], whole[0]), "gradient_scale": largest(whole[0]),
            "params_difference": difference(split[1], whole[1]),
            "params_moved": difference(whole[1], params)}


if __name__ == "__main__":
    use_compilation_cache(TrainConfig.compilation_cache)  # run.py's default cache: a later session loads, not compiles
    print(json.dumps({"devices": jax.device_count(), "two": after_updates(2), "four": after_updates(4),
                      "math": two_devices_against_one()}))
