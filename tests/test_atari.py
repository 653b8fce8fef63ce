"""env=atari (envs/atari_env.py) against gymnasium's own Atari stack, its training transforms, the frame replay
fed from a real game, and short runs of both algorithms end to end (train, checkpoint, resume, evaluate,
saved policy, GIF)."""
import itertools
import json

import gymnasium
import jax
import numpy as np
import pytest
from conftest import compose_config

from lightspeed.algorithms.common.frame_replay import make_frame_replay
from lightspeed.algorithms.common.replays import frame_step
from lightspeed.envs.atari_env import AtariConfig, AtariEvaluationEnv, check_game, make_atari
from lightspeed.framework.app.train import train
from lightspeed.framework.core.errors import ConfigError, HostRunError
from lightspeed.framework.core.host_env import HostEnvError
from lightspeed.framework.run.policy import load_policy
from lightspeed.framework.tools.evaluate import main as evaluate_main

ale_py = pytest.importorskip("ale_py")
gymnasium.register_envs(ale_py)
PLAIN = {"noop_max": 0, "fire_reset": False}  # the setting in which gymnasium's wrappers and the engine agree


def gymnasium_reference(game: str, seed: int, actions: np.ndarray) -> tuple[np.ndarray, list[float]]:
    """gymnasium's AtariPreprocessing + FrameStackObservation(padding_type="zero") over ALE/<game>-v5 with one
    frame per step, no no-ops, no sticky actions: the stacks [steps + 1, 84, 84, 4] and raw rewards of one game."""
    pytest.importorskip("cv2")  # AtariPreprocessing resizes with OpenCV
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    env = gymnasium.make(f"ALE/{game}-v5", frameskip=1, repeat_action_probability=0.0)
    env = FrameStackObservation(AtariPreprocessing(env, noop_max=0, frame_skip=4, screen_size=84), 4,
                                padding_type="zero")
    obs, _ = env.reset(seed=seed)
    stacks, rewards = [obs], []
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(int(action))
        stacks.append(obs)
        rewards.append(float(reward))
        if terminated or truncated:
            break
    env.close()
    return np.moveaxis(np.array(stacks), 1, -1), rewards


@pytest.mark.parametrize("game", ["Breakout", "Pong"])
def test_frames_are_gymnasiums_atari_preprocessing_frame_for_frame(game):
    actions = np.random.default_rng(0).integers(0, 4, 300)
    expected, _ = gymnasium_reference(game, 3, actions)
    env, _ = make_atari(AtariConfig(id=game, clip_rewards=False, **PLAIN))
    vector = env.vector_env(1)
    stacks = [vector.reset(seed=3)[0]]
    for action in actions[: len(expected) - 1]:
        stacks.append(vector.step(np.array([action])).obs[0])
    vector.close()
    assert np.array_equal(np.array(stacks), expected)


def test_evaluation_scores_whole_games_raw_as_the_unwrapped_game():
    # Space Invaders' raw points (5 to 30 an invader) against ALE/SpaceInvaders-v5's own, same actions and seed
    actions = np.random.default_rng(1).integers(0, 6, 3000)
    unwrapped = gymnasium.make("ALE/SpaceInvaders-v5", repeat_action_probability=0.0)
    unwrapped.reset(seed=5)
    expected = []
    for action in actions:
        _, reward, terminated, truncated, _ = unwrapped.step(int(action))
        expected.append(float(reward))
        if terminated or truncated:
            break
    unwrapped.close()
    game = AtariEvaluationEnv(AtariConfig(id="SpaceInvaders", **PLAIN))
    game.reset(seed=5)
    rewards, done = [], False
    for action in actions[: len(expected)]:
        _, reward, terminated, truncated, _ = game.step(int(action))
        rewards.append(reward)
        done = terminated or truncated
    game.close()
    assert rewards == expected and done and max(expected) > 1  # a whole game, scored raw


def test_training_clips_rewards_and_ends_transitions_at_lost_lives_not_episodes():
    actions = np.random.default_rng(2).integers(0, 4, (600, 2))
    raw_env, _ = make_atari(AtariConfig(id="Breakout", clip_rewards=False, life_loss_terminal=False))
    train_env, _ = make_atari(AtariConfig(id="Breakout"))
    raw, clipped = raw_env.vector_env(2), train_env.vector_env(2)
    raw.reset(seed=7), clipped.reset(seed=7)
    lives_lost = ends = 0
    for step_actions in actions:
        a, b = raw.step(step_actions), clipped.step(step_actions)
        assert np.array_equal(a.obs, b.obs) and np.array_equal(b.reward, np.sign(a.reward))
        # the logged episode returns stay raw; a lost life ends a transition, never an episode
        assert np.array_equal(a.episode_return, b.episode_return) and np.array_equal(a.ended, b.ended)
        lost = b.terminated & ~a.terminated
        assert not (lost & (b.ended | ~b.acted)).any()
        lives_lost, ends = lives_lost + lost.sum(), ends + a.ended.sum()
    raw.close(), clipped.close()
    assert ends >= 2 and lives_lost >= 4 * ends  # Breakout's 5 lives: 4 lost before the one that ends a game


def test_the_frame_replay_fed_from_a_game_gives_back_the_engines_stacks():
    # short games (100 steps), so episode starts, lost lives and NEXT_STEP reset steps all land in the ring
    env, _ = make_atari(AtariConfig(id="Breakout", max_episode_frames=400, **PLAIN))
    vector, n, capacity, steps = env.vector_env(2), 3, 64, 150
    replay = make_frame_replay(2, capacity, (84, 84), np.uint8, 4, n, 0.99, batch_size=8)
    state, obs, started = replay.init(), vector.reset(seed=11), np.ones(2, bool)
    engine_stacks, acted, ended = [obs], [], []
    block = []
    for t in range(steps):
        step = vector.step(np.random.default_rng(t).integers(0, 4, 2))
        block.append(frame_step({"obs": obs, "final_obs": step.final_obs, "action": np.zeros(2, np.int32),
                                 "reward": step.reward, "terminated": step.terminated, "truncated": step.truncated,
                                 "acted": step.acted, "start": started, "fresh": np.full(2, t == 0)}))
        obs, started = step.obs, step.started
        engine_stacks.append(obs)
        acted.append(step.acted)
        ended.append(step.ended)
        if len(block) == 10:
            state = replay.add(state, jax.tree.map(lambda *steps: np.stack(steps), *block))
            block = []
    vector.close()
    assert np.array(ended).sum() >= 2 and not np.array(acted).all()
    positions = np.arange(steps - capacity + 4, steps - n + 1)  # every position still whole in the ring
    for env_index in range(2):
        items = replay.gather_items(state, env_index * capacity + positions % capacity)
        valid = items.valid.astype(bool)
        assert valid.sum() > 0.9 * len(positions)
        engine = np.array(engine_stacks)[positions, env_index]
        assert np.array_equal(np.asarray(items.obs)[valid], engine[valid])
        assert np.array(acted)[positions, env_index][valid].all()  # no item starts at a reset step


def test_an_unknown_game_is_one_paragraph_naming_the_closest():
    with pytest.raises(ConfigError, match=r"env.id='Breakot'.*closest: Breakout"):
        check_game(AtariConfig(id="Breakot"))


TINY = ["env=atari", "env.id=Pong", "env.max_episode_frames=400", "total_env_steps=512", "eval_every=256",
        "log_every=256", "eval_episodes=1", "final_eval_episodes=2", "num_seeds=1", "checkpoint.every=256"]
TINY_ALGO = {"dqn": ["algo=dqn", "algo.num_envs=4", "algo.train_every=32", "algo.updates_per_train=2",
                     "algo.buffer_size=2048", "algo.learning_starts=128"],
             "apex": ["algo=apex", "algo.num_actors=2", "algo.envs_per_actor=2", "algo.rollout_length=8",
                      "algo.batch_size=32", "algo.learner_updates_per_iteration=2", "algo.buffer_size=2048",
                      "algo.learning_starts=128"],
             "ppo": ["algo=ppo", "algo.num_envs=4", "algo.rollout_length=32", "algo.update_epochs=1",
                     "algo.num_minibatches=2"]}


# DQN's and PPO's are slow-marked: Ape-X's covers the Atari path (actor threads, frame replay, resume, evaluate, GIF)
# in CI; PPO's adds the on-policy host mode with a shared Nature torso
@pytest.mark.parametrize("algo", [pytest.param("dqn", marks=pytest.mark.slow), "apex",
                                  pytest.param("ppo", marks=pytest.mark.slow)])
def test_a_tiny_atari_run_trains_checkpoints_resumes_evaluates_and_plays(algo, tmp_path):
    first = train(compose_config(*TINY, *TINY_ALGO[algo]), tmp_path)
    assert first["env_steps"] == 512 and np.isfinite(first["final_eval_return"])
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == [256, 512]
    resumed = train(compose_config(*TINY, *TINY_ALGO[algo], "resume=true", "total_env_steps=768"), tmp_path)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["env_steps"] for r in records] == [256, 512, 768] and resumed["env_steps"] == 768
    assert np.isfinite(records[-1]["train/loss"])
    # the saved policies replay the final evaluation (eval_epsilon's draws are the episodes' own), GIF included
    replay = evaluate_main([str(tmp_path), "--episodes", "2", "--gif", str(tmp_path / "pong.gif")])
    assert replay["seeds"][0]["mean"] == pytest.approx(resumed["seeds"][0]["final_eval_return"])
    assert replay["gif"]["return"] == replay["seeds"][0]["returns"][0] and (tmp_path / "pong.gif").exists()
    policy = load_policy(tmp_path)
    game = AtariEvaluationEnv(AtariConfig(id="Pong"))
    obs, _ = game.reset(seed=0)
    assert 0 <= policy(obs) < game.action_space.n
    game.close()


def engine_failing_once(monkeypatch, at_call: int) -> list:
    """The first actor engine (the probe and evaluation's engines take num_threads=1) raises at its step call
    number `at_call` (from 0); the list collects (engine, made for an actor) of every engine made."""
    import lightspeed.envs.atari_env as atari_env

    real_engine, made = atari_env.engine, []

    def engine(config, num_envs, num_threads=None):
        vector = real_engine(config, num_envs, num_threads)
        for_actor = num_threads is None
        if for_actor and not any(actor for _, actor in made):
            step, calls = vector.step, itertools.count()

            def step_or_fail(actions):
                if next(calls) == at_call:
                    raise RuntimeError("emulator fault")
                return step(actions)

            vector.step = step_or_fail
        made.append((vector, for_actor))
        return vector

    monkeypatch.setattr(atari_env, "engine", engine)
    return made


def test_only_the_engines_own_calls_are_engine_faults(monkeypatch):
    """An exception from the engine is a HostEnvError (env.on_error's to handle); one from the adapter's own code
    around it stays what it is, a bug, and is never restarted as an env fault."""
    import lightspeed.envs.gymnasium_vector as adapter

    vector = make_atari(AtariConfig(id="Pong"))[0].vector_env(2)
    vector.reset(seed=0)
    engine, actions = vector.env.vector, np.zeros(2, np.int64)
    real_step = engine.step
    monkeypatch.setattr(engine, "step", lambda actions: (_ for _ in ()).throw(RuntimeError("emulator fault")))
    with pytest.raises(HostEnvError, match=r"'Pong' failed at its vector engine: RuntimeError: emulator fault"):
        vector.step(actions)
    monkeypatch.setattr(engine, "step", real_step)
    monkeypatch.setattr(adapter, "encode_observations", lambda space, raw: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        vector.step(actions)
    vector.close()


def test_an_engine_fault_stops_the_run_by_default_naming_the_game_and_env_on_error(monkeypatch, tmp_path):
    engine_failing_once(monkeypatch, at_call=20)
    with pytest.raises(HostRunError, match=r"The host env 'Pong' failed at its vector engine: RuntimeError: emulator "
                                        r"fault.*env.on_error"):
        train(compose_config(*TINY, *TINY_ALGO["dqn"], "checkpoint.every=0"), tmp_path)


def test_env_on_error_restart_gives_the_actor_new_engines_and_the_run_finishes(monkeypatch, tmp_path):
    made = engine_failing_once(monkeypatch, at_call=20)
    summary = train(compose_config(*TINY, *TINY_ALGO["dqn"], "checkpoint.every=0", "env.on_error=restart"), tmp_path)
    assert summary["env_steps"] == 512 and summary["runtime"]["runtime/env_restarts"] == 1
    assert sum(actor for _, actor in made) == 2  # the engine that raised, and the one that replaced it
