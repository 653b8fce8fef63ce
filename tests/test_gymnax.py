"""env=gymnax: the adapter against gymnax's own step, image observations through the conv torso,
observation encodings chosen by the algorithm, and the one-paragraph errors."""
import json

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import check_like_run_py, compose_config, run_cli

from lightspeed.algorithms.common.networks import QNetwork, make_q_network
from lightspeed.envs import make
from lightspeed.framework.anakin.trainer import build
from lightspeed.framework.app.cli import ComposeError
from lightspeed.framework.core import registry
from lightspeed.framework.core.config import validated
from lightspeed.framework.core.errors import ConfigError


@pytest.mark.parametrize("env_id", ["Acrobot-v1", "MountainCar-v0", "Breakout-MinAtar", "Catch-bsuite"])
def test_the_adapter_steps_as_gymnax_does_on_the_same_keys(env_id):
    """Auto-reset steps with random actions: observations, rewards, both flags and the final observation."""
    ours, params = make("gymnax", id=env_id, params={"max_steps_in_episode": 40})
    theirs, their_params = gymnax.make(env_id)
    their_params = their_params.replace(max_steps_in_episode=40)
    key = jax.random.key(3)
    obs, state = ours.reset(key, params)
    their_obs, their_state = theirs.reset(key, their_params)
    np.testing.assert_array_equal(np.asarray(obs, np.float32), np.asarray(their_obs, np.float32))
    step, their_step = jax.jit(ours.step), jax.jit(theirs.step)
    ended = {"terminated": 0, "truncated": 0}
    for t in range(200):
        step_key, action_key = jax.random.split(jax.random.fold_in(key, t))
        action = jax.random.randint(action_key, (), 0, ours.num_actions)
        obs, state, reward, terminated, truncated, info = step(step_key, state, action, params)
        their_obs, their_state, their_reward, their_terminated, their_truncated, their_info = their_step(
            step_key, their_state, action, their_params)
        np.testing.assert_array_equal(np.asarray(obs, np.float32), np.asarray(their_obs, np.float32))
        np.testing.assert_array_equal(np.asarray(info["final_observation"], np.float32),
                                      np.asarray(their_info["final_observation"], np.float32))
        assert float(reward) == float(their_reward)
        assert (bool(terminated), bool(truncated)) == (bool(their_terminated), bool(their_truncated))
        ended["terminated"] += bool(terminated)
        ended["truncated"] += bool(truncated)
    assert ended["terminated"] + ended["truncated"] > 0  # episodes ended and were reset in the same way
    if env_id in ("Acrobot-v1", "MountainCar-v0"):  # random play never swings up or reaches the flag in 40 steps
        assert ended["truncated"] > 0 and ended["terminated"] == 0


def test_sticky_actions_repeat_the_previous_action_as_minatar_does():
    """MinAtar's rule, stepped by hand on gymnax: with probability p the previous action is taken instead."""
    p = 0.3
    ours, params = make("gymnax", id="Breakout-MinAtar", sticky_actions=p)
    theirs, _ = gymnax.make("Breakout-MinAtar")
    key = jax.random.key(5)
    obs, state = ours.reset_env(key, params)
    their_obs, their_state = theirs.reset_env(key, params)
    step, their_step = jax.jit(ours.step_env), jax.jit(theirs.step_env)
    last, repeats, changes = 0, 0, 0
    for t in range(400):
        step_key, action_key = jax.random.split(jax.random.fold_in(key, t))
        chosen = int(jax.random.randint(action_key, (), 0, ours.num_actions))
        sticky_key, env_key = jax.random.split(step_key)
        taken = last if float(jax.random.uniform(sticky_key)) < p else chosen
        obs, state, reward, terminated, _, _ = step(step_key, state, jnp.int32(chosen), params)
        their_obs, their_state, their_reward, their_terminated, _ = their_step(env_key, their_state, taken, params)
        np.testing.assert_array_equal(np.asarray(obs, np.float32), np.asarray(their_obs, np.float32))
        assert (float(reward), bool(terminated)) == (float(their_reward), bool(their_terminated))
        changes += chosen != last
        repeats += chosen != last and taken == last
        last = taken
        if bool(terminated):  # both start again from the same reset, the previous action back to no-op
            obs, state = ours.reset_env(step_key, params)
            their_obs, their_state = theirs.reset_env(step_key, params)
            last = 0
    assert changes > 100 and abs(repeats / changes - p) < 0.12, (repeats, changes)


def test_minatar_observations_stay_boolean_in_replay_and_a_million_transitions_fit_in_a_gigabyte():
    cfg = validated(compose_config("algo=dqn", "env=gymnax", "env.id=Breakout-MinAtar", "algo.buffer_size=1000000"))
    env, env_params, algorithm = build(cfg)
    assert env.observation_shape == (10, 10, 4)
    state = jax.eval_shape(algorithm.init, jax.random.key(0))
    replay_bytes = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(state.learner.replay_state))
    observations = [leaf for leaf in jax.tree.leaves(state.learner.replay_state) if leaf.shape[-3:] == (10, 10, 4)]
    assert observations and all(leaf.dtype == jnp.bool_ for leaf in observations)
    assert replay_bytes <= 1e9, replay_bytes


def test_image_observations_get_the_minatar_conv_torso_and_learn():
    env, env_params = make("gymnax", id="Breakout-MinAtar")
    config = registry.build_config("algo", "dqn", {})
    network = make_q_network(config, env)
    assert network.torso == "conv"
    obs = jnp.zeros((5, 10, 10, 4), jnp.bool_)
    params = network.init(jax.random.key(0), obs)
    shapes = jax.tree.map(lambda leaf: leaf.shape, params)["params"]
    assert shapes["Conv3x3_0"]["kernel"] == (3, 3, 4, 16) and shapes["Dense_0"]["kernel"] == (8 * 8 * 16, 128)
    assert network.apply(params, obs).shape == (5, 3)
    # a few gradient steps towards fixed targets lower the loss
    observations = jax.random.bernoulli(jax.random.key(1), 0.2, (32, 10, 10, 4))
    targets = jax.random.normal(jax.random.key(2), (32, 3))
    loss = lambda p: jnp.mean((network.apply(p, observations) - targets) ** 2)
    first, gradient = loss(params), jax.jit(jax.grad(loss))
    for _ in range(20):
        params = jax.tree.map(lambda p, g: p - 0.05 * g, params, gradient(params))
    assert loss(params) < 0.7 * first


def test_the_matmul_convolution_is_flaxs_convolution():
    from lightspeed.algorithms.common.networks import Conv3x3

    images = jax.random.normal(jax.random.key(0), (2, 5, 10, 10, 4))
    ours = Conv3x3(16)
    params = ours.init(jax.random.key(1), images)
    reference = nn.Conv(16, (3, 3), strides=1, padding="VALID")
    np.testing.assert_allclose(ours.apply(params, images), reference.apply(params, images), rtol=1e-5, atol=1e-5)


def test_vector_observations_of_any_rank_are_flattened():
    network = QNetwork(3, (8,), observation_ndim=2)
    params = network.init(jax.random.key(0), jnp.zeros((10, 5)))
    assert jax.tree.map(lambda leaf: leaf.shape, params)["params"]["Dense_0"]["kernel"] == (50, 8)
    assert network.apply(params, jnp.zeros((7, 10, 5))).shape == (7, 3)


@pytest.mark.parametrize("algo, encoding", [("dqn", "one_hot"), ("apex", "one_hot"), ("tabular_q", "cell")])
def test_gridworld_gives_each_algorithm_the_encoding_it_consumes(algo, encoding):
    env, _, _ = build(validated(compose_config(f"algo={algo}", "env=gridworld")))
    assert env.observation_encoding == encoding


def one_paragraph_error(*overrides: str) -> str:
    """What run.py prints for bad overrides, found in-process by the checks it runs before compiling."""
    with pytest.raises((ConfigError, ComposeError)) as error:
        check_like_run_py(["algo=dqn", "env=gymnax", *overrides])
    return str(error.value)


@pytest.mark.parametrize("overrides, named", [
    (("env.id=Breakout",), "env.id='Breakout' (not a gymnax environment)"),
    (("env.params.no_such_param=3",), "env.params.no_such_param=3 (unknown param)"),
    (("env.params.max_steps_in_episode=1.5",), "env.params.max_steps_in_episode=1.5"),
    (("env.id=Acrobot-v1", "algo.torso=conv"), "algo.torso='conv'"),
    (("env.id=Breakout-MinAtar", "env.sticky_actions=1.0"), "env.sticky_actions=1.0"),
])
def test_bad_gymnax_input_is_one_paragraph(overrides, named):
    message = one_paragraph_error(*overrides)
    assert named in message and message.strip().count("\n") == 0 and "Allowed:" in message


@pytest.mark.parametrize("algo", ["dqn", "apex"])
def test_env_minatar_is_the_gymnax_tuning_over_minatar_sized_runs_with_sticky_actions(algo):
    minatar = compose_config(f"algo={algo}", "env=minatar", "env.id=Freeway-MinAtar")
    classic = compose_config(f"algo={algo}", "env=gymnax", "env.id=Freeway-MinAtar")
    assert (minatar.total_env_steps, minatar.eval_every, minatar.env.sticky_actions) == (2_000_000, 100_000, 0.1)
    assert (classic.total_env_steps, classic.env.sticky_actions) == (99_840, 0.0)
    # the algorithm's settings are algo_env/<algo>_gymnax.yaml's but for these (MinAtar's, classic control's):
    # the lr decay follows the longer run; both learners take 2 samples per frame instead of 16 (Ape-X: ended
    # higher on all four games) or 32 (DQN: 2M frames in the time 200k took); Ape-X keeps its 8 x 4 envs
    expected = {"lr_decay_env_steps": (2_000_000, 99_840)}
    if algo == "dqn":
        expected |= {"updates_per_train": (4, 64)}
    if algo == "apex":
        expected |= {"learner_updates_per_iteration": (4, 32), "envs_per_actor": (4, 1), "rollout_length": (8, 32)}
    differing = {key: (minatar.algo[key], classic.algo[key]) for key in minatar.algo
                 if minatar.algo[key] != classic.algo[key]}
    assert differing == expected


def test_env_minatar_takes_minatar_ids_only_in_one_paragraph():
    with pytest.raises(ConfigError) as error:
        check_like_run_py(["algo=apex", "env=minatar", "env.id=Acrobot-v1"])
    message = str(error.value)
    assert "env.id='Acrobot-v1' (this env option takes *-MinAtar ids only)" in message
    assert "Allowed: a gymnax id: Asterix-MinAtar, Breakout-MinAtar" in message
    assert message.strip().count("\n") == 0


def test_a_discrete_action_algorithm_on_a_continuous_gymnax_env_exits_with_one_paragraph_before_compiling():
    result = run_cli("algo=dqn", "env=gymnax", "env.id=Pendulum-v1", timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "Pendulum-v1's actions are Box(shape=(1,), float32, [-2, 2]), and algo=dqn acts in discrete" in result.stderr
    assert result.stderr.strip().count("\n") == 0 and "Allowed:" in result.stderr


def test_a_mismatched_encoding_is_a_clear_error():
    with pytest.raises(ConfigError, match="env.observation='cell'.*Allowed: one_hot"):
        build(validated(compose_config("algo=dqn", "env=gridworld", "env.observation=cell")))
    with pytest.raises(ConfigError, match="algo=tabular_q cannot take its vector observations"):
        build(validated(compose_config("algo=tabular_q", "env=cartpole")))


def saved_policies_replay(run_dir, *gif) -> dict:
    """evaluation.json of `python -m lightspeed.framework.tools.evaluate RUN_DIR` on the episodes of the run's final
    evaluation."""
    from test_policy import evaluate_cli

    summary = json.loads((run_dir / "summary.json").read_text())
    result = evaluate_cli(run_dir, "--episodes", summary["final_eval_episodes"], *gif)
    assert result.returncode == 0, result.stderr
    evaluation = json.loads((run_dir / "evaluation.json").read_text())
    # the saved final policies, rebuilt from their files, play the run's own final episodes again
    assert [seed["mean"] for seed in evaluation["seeds"]] == pytest.approx(
        [seed["final_eval_return"] for seed in summary["seeds"]], abs=1e-6)
    return evaluation


def test_dqn_on_a_gymnax_env_learns_its_saved_policies_replay_and_its_vector_env_does_not_draw(tmp_path):
    # Catch-bsuite: +1 for a caught ball, -1 for a missed one. Uniformly random play averages -0.63 (2,000
    # episodes, std 0.78). At 2,048 env steps the greedy policies of seeds 0..3 (2 each) ended anywhere from
    # 0.19 to 1.0; at these 4,096 every one of the 8 ended at 1.0 (measured 2026-12-04). Acrobot (the test
    # before this one) ended every cheap run at the episode cap (-200 or -500): any policy's return.
    result = run_cli("algo=dqn", "env=gymnax", "env.id=Catch-bsuite", "num_seeds=2", "total_env_steps=4096",
                     "eval_every=4096", "eval_episodes=4", "final_eval_episodes=32", run_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert min(seed["final_eval_return"] for seed in summary["seeds"]) >= 0.5, summary["seeds"]
    saved_policies_replay(tmp_path)
    # Catch's [10, 5] observations are no image: asked for a GIF, the evaluate command says so in one paragraph
    from test_policy import evaluate_cli, one_paragraph_error

    drawn = evaluate_cli(tmp_path, "--episodes", 1, "--gif", tmp_path / "a.gif")
    assert "cannot draw itself" in one_paragraph_error(drawn)


def test_ape_x_on_minatar_checkpoints_resumes_and_its_policy_plays(tmp_path):
    """The conv torso and sticky actions through the whole product: train, checkpoint, resume longer,
    evaluate the saved policy."""
    run = ("algo=apex", "env=minatar", "env.id=Breakout-MinAtar", "env.params.max_steps_in_episode=200",
           "algo.learning_starts=256", "algo.learner_updates_per_iteration=2", "algo.batch_size=32",
           "checkpoint.every=1024", "eval_every=1024", "eval_episodes=2", "final_eval_episodes=2")
    assert run_cli(*run, "total_env_steps=1024", run_dir=tmp_path).returncode == 0
    result = run_cli(*run, "total_env_steps=2048", "resume=true", run_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "summary.json").read_text())["env_steps"] == 2048
    # the saved conv policies play the run's final episodes again; the image observations draw themselves:
    # a GIF of the channels, of seed 0's first of those episodes
    from PIL import Image

    evaluation = saved_policies_replay(tmp_path, "--gif", tmp_path / "breakout.gif")
    assert evaluation["gif"]["return"] == evaluation["seeds"][0]["returns"][0]
    assert Image.open(tmp_path / "breakout.gif").size == (240, 240) and evaluation["gif"]["steps"] > 0
