"""D4PG / Ape-X DPG: the categorical projection against the C51 algorithm written out step by step, action bounds and
scaling, the noise ladder as the actors draw it, Ornstein-Uhlenbeck noise against the AR(1) process by hand,
priorities against a hand-computed TD error, bad input, and a short host run on gymnasium's Pendulum whose saved
policy a user steps by hand through gymnasium's own env."""
import json

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import check_like_run_py, compose_config, run_cli, run_python, shared_dir

from lightspeed.algorithms.common.continuous_actions import (
    action_bounds,
    next_noise,
    ornstein_uhlenbeck_step,
    sigma_ladder,
    with_noise,
)
from lightspeed.algorithms.common.distributional import atoms, categorical_projection, n_step_target
from lightspeed.algorithms.d4pg import ActorNoise, DPGParams
from lightspeed.framework.anakin.trainer import build
from lightspeed.framework.core.config import validated
from lightspeed.framework.core.errors import ConfigError
from lightspeed.framework.core.spaces import Box
from lightspeed.framework.run.policy import load_policy


def c51_projection(values: np.ndarray, probabilities: np.ndarray, v_min: float, v_max: float, m: int) -> np.ndarray:
    """Bellemare et al. (2017), Algorithm 1: each value's mass split between the atoms below and above it."""
    gap = (v_max - v_min) / (m - 1)
    projected = np.zeros(m)
    for value, p in zip(values, probabilities, strict=True):
        b = (min(max(value, v_min), v_max) - v_min) / gap
        lower, upper = int(np.floor(b)), int(np.ceil(b))
        if lower == upper:
            projected[lower] += p
        else:
            projected[lower] += p * (upper - b)
            projected[upper] += p * (b - lower)
    return projected


def test_the_projection_of_a_hand_example():
    # 0.5 splits evenly between atoms 0 and 1; 3.0 lies beyond the support and lands on its last atom
    projected = categorical_projection(jnp.array([0.5, 3.0]), jnp.array([0.6, 0.4]), atoms(0.0, 2.0, 3))
    np.testing.assert_allclose(projected, [0.3, 0.3, 0.4], atol=1e-7)


@pytest.mark.parametrize("v_min, v_max, m", [(-10.0, 10.0, 51), (-1000.0, 0.0, 51), (0.0, 1.0, 2)])
def test_the_projection_matches_c51_and_keeps_the_mass(v_min, v_max, m):
    rng = np.random.default_rng(0)
    support = np.linspace(v_min, v_max, m)
    for _ in range(20):
        # values inside, outside and exactly on atoms, as a shifted and scaled support makes them
        values = np.concatenate([rng.uniform(v_min - 5, v_max + 5, 7), support[rng.integers(0, m, 3)]])
        probabilities = rng.dirichlet(np.ones(len(values)))
        ours = np.asarray(categorical_projection(jnp.asarray(values, jnp.float32), jnp.asarray(probabilities,
                                                                                                jnp.float32),
                                                 atoms(v_min, v_max, m)))
        np.testing.assert_allclose(ours, c51_projection(values, probabilities, v_min, v_max, m), atol=2e-5)
        assert ours.sum() == pytest.approx(1.0, abs=1e-5)


def test_the_n_step_target_shifts_and_shrinks_the_next_distribution():
    support = atoms(-4.0, 4.0, 9)
    next_probabilities = jnp.zeros(9).at[5].set(1.0)  # all mass at 1.0
    # G 0.5 + 0.5 * 1.0 = 1.0: on an atom
    np.testing.assert_allclose(n_step_target(jnp.float32(0.5), jnp.float32(0.5), next_probabilities, support),
                               np.eye(9)[5], atol=1e-6)
    # a termination (discount 0): all mass at G, 2.5 split between atoms 2.0 and 3.0
    target = n_step_target(jnp.float32(2.5), jnp.float32(0.0), next_probabilities, support)
    np.testing.assert_allclose(target, 0.5 * np.eye(9)[6] + 0.5 * np.eye(9)[7], atol=1e-6)


def test_bounds_scale_per_dimension_and_invert():
    space = Box(np.array([-1.0, 0.0, -3.0]), np.array([1.0, 10.0, -2.0]), (3,))
    bounds = action_bounds(space)
    np.testing.assert_allclose(bounds.to_env(jnp.array([-1.0, -1.0, -1.0])), space.low)
    np.testing.assert_allclose(bounds.to_env(jnp.array([1.0, 1.0, 1.0])), space.high)
    np.testing.assert_allclose(bounds.to_env(jnp.zeros(3)), [0.0, 5.0, -2.5])
    actions = jnp.array([[0.5, 2.0, -2.2], [-1.0, 10.0, -3.0]])
    np.testing.assert_allclose(bounds.to_env(bounds.to_normalised(actions)), actions, rtol=1e-6)
    matrix = Box(-2.0, 2.0, (2, 2))  # a Box of any shape: flat for the networks, its own shape for the env
    assert action_bounds(matrix).to_env(jnp.zeros((5, 4))).shape == (5, 2, 2)
    # float32 whatever the Box and the caller hand over: the networks and the envs get one dtype
    wide = action_bounds(Box(np.array([-1.0, 0.0]), np.array([1.0, 4.0]), (2,), np.float64))
    assert wide.middle.dtype == wide.half_range.dtype == np.float32
    assert wide.to_env(np.zeros((1, 2))).dtype == np.float32


# (low > high: the Box itself refuses it)
@pytest.mark.parametrize("low, high", [(-np.inf, np.inf), (0.0, np.inf), (-np.inf, 0.0), (1.0, 1.0)])
def test_bounds_that_a_tanh_policy_cannot_fill_are_refused_in_one_paragraph(low, high):
    space = Box(np.array([-1.0, low]), np.array([1.0, high]), (2,))
    with pytest.raises(ConfigError) as error:
        action_bounds(space)
    assert str(error.value) == (f"Invalid config: env={space.describe()!r} (a deterministic policy squashes its "
                                "actions into the bounds). Allowed: an env whose Box actions have finite bounds, "
                                "low < high.")


def test_the_sigma_ladder_is_geometric_from_sigma_max_to_sigma_min():
    np.testing.assert_allclose(sigma_ladder(4, 0.3, 0.05), 0.3 * (0.05 / 0.3) ** (np.arange(4) / 3), rtol=1e-6)
    np.testing.assert_allclose(sigma_ladder(1, 0.3, 0.05), [0.3])
    np.testing.assert_allclose(sigma_ladder(3, 0.2, 0.0), [0.2, 0.1, 0.0])
    for ladder in (sigma_ladder(4, 0.3, 0.05), sigma_ladder(1, 0.3, 0.05), sigma_ladder(3, 0.2, 0.0)):
        assert ladder.dtype == np.float32


PENDULUM = ["algo=d4pg", "env=gymnax", "env.id=Pendulum-v1", "algo.num_actors=4", "algo.envs_per_actor=2",
            "algo.policy_hidden_sizes=[16]", "algo.critic_hidden_sizes=[16]", "algo.num_atoms=11"]


@pytest.fixture(scope="module")
def pendulum():
    """(algorithm, initial learner) of a small D4PG on gymnax's Pendulum: its first policy acts near the middle."""
    train = validated(compose_config(*PENDULUM, "algo.sigma_max=0.4", "algo.sigma_min=0.1"))
    env, env_params, algorithm = build(train)
    obs, _ = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(jax.random.key(0), 8), env_params)
    learner = algorithm.actor_learner.learner_init(jax.random.key(1), obs)
    return algorithm, learner, obs


def test_each_actor_explores_with_its_rung_of_the_ladder_and_stays_inside_the_bounds(pendulum):
    algorithm, learner, obs = pendulum
    parts = algorithm.actor_learner
    params = parts.actor_params(learner)
    draws = 4000
    act = jax.jit(jax.vmap(jax.vmap(parts.act, in_axes=(None, 0, 0, 0, 0)), in_axes=(None, None, None, None, 0)))
    states = jax.vmap(parts.actor_init, in_axes=(0, None))(jnp.arange(8, dtype=jnp.int32), jnp.int32(0))
    keys = jax.random.split(jax.random.key(2), (draws, 8))
    actions, _, _ = act(params, states, obs, jnp.ones(8, bool), keys)
    actions = np.asarray(actions)[..., 0]  # [draws, 8 envs]: torques in [-2, 2]
    assert actions.dtype == np.float32 and actions.min() >= -2.0 and actions.max() <= 2.0
    greedy = np.asarray(jax.vmap(algorithm.act, in_axes=(None, None, 0, None, None))(
        params, (), obs, jnp.bool_(True), jax.random.key(0))[0])[:, 0]
    # noise in half ranges (2 here): env 2a and 2a+1 are actor a's, on its rung
    spread = (actions - greedy).std(axis=0) / 2.0
    expected = np.repeat(sigma_ladder(4, 0.4, 0.1), 2)
    np.testing.assert_allclose(spread, expected, rtol=0.05)
    loud = validated(compose_config(*PENDULUM, "algo.sigma_max=50", "algo.sigma_min=50"))
    _, _, wild = build(loud)
    wild_actions, _, _ = jax.vmap(wild.actor_learner.act, in_axes=(None, 0, 0, 0, 0))(
        params, states, obs, jnp.ones(8, bool), jax.random.split(jax.random.key(3), 8))
    assert set(np.unique(np.abs(np.asarray(wild_actions)))) <= {2.0}  # clipped to the bounds, never past them


def test_evaluation_acts_without_noise(pendulum):
    algorithm, learner, obs = pendulum
    params = algorithm.actor_learner.actor_params(learner)
    one = lambda key: algorithm.act(params, (), obs[0], jnp.bool_(True), key)[0]
    np.testing.assert_array_equal(one(jax.random.key(0)), one(jax.random.key(1)))


def test_ornstein_uhlenbeck_noise_is_the_ar1_process_with_its_stationary_variance_and_memory():
    """x' = a x + sigma sqrt(dt) e with a = 1 - theta dt: stationary variance sigma^2 dt / (1 - a^2), lag-k
    autocorrelation a^k (theta dt = 0.1 here, so that 200k steps hold ~10k independent stretches)."""
    theta, dt, sigma, steps = 0.5, 0.2, 0.3, 200_000
    draws = jax.random.normal(jax.random.key(0), (steps,))
    step = lambda x, e: (ornstein_uhlenbeck_step(x, e, sigma, theta, dt),) * 2
    _, path = jax.lax.scan(step, jnp.float32(0.0), draws)
    path = np.asarray(path[1000:], np.float64)  # past the start at zero
    a = 1 - theta * dt
    np.testing.assert_allclose(path.var(), sigma ** 2 * dt / (1 - a ** 2), rtol=0.05)
    for lag in (1, 10):
        np.testing.assert_allclose(np.corrcoef(path[:-lag], path[lag:])[0, 1], a ** lag, atol=0.02)


def test_gaussian_noise_forgets_and_ou_noise_continues_from_zero_at_an_episode_start():
    previous, draw, sigma = jnp.array([0.5, -0.2]), jnp.array([1.5, -0.5]), jnp.float32(0.2)
    for start in (False, True):  # Gaussian: sigma e whatever came before
        np.testing.assert_allclose(next_noise("gaussian", previous, jnp.bool_(start), draw, sigma, 0.15, 0.01),
                                   [0.3, -0.1], rtol=1e-6)
    a, scale = 1 - 0.5 * 0.2, 0.2 * np.sqrt(0.2)  # OU with theta 0.5, dt 0.2: a x + sigma sqrt(dt) e
    np.testing.assert_allclose(next_noise("ou", previous, jnp.bool_(False), draw, sigma, 0.5, 0.2),
                               a * np.array([0.5, -0.2]) + scale * np.array([1.5, -0.5]), rtol=1e-6)
    np.testing.assert_allclose(next_noise("ou", previous, jnp.bool_(True), draw, sigma, 0.5, 0.2),
                               scale * np.array([1.5, -0.5]), rtol=1e-6)


def test_noise_moves_the_action_but_never_past_the_bounds():
    np.testing.assert_allclose(with_noise(jnp.array([0.2, -0.9, 0.9, 0.5]), jnp.array([0.3, -0.3, 0.3, -1.0])),
                               [0.5, -1.0, 1.0, -0.5], rtol=1e-6)


def test_ou_actors_carry_their_noise_and_restart_it_at_an_episode_start(pendulum):
    algorithm, learner, obs = pendulum
    train = validated(compose_config(*PENDULUM, "algo.sigma_max=0.4", "algo.sigma_min=0.1", "algo.noise=ou",
                                     "algo.ou_theta=0.5", "algo.ou_dt=0.2"))
    _, _, ou = build(train)
    params = algorithm.actor_learner.actor_params(learner)
    act = lambda parts, noise, start: jax.vmap(parts.act, in_axes=(None, 0, 0, None, 0))(
        params, ActorNoise(jnp.arange(8, dtype=jnp.int32), jnp.full((8, 1), noise, jnp.float32)), obs,
        jnp.bool_(start), jax.random.split(jax.random.key(4), 8))
    fresh, remembering = act(ou.actor_learner, 0.0, False)[1].noise, act(ou.actor_learner, 0.3, False)[1].noise
    np.testing.assert_allclose(remembering - fresh, (1 - 0.5 * 0.2) * 0.3, rtol=1e-5)  # a x, by hand
    # where an episode starts the process restarts from zero: what it carried makes no difference
    np.testing.assert_array_equal(act(ou.actor_learner, 0.3, True)[0], act(ou.actor_learner, 0.0, True)[0])
    # a rung's noise: sigma_i sqrt(dt) times the actor's standard normal draw, from zero
    np.testing.assert_allclose(fresh[:, 0] / np.sqrt(0.2), np.repeat(sigma_ladder(4, 0.4, 0.1), 2) * np.asarray(
        jax.vmap(lambda key: jax.random.normal(key, (1,)))(jax.random.split(jax.random.key(4), 8)))[:, 0],
        rtol=1e-5)
    # Gaussian noise remembers nothing
    gaussian = algorithm.actor_learner
    np.testing.assert_array_equal(act(gaussian, 0.3, False)[0], act(gaussian, 0.0, False)[0])


def test_actor_priorities_are_the_plain_critics_td_error_by_hand():
    train = validated(compose_config(*PENDULUM, "algo.distributional=false", "algo.n_step=1", "algo.discount=0.9"))
    env, env_params, algorithm = build(train)
    parts = algorithm.actor_learner
    obs, _ = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(jax.random.key(0), 8), env_params)
    learner = parts.learner_init(jax.random.key(1), obs)
    params = parts.actor_params(learner)
    action = jnp.full((8, 1), 1.5)
    next_obs = obs[::-1]
    from lightspeed.framework.core.algorithm import ActorStep
    step = ActorStep(obs, action, action, (), jnp.arange(8.0), jnp.zeros(8, bool), jnp.zeros(8, bool), next_obs,
                     jnp.ones(8, bool), jnp.zeros(8, bool), jnp.zeros(8, bool), None)
    _, (items, priorities) = parts.observe(params, parts.record_init(obs), step)
    policy_net = algorithm_networks(train)
    q = policy_net["critic"].apply(params.critic, obs, action / 2.0)[:, 0]
    next_q = policy_net["critic"].apply(params.critic, next_obs, policy_net["policy"].apply(params.policy,
                                                                                            next_obs))[:, 0]
    np.testing.assert_allclose(priorities, np.abs(np.arange(8.0) + 0.9 * next_q - q) + 1e-6, rtol=1e-5)
    assert isinstance(params, DPGParams) and np.asarray(items.valid).all()


def algorithm_networks(train) -> dict:
    from lightspeed.algorithms.d4pg import Critic, Policy
    return {"policy": Policy(1, tuple(train.algo.policy_hidden_sizes)),
            "critic": Critic(1, tuple(train.algo.critic_hidden_sizes))}


@pytest.mark.parametrize("overrides, named", [
    (["algo=d4pg", "env=cartpole"], "algo=d4pg acts in box action spaces only"),
    (["algo=d4pg", "env=gymnax", "env.id=Pendulum-v1", "algo.v_max=-2000"], "algo.v_max=-2000"),
    (["algo=d4pg", "env=gymnax", "env.id=Pendulum-v1", "algo.sigma_min=0.5"], "algo.sigma_min=0.5"),
    (["algo=d4pg", "env=gymnax", "env.id=Pendulum-v1", "algo.noise=pink"], "algo.noise='pink'"),
    (["algo=d4pg", "env=gymnax", "env.id=Pendulum-v1", "algo.noise=ou", "algo.ou_dt=10"], "algo.ou_dt=10"),
])
def test_bad_input_is_refused_before_anything_compiles(overrides, named):
    with pytest.raises(ConfigError) as error:
        check_like_run_py(overrides)
    assert named in str(error.value) and "\n" not in str(error.value).strip()


HOST_RUN = ["algo=d4pg", "env=gymnasium", "env.id=Pendulum-v1", "total_env_steps=6000", "eval_every=2000",
            "log_every=2000", "eval_episodes=4", "final_eval_episodes=10", "algo.learning_starts=500"]


@pytest.fixture(scope="module")
def host_run(tmp_path_factory):
    def make(run_dir):
        result = run_cli(*HOST_RUN, run_dir=run_dir, timeout=600)
        assert result.returncode == 0, result.stderr
        evaluated = run_python(str(run_dir), "--episodes", "10", "--gif", str(run_dir / "episode.gif"),
                               module="lightspeed.framework.tools.evaluate", timeout=300)
        assert evaluated.returncode == 0, evaluated.stderr
    return shared_dir(tmp_path_factory, "d4pg-host", make)


# slow-marked: a learning bar (> -400 after 6,000 free-running env steps) with no measured margin, and the 10-minute
# budget; docs/algorithms.md's D4PG commands run the host path, a saved policy stepped by hand, in CI
@pytest.mark.slow
def test_a_host_run_learns_pendulum_and_its_policy_steps_gymnasiums_own_env_by_hand(host_run):
    summary = json.loads((host_run / "summary.json").read_text())
    final = summary["seeds"][0]["final_eval_return"]
    assert final > -400, final  # a policy that does nothing scores about -1200 from these starts
    policy = load_policy(host_run)
    env = gymnasium.make("Pendulum-v1")
    returns = []
    for episode in range(3):
        obs, _ = env.reset(seed=1000 + episode)
        policy.reset()
        total, done = 0.0, False
        while not done:
            action = policy(obs)
            assert action.dtype == np.float32 and action.shape == (1,) and -2.0 <= action[0] <= 2.0
            obs, reward, terminated, truncated, _ = env.step(action)
            total, done = total + reward, terminated or truncated
        returns.append(total)
    assert np.mean(returns) > -400, returns
    replayed = json.loads((host_run / "evaluation.json").read_text())
    assert replayed["seeds"][0]["mean"] == pytest.approx(final)
    assert (host_run / "episode.gif").stat().st_size > 10_000  # gymnasium renders the pendulum


def test_a_mujoco_env_has_box_actions_renders_without_a_display_and_warns_once(capfd):
    """HalfCheetah-v5 through env=gymnasium: its 6-D Box, an rgb_array frame through EGL, and MuJoCo 4's compiler
    warning (printed at every model load: every env, every evaluation episode) shown at most once more."""
    pytest.importorskip("mujoco")
    from lightspeed.envs.gymnasium_env import GymnasiumConfig, make_gymnasium

    env, _ = make_gymnasium(GymnasiumConfig(id="HalfCheetah-v5"))
    space = env.action_space()
    assert (space.kind, space.shape) == ("box", (6,)) and np.all(space.low == -1.0) and np.all(space.high == 1.0)
    for _ in range(3):
        env.evaluation_env().close()
    drawing = env.evaluation_env("rgb_array")
    drawing.reset(seed=0)
    frame = drawing.render()
    drawing.close()
    assert frame.shape == (480, 480, 3) and frame.std() > 10  # a picture, not a blank
    printed = capfd.readouterr()
    assert (printed.out + printed.err).count("settotalmass") <= 2, printed.err
