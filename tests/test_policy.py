"""The saved policy as a product: load_policy, `python -m lightspeed.framework.tools.evaluate`, GIFs, and bad input."""
import dataclasses
import json
from types import SimpleNamespace

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT, run_cli, run_python
from PIL import Image

from lightspeed.envs import make
from lightspeed.envs.gridworld import CELL_PIXELS, COLOURS
from lightspeed.framework.core import registry
from lightspeed.framework.core.errors import ConfigError
from lightspeed.framework.run.policy import load_policy, read_policy, save_policies

TWO_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}


def evaluate_cli(*args, env=None):
    """`python -m lightspeed.framework.tools.evaluate ARGS` in a subprocess."""
    return run_python(*map(str, args), module="lightspeed.framework.tools.evaluate",
                      env={"PYTHONPATH": str(ROOT), **(env or {})})


def one_paragraph_error(result):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0, result.stderr
    return result.stderr


@pytest.fixture(scope="module")
def dqn_run(tmp_path_factory):
    """The issue's command: DQN on CartPole, two seeds, defaults."""
    run_dir = tmp_path_factory.mktemp("dqn")
    result = run_cli("algo=dqn", "env=cartpole", "num_seeds=2", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    return run_dir, json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def tabular_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("tabular")
    walls = "[[1,1],[2,1],[3,1],[4,3],[4,4],[4,5],[2,7],[3,7],[4,7],[5,7]]"
    result = run_cli("algo=tabular_q", "env=gridworld", f"env.walls={walls}", "num_seeds=2", "algo.num_agents=6",
                            "total_env_steps=600000", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    return run_dir, json.loads((run_dir / "summary.json").read_text())


def play_gymnasium(policy, episodes: int) -> np.ndarray:
    """The returns of `episodes` CartPole-v1 episodes (episode e reset with seed e), played side by side: one
    policy call per step for the whole batch (a call per observation spent a minute on 200,000 calls)."""
    envs = [gym.make("CartPole-v1") for _ in range(episodes)]
    obs = np.stack([env.reset(seed=episode)[0] for episode, env in enumerate(envs)])
    returns, done = np.zeros(episodes), np.zeros(episodes, bool)
    start = True
    while not done.all():
        actions = policy(obs, start=start)  # a finished episode's slot acts on its last observation, unused
        start = False
        for e in np.flatnonzero(~done):
            obs[e], reward, terminated, truncated, _ = envs[e].step(int(actions[e]))
            returns[e] += reward
            done[e] = terminated or truncated
    return returns


def test_a_loaded_policy_plays_gymnasiums_cartpole_as_well_as_the_run_reported(dqn_run):
    run_dir, summary = dqn_run
    for seed in summary["seeds"]:
        returns = play_gymnasium(load_policy(run_dir, seed_index=seed["seed_index"]), 100)
        # different start states: the two means may differ by their standard errors, no more
        noise = np.sqrt((returns.std() ** 2 + seed["final_eval_std"] ** 2) / 100)
        assert abs(returns.mean() - seed["final_eval_return"]) <= 4 * noise + 1.0, (returns.mean(), seed)


def test_the_evaluate_command_reproduces_the_runs_final_evaluation(dqn_run):
    run_dir, summary = dqn_run
    for which, field in (("final", "final_eval_return"), ("best", "best_policy_eval_return")):
        result = evaluate_cli(run_dir, "--which", which)
        assert result.returncode == 0, result.stderr
        evaluation = json.loads((run_dir / "evaluation.json").read_text())
        assert (evaluation["which"], evaluation["episodes"], evaluation["seed"]) == (which, 100, 0)
        for saved, ours in zip(summary["seeds"], evaluation["seeds"], strict=True):
            assert ours["mean"] == pytest.approx(saved[field], abs=1e-9)
            assert len(ours["returns"]) == 100
        assert f"{summary['seeds'][0][field]:.2f}" in result.stdout  # the table shows the run's number beside


def test_another_seed_plays_other_episodes(dqn_run):
    from lightspeed.framework.tools.evaluate import main

    run_dir, _ = dqn_run
    # the command's main() in this process (the tests above and below run the command itself)
    main([str(run_dir), "--episodes", "3", "--seed", "1"])
    first = json.loads((run_dir / "evaluation.json").read_text())
    main([str(run_dir), "--episodes", "3", "--seed", "2"])
    second = json.loads((run_dir / "evaluation.json").read_text())
    assert first["seed"] == 1 and second["seed"] == 2 and len(first["seeds"][0]["returns"]) == 3


def test_a_cartpole_gif_shows_the_whole_episode(dqn_run, tmp_path):
    run_dir, _ = dqn_run
    gif = tmp_path / "cartpole.gif"
    result = evaluate_cli(run_dir, "--episodes", 2, "--gif", gif)
    assert result.returncode == 0, result.stderr
    recorded = json.loads((run_dir / "evaluation.json").read_text())["gif"]
    image = Image.open(gif)
    # 50 steps a second shown as every 2nd step at 25 frames a second, the last state always shown
    assert image.size == (480, 320) and image.n_frames == recorded["steps"] // 2 + 1 + recorded["steps"] % 2
    first = np.asarray(image.convert("RGB"))
    last = np.asarray(_seek(image, image.n_frames - 1).convert("RGB"))
    assert not np.array_equal(first, last)  # the cart and pole moved


def _seek(image, index):
    image.seek(index)
    return image.copy()


def test_a_gridworld_gif_walks_agent_zeros_path_to_the_goal(tabular_run, tmp_path):
    run_dir, summary = tabular_run
    gif = tmp_path / "grid.gif"
    result = evaluate_cli(run_dir, "--gif", gif)
    assert result.returncode == 0, result.stderr
    evaluation = json.loads((run_dir / "evaluation.json").read_text())
    steps = evaluation["gif"]["steps"]
    assert 18 <= steps <= 22  # 18 is the shortest path around these walls
    # the GIF's episode is the first one of the table, and it reached the goal (1.0; steps give 0 by default)
    assert evaluation["gif"]["return"] == evaluation["seeds"][0]["returns"][0] == 1.0
    image = Image.open(gif)
    assert image.n_frames == steps + 1
    last = np.asarray(_seek(image, steps).convert("RGB"))
    goal_centre = last[CELL_PIXELS // 2, CELL_PIXELS // 2]  # the goal is cell (0, 0)
    assert np.abs(goal_centre.astype(int) - COLOURS["agent"]).max() <= 8


def test_tabular_policies_are_one_agent_each(tabular_run):
    run_dir, _ = tabular_run
    env, env_params = make("gridworld", walls=[[1, 1], [2, 1], [3, 1], [4, 3], [4, 4], [4, 5], [2, 7], [3, 7],
                                                [4, 7], [5, 7]])
    tables, _ = read_policy(run_dir, 0, "final")
    start = np.asarray(env_params.start)
    for agent in (0, 5):
        policy = load_policy(run_dir, 0, agent_index=agent)
        greedy = int(np.argmax(tables[agent][tuple(start)]))
        assert policy(start) == greedy  # no ties at a trained start cell
    with pytest.raises(ConfigError, match="agent_index"):
        load_policy(run_dir, 0, agent_index=6)


def _fake_train_config(algo_name: str, env_name: str, **algo_overrides):
    algo = registry.build_config("algo", algo_name, algo_overrides)
    one_hot = env_name == "gridworld" and algo_name != "tabular_q"
    env = registry.build_config("env", env_name, {"observation": "one_hot"} if one_hot else {})
    return SimpleNamespace(algo=algo, env=env, seed=7, num_seeds=2, matmul_precision=None)


@pytest.mark.parametrize("algo_name, env_name", [("dqn", "cartpole"), ("apex", "cartpole"), ("dqn", "gridworld"),
                                                 ("tabular_q", "gridworld"), ("ppo", "cartpole")])
def test_save_then_load_acts_bit_identically(tmp_path, algo_name, env_name):
    train_cfg = _fake_train_config(algo_name, env_name)
    env, env_params, algorithm = registry.build(train_cfg.env, train_cfg.algo)
    from lightspeed.framework.run.policy import abstract_policy

    template = abstract_policy(algorithm, env, env_params)
    # random policies, not the initial ones: every array must survive the round trip exactly
    leaves, treedef = jax.tree.flatten(template)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    policies = jax.tree.unflatten(treedef, [np.asarray(jax.random.normal(k, (2, *leaf.shape), leaf.dtype))
                                            for k, leaf in zip(keys, leaves, strict=True)])
    save_policies(tmp_path, "final", policies, train_cfg, env, env_params, algorithm)
    obs, _ = jax.vmap(env.reset_env, in_axes=(0, None))(jax.random.split(jax.random.key(2), 64), env_params)
    obs = np.asarray(obs)
    for seed in (0, 1):
        loaded = load_policy(tmp_path, seed_index=seed)
        original = jax.tree.map(lambda leaf, seed=seed: jnp.asarray(leaf[seed]), policies)
        if algorithm.population_policy:
            original = jax.tree.map(lambda leaf: leaf[:1], original)
        # each row an episode at its first step: its act_init state, start, the key of episode 0's step 0
        states = jax.vmap(algorithm.act_init)(jnp.arange(len(obs), dtype=jnp.int32))
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(0), 0), 0)
        expected, _ = jax.vmap(algorithm.act, in_axes=(None, 0, 0, None, None))(
            original, states, jnp.asarray(obs), jnp.bool_(True), key)
        expected = np.asarray(expected)
        np.testing.assert_array_equal(loaded(obs), expected)
        assert loaded(obs[0]) == expected[0]  # random values leave no ties to break
        for saved, restored in zip(jax.tree.leaves(original), jax.tree.leaves(loaded.policy), strict=True):
            assert np.asarray(saved).tobytes() == np.asarray(restored).tobytes()
    _, meta = read_policy(tmp_path, 1, "final")
    assert meta["observation_shape"] == list(env.observation_shape) and meta["num_actions"] == env.num_actions
    assert meta["algo"] == dataclasses.asdict(train_cfg.algo) and meta["seed"] == 7
    assert meta["action_space"] == env.action_space(env_params).describe() and meta["policy_state"] == (
        [[[], "int32"]] if algorithm.population_policy else [])  # tabular Q's episode keeps its agent's number


def test_a_policy_file_that_does_not_fit_its_config_is_named(tmp_path):
    train_cfg = _fake_train_config("dqn", "cartpole")
    env, env_params, algorithm = registry.build(train_cfg.env, train_cfg.algo)
    small = _fake_train_config("dqn", "cartpole", hidden_sizes=[32, 32])
    _, _, small_algorithm = registry.build(small.env, small.algo)
    from lightspeed.framework.run.policy import abstract_policy

    small_template = abstract_policy(small_algorithm, env, env_params)
    policies = jax.tree.map(lambda leaf: np.zeros((2, *leaf.shape), leaf.dtype), small_template)
    # arrays of [32, 32] saved beside a [64, 64] config
    save_policies(tmp_path, "final", policies, train_cfg, env, env_params, algorithm)
    with pytest.raises(ConfigError) as error:
        load_policy(tmp_path)
    message = str(error.value)
    assert "Dense_0" in message and "shape (32,), the config builds (64,)" in message and "\n" not in message


def test_bad_input_to_load_policy_is_one_paragraph(dqn_run, tmp_path):
    run_dir, _ = dqn_run
    cases = [((tmp_path / "missing",), "no such directory"), ((tmp_path,), "no saved policies"),
             ((run_dir, 0, "worst"), "which"), ((run_dir, 2), "seed_index"), ((run_dir, 0, "final", 1), "agent_index")]
    for args, expected in cases:
        with pytest.raises(ConfigError) as error:
            load_policy(*args)
        assert expected in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="observation"):
        load_policy(run_dir)(np.zeros(3))


def evaluate_error_in_process(capsys, *args) -> str:
    """What `python -m lightspeed.framework.tools.evaluate ARGS` prints before it exits 2, from its main() in this
    process: a ConfigError (its __main__ prints the message) or argparse's exit 2 (the message on stderr)."""
    from lightspeed.framework.tools.evaluate import main

    capsys.readouterr()
    try:
        main([str(arg) for arg in args])
    except ConfigError as error:
        message = str(error)
    except SystemExit as exit_:
        assert exit_.code == 2
        message = capsys.readouterr().err
    else:
        raise AssertionError(f"accepted: {args}")
    assert "Traceback" not in message and message.strip().count("\n") == 0, message
    return message


def test_bad_input_to_the_evaluate_command_is_one_paragraph(dqn_run, tmp_path, capsys):
    run_dir, _ = dqn_run
    # through the command, a process each (~1.5 s): one of its own checks, one of argparse's
    assert "no such directory" in one_paragraph_error(evaluate_cli(tmp_path / "missing"))
    assert "run_dir" in one_paragraph_error(evaluate_cli())
    # the rest through its main() here, as the command would run them
    assert "no saved policies" in evaluate_error_in_process(capsys, tmp_path)
    assert "--which" in evaluate_error_in_process(capsys, run_dir, "--which", "worst")
    assert "--episodes" in evaluate_error_in_process(capsys, run_dir, "--episodes", 0)
    assert "--episodes" in evaluate_error_in_process(capsys, run_dir, "--episodes", "many")
    assert "--gif" in evaluate_error_in_process(capsys, run_dir, "--gif", tmp_path / "movie.mp4")


def test_ape_x_policies_from_two_devices_act_as_the_run_evaluated_them(tmp_path):
    """Learners on two forced devices; the saved policy, played on one device, gives the run's own final returns."""
    result = run_cli("algo=apex", "env=cartpole", "num_seeds=2", "num_devices=2", "total_env_steps=20480",
                            "eval_every=10240", "final_eval_episodes=20", run_dir=tmp_path, env=TWO_DEVICES)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["num_devices"] == 2
    evaluated = evaluate_cli(tmp_path, "--episodes", 20)
    assert evaluated.returncode == 0, evaluated.stderr
    ours = json.loads((tmp_path / "evaluation.json").read_text())["seeds"]
    assert [s["mean"] for s in ours] == pytest.approx([s["final_eval_return"] for s in summary["seeds"]], abs=1e-9)
