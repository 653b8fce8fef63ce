"""Ape-X: the epsilon ladder, actor-side priorities by hand, one program that trains (learning: test_learning.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.apex import ApexConfig, actor_priorities, make_apex
from algorithms.common.exploration import actor_epsilons
from algorithms.common.networks import QNetwork
from envs import make
from framework.errors import ConfigError
from framework.evaluation import make_evaluate
from framework.parallel import make_mesh
from framework.trainer import learner_parallel_programs


def test_epsilon_ladder_values():
    np.testing.assert_allclose(actor_epsilons(8, 0.4, 7.0), [0.4 ** (1 + 7 * i / 7) for i in range(8)], rtol=1e-6)
    np.testing.assert_allclose(actor_epsilons(1, 0.4, 7.0), [0.4])
    assert float(actor_epsilons(3, 0.4, 7.0)[0]) == pytest.approx(0.4)


def test_actor_priority_is_abs_td_error_by_hand():
    network = QNetwork(num_actions=2, hidden_sizes=(3,), dueling=False)
    obs = jnp.array([[0.5, -1.0], [1.0, 2.0], [0.2, 0.3]])
    params = network.init(jax.random.key(0), obs)
    items = {"obs": obs, "action": jnp.array([1, 0, 1]), "n_step_return": jnp.array([1.0, 2.0, 0.5]),
             "bootstrap_discount": jnp.array([0.9, 0.0, 0.81]), "bootstrap_obs": obs[::-1],
             "valid": jnp.array([1.0, 1.0, 0.0])}
    q = np.asarray(network.apply(params, obs))
    next_q = np.asarray(network.apply(params, obs[::-1]))
    # double Q with the actor's single copy of the parameters reduces to max over its own values
    targets = np.array([1.0, 2.0, 0.5]) + np.array([0.9, 0.0, 0.81]) * next_q.max(axis=1)
    expected = np.abs(targets - q[np.arange(3), [1, 0, 1]]) + 1e-6
    expected[2] = 0.0  # an unfilled n-step window is never sampled
    np.testing.assert_allclose(actor_priorities(params, items, network, True), expected, rtol=1e-5)


def test_one_program_trains_and_syncs_the_actors():
    env, params = make("cartpole")
    config = ApexConfig(num_actors=3, envs_per_actor=2, rollout_length=4, buffer_size=512, batch_size=16,
                        learning_starts=25, learner_updates_per_iteration=4, actor_sync_period=4)
    algorithm = make_apex(config, env, params)
    evaluate = make_evaluate(env, params, algorithm.act, num_episodes=2)
    programs = learner_parallel_programs(algorithm, evaluate, make_mesh(1, True, 1), num_updates=6)
    one_learner = lambda tree: jax.tree.map(lambda x: x[0, 0], tree)  # [device, seed, ...] -> one seed's
    run = lambda key: jax.tree.map(one_learner, programs.run_chunk(programs.init(key[None])))
    state, metrics = run(jax.random.key(0))
    assert int(state.learner_updates) == 4 * 5  # the first iteration waits for learning_starts
    assert np.isfinite(metrics["train/loss"]) and set(k for k in metrics if k.startswith("actors/")) == {
        f"actors/return_eps_{eps:.3g}" for eps in np.asarray(actor_epsilons(3, config.actor_epsilon, config.actor_alpha))}
    for actor, learner in zip(jax.tree.leaves(state.actor_params), jax.tree.leaves(state.train_state.params), strict=True):
        np.testing.assert_array_equal(actor, learner)  # 20 updates, synced every 4
    tree = state.replay_state.sum_tree_state
    np.testing.assert_allclose(tree.nodes[0], tree.nodes[2**tree.tree_depth - 1:].sum(), rtol=1e-6)
    # the replay's priority statistics come once per chunk, from its final state
    leaves = np.asarray(tree.nodes[2**tree.tree_depth - 1:], dtype=np.float64)
    stored = leaves[leaves > 0] ** (1 / config.priority_alpha)
    np.testing.assert_allclose([metrics["replay/priority_mean"], metrics["replay/priority_max"]],
                               [stored.mean(), stored.max()], rtol=1e-5)
    again, _ = run(jax.random.key(0))
    for a, b in zip(jax.tree.leaves(state.train_state.params), jax.tree.leaves(again.train_state.params), strict=True):
        np.testing.assert_array_equal(a, b)


def test_config_checks():
    with pytest.raises(ConfigError, match=r"algo\.buffer_size"):
        ApexConfig(buffer_size=100).validate()
    with pytest.raises(ConfigError, match=r"algo\.priority_alpha"):
        ApexConfig(priority_alpha=0.0).validate()
    with pytest.raises(ConfigError, match=r"algo\.priority_alpha=1\.5"):  # found by the fuzz test
        ApexConfig(priority_alpha=1.5).validate()
    with pytest.raises(ConfigError, match=r"algo\.hidden_sizes=\[100000000\].*from 1 to 8192"):
        ApexConfig(hidden_sizes=[100_000_000]).validate()
