"""DQN: targets by hand on a tiny network, the n-step items it writes, seeds, and its config checks."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lightspeed.algorithms.common.networks import QNetwork
from lightspeed.algorithms.common.targets import td_errors
from lightspeed.algorithms.common.transition import Transition
from lightspeed.algorithms.dqn import DQNConfig, make_dqn
from lightspeed.envs import make
from lightspeed.framework.anakin.compose import single_program
from lightspeed.framework.core.errors import ConfigError
from lightspeed.framework.core.keys import rollout_draws

GAMMA = 0.9


def numpy_q(params, obs):
    """An independent forward pass of the one-hidden-layer ReLU network."""
    layer0, layer1 = params["params"]["Dense_0"], params["params"]["Dense_1"]
    hidden = np.maximum(obs @ np.asarray(layer0["kernel"]) + np.asarray(layer0["bias"]), 0)
    return hidden @ np.asarray(layer1["kernel"]) + np.asarray(layer1["bias"])


@pytest.fixture(scope="module")
def tiny():
    network = QNetwork(num_actions=2, hidden_sizes=(3,))
    obs = jnp.array([[0.5, -1.0], [1.0, 2.0], [-0.3, 0.7], [2.0, 0.1]])
    params = network.init(jax.random.key(0), obs)
    target_params = network.init(jax.random.key(1), obs)
    return network, params, target_params


# items: (n-step return, bootstrap discount) as n_step_transition makes them for each case
BATCH_CASES = {
    "terminated: no bootstrap": (1.0, 0.0),
    "truncated: bootstrap from the final observation": (1.0, GAMMA),
    "3-step window ending in a termination at its second step": (1.0 + GAMMA * 1.0, 0.0),
    "3-step window without an end": (1.0 + GAMMA + GAMMA**2, GAMMA**3),
}


@pytest.mark.parametrize("double_q", [False, True])
def test_td_errors_by_hand(tiny, double_q):
    network, params, target_params = tiny
    returns, discounts = map(jnp.array, zip(*BATCH_CASES.values(), strict=True))
    batch = Transition(obs=jnp.array([[0.5, -1.0], [1.0, 2.0], [-0.3, 0.7], [2.0, 0.1]]),
                       action=jnp.array([0, 1, 1, 0]), n_step_return=returns,
                       bootstrap_obs=jnp.array([[0.0, 0.0], [1.5, -0.5], [0.2, 0.2], [-1.0, 1.0]]),
                       bootstrap_discount=discounts, valid=jnp.ones(4))
    errors, _ = td_errors(params, target_params, batch, network, double_q)
    obs, next_obs = np.asarray(batch.obs), np.asarray(batch.bootstrap_obs)
    online_next, target_next = numpy_q(params, next_obs), numpy_q(target_params, next_obs)
    best = online_next.argmax(axis=1) if double_q else target_next.argmax(axis=1)
    expected_targets = np.asarray(returns) + np.asarray(discounts) * target_next[np.arange(4), best]
    expected = expected_targets - numpy_q(params, obs)[np.arange(4), np.asarray(batch.action)]
    np.testing.assert_allclose(errors, expected, rtol=1e-5, atol=1e-6)
    assert errors[0] == pytest.approx(1.0 - numpy_q(params, obs)[0, 0], rel=1e-5), "a terminal item bootstrapped"


CORRIDOR = dict(height=1, width=3, start=[0, 0], goal=[0, 2], max_steps=4, observation="one_hot")


def _corridor_dqn(n_step):
    """DQN on a 1x3 grid: start [0,0], goal [0,2], one-hot observations, 4-step time limit; every action random."""
    env, params = make("gridworld", **CORRIDOR)
    config = DQNConfig(num_envs=1, buffer_size=64, batch_size=4, learning_starts=10_000, train_every=1,
                       n_step=n_step, discount=GAMMA, epsilon_start=1.0, epsilon_end=1.0)
    return single_program(make_dqn(config, env, params), env, params)


@functools.lru_cache  # the same steps serve both window lengths
def _corridor_steps(seed, num_steps):
    """The corridor stepped here with the draws DQN makes from its key (init: split in 3, the third resets
    the one env; each update: split in 3, the second cut by rollout_draws into an act key and an env key),
    actions from epsilon 1 by hand: floor(u * num_actions), u the act key's uniform. [(obs, action, reward,
    terminated, truncated, observation before any reset)] per step, and the observation after the last."""
    env, params = make("gridworld", **CORRIDOR)
    step = jax.jit(env.step)
    key, _, reset_key = jax.random.split(jax.random.key(seed), 3)
    obs, env_state = env.reset(jax.random.split(reset_key, 1)[0], params)
    steps = []
    for _ in range(num_steps):
        key, rollout_key, _ = jax.random.split(key, 3)
        act_keys, env_keys = rollout_draws(rollout_key, 1, 1)
        uniform = float(jax.random.uniform(act_keys[0, 0]))
        action = min(int(np.floor(uniform * env.num_actions)), env.num_actions - 1)
        next_obs, env_state, reward, terminated, truncated, info = step(env_keys[0, 0], env_state, action, params)
        steps.append((np.asarray(obs), action, float(reward), bool(terminated), bool(truncated),
                      np.asarray(info["final_observation"])))
        obs = next_obs
    return steps, np.asarray(obs)


@pytest.mark.parametrize("n_step", [1, 3])
def test_replay_items_follow_the_trajectory(n_step):
    """Replay rows against n-step items computed here from the same env stepped with the same draws."""
    algorithm = _corridor_dqn(n_step)
    state, update = algorithm.init(jax.random.key(3)), jax.jit(algorithm.update)
    for _ in range(40):
        state, _ = update(state)
    trajectory, last_obs = _corridor_steps(3, 40)
    np.testing.assert_array_equal(state.obs[0], last_obs)
    items = jax.tree.map(lambda x: np.asarray(x[0, :40]), state.learner.replay_state.experience)
    for t in range(n_step - 1, 40):
        start = t - n_step + 1
        obs, action = trajectory[start][0], trajectory[start][1]
        expected_return, discount, bootstrap = 0.0, 1.0, None
        for k in range(n_step):
            _, _, reward, terminated, truncated, next_obs = trajectory[start + k]
            expected_return += discount * reward
            discount *= GAMMA
            if terminated or truncated or k == n_step - 1:
                bootstrap, discount = next_obs, 0.0 if terminated else discount
                break
        np.testing.assert_array_equal(items.obs[t], obs)
        assert items.action[t] == action and items.valid[t] == 1.0
        assert items.n_step_return[t] == pytest.approx(expected_return)
        assert items.bootstrap_discount[t] == pytest.approx(discount)
        np.testing.assert_array_equal(items.bootstrap_obs[t], bootstrap)
    assert all(items.valid[: n_step - 1] == 0.0)
    # terminations and time limits, inside full windows, and more than one action
    assert any(step[3] for step in trajectory[n_step:]) and any(step[4] for step in trajectory[n_step:])
    assert len({step[1] for step in trajectory}) > 1


def test_seeds_get_different_networks():
    env, params = make("cartpole")
    algorithm = single_program(make_dqn(DQNConfig(), env, params), env, params)
    states = jax.vmap(algorithm.init)(jax.random.split(jax.random.key(0), 2))
    kernels = states.learner.train_state.params["params"]["Dense_0"]["kernel"]
    assert not np.array_equal(kernels[0], kernels[1])


@pytest.mark.parametrize("overrides, key", [
    ({"batch_size": 128, "buffer_size": 64}, "algo.batch_size"),
    ({"train_every": 12, "num_envs": 8}, "algo.train_every"),
    ({"tau": 0.0}, "algo.tau"),
    ({"hidden_sizes": []}, "algo.hidden_sizes"),
])
def test_config_checks(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        DQNConfig(**overrides).validate()


def test_grid_cells_are_refused_with_a_hint():
    from lightspeed.framework.core import registry

    cells = registry.build_config("env", "gridworld", {"observation": "cell"})
    with pytest.raises(ConfigError, match="env.observation='cell'.*Allowed: one_hot"):
        registry.build(cells, DQNConfig())


VARIANTS = {
    "defaults": {},
    "dueling, Polyak targets, MSE, decaying rate, single-step": dict(dueling=True, tau=0.5, loss="mse",
                                                                     lr_decay_env_steps=2000, n_step=1),
    "plain Q, tanh": dict(double_q=False, activation="tanh", hidden_sizes=[16]),
}


@pytest.mark.parametrize("overrides", VARIANTS.values(), ids=VARIANTS.keys())
def test_variants_learn_deterministically(overrides):
    """Each option trains (finite loss, parameters move) and repeats exactly from the same key."""
    env, params = make("cartpole")
    config = DQNConfig(num_envs=4, buffer_size=256, batch_size=16, learning_starts=33, train_every=32,
                       updates_per_train=4, **overrides)
    algorithm = single_program(make_dqn(config, env, params), env, params)
    run = jax.jit(lambda key: jax.lax.scan(lambda state, _: algorithm.update(state), algorithm.init(key), length=4))

    (state, metrics), (again, metrics_again) = run(jax.random.key(5)), run(jax.random.key(5))
    assert np.isfinite(metrics["train/loss"][-1]) and metrics["learner/updates"][-1] == 12
    initial = algorithm.init(jax.random.key(5)).learner.train_state.params
    moved = jax.tree.map(lambda a, b: not np.array_equal(a, b), state.learner.train_state.params, initial)
    assert all(jax.tree.leaves(moved))
    raw = lambda leaf: jax.random.key_data(leaf) if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key) else leaf
    for a, b in zip(jax.tree.leaves((state, metrics)), jax.tree.leaves((again, metrics_again)), strict=True):
        np.testing.assert_array_equal(raw(a), raw(b))


@pytest.mark.parametrize("overrides, expected", [
    (("algo=dqn", "env=cartpole"), (64, 0.01, 64, 10, 150000)),  # conf/algo_env/dqn_cartpole.yaml on top of dqn.yaml
    (("algo=dqn", "env=gridworld"), (128, 0.003, 64, 3, 0)),  # no dqn_gridworld: dqn.yaml alone
    (("algo=dqn", "env=cartpole", "~algo_env"), (128, 0.003, 64, 3, 0)),  # the specialisation left out
    (("algo=dqn", "env=cartpole", "algo.batch_size=48"), (48, 0.01, 64, 10, 150000)),  # the command line still wins
    (("algo=dqn", "env=cartpole", "total_env_steps=30000"), (64, 0.01, 64, 10, 30000)),  # the decay follows the run
])
def test_cartpole_gets_dqn_settings_of_its_own(overrides, expected):
    from conftest import compose_config

    algo = compose_config(*overrides).algo
    chosen = (algo.batch_size, algo.learning_rate, algo.target_update_period, algo.n_step, algo.lr_decay_env_steps)
    assert chosen == expected
