"""Actors and learner apart on gymnasium envs (framework/sebulba/trainer.py): a short run of each algorithm end to
end, lockstep reproducibility, an env that raises, and what the path refuses."""
import json
import threading
import time
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from conftest import compose_config
from test_host_env import TEST_ID

from lightspeed.framework.app.train import train
from lightspeed.framework.core.errors import ConfigError, HostRunError
from lightspeed.framework.core.host_env import derived_seed
from lightspeed.framework.run.policy import policy_path
from lightspeed.framework.sebulba.actor import column_order
from lightspeed.framework.sebulba.trainer import HostRun
from lightspeed.framework.tools.evaluate import main as evaluate_main

SHORT = ["env=gymnasium", "total_env_steps=2048", "eval_every=1024", "log_every=1024", "eval_episodes=2",
         "final_eval_episodes=3", "num_seeds=2", "algo.learning_starts=256"]
SMALL = {"dqn": ["algo=dqn", "algo.batch_size=32", "algo.train_every=64", "algo.updates_per_train=4"],
         "apex": ["algo=apex", "algo.num_actors=2", "algo.envs_per_actor=2", "algo.rollout_length=16",
                  "algo.batch_size=32", "algo.learner_updates_per_iteration=4"]}


FIRST_ENV_SEED = derived_seed(0, 0, 0)  # the first env of actor thread 0 at env step 0, run seed 0


def timing_free(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(("perf/", "runtime/"))}


# DQN's is slow-marked (the 10-minute budget): docs/envs.md's gymnasium command and test_lockstep run DQN's host path
@pytest.mark.parametrize("algo", [pytest.param("dqn", marks=pytest.mark.slow), "apex"])
def test_a_short_run_learns_evaluates_and_writes_its_results(algo, tmp_path):
    summary = train(compose_config(*SHORT, *SMALL[algo]), tmp_path)
    assert [seed["seed_index"] for seed in summary["seeds"]] == [0, 1]
    assert all(np.isfinite(seed["final_eval_return"]) and seed["final_eval_return"] >= 8 for seed in summary["seeds"])
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["env_steps"] for r in records] == [1024, 2048] and "eval/return" in records[-1]
    # the algorithm's actor metrics, read from the actor threads: DQN's epsilon on its schedule (the actor's clock
    # may run a block of 64 steps ahead in free mode), Ape-X's return per rung of its 2-actor ladder
    if algo == "dqn":
        assert records[-1]["train/epsilon"] == pytest.approx(1 - 0.96 * (2048 + 64) / 8000, abs=0.96 * 64 / 8000)
    else:
        per_rung = [v for k, v in records[-1].items() if k.startswith("actors/return_eps_")]
        assert len(per_rung) == 2 and all(v >= 8 for v in per_rung), records[-1]
    runtime = summary["runtime"]
    # the learner drew its share: the limiter keeps samples within one round of the target ratio
    assert runtime["samples_per_insert_target"] == pytest.approx(2.0)
    assert runtime["runtime/learner_batches_per_second"] > 0 and np.isfinite(records[-1]["train/loss"])
    assert abs(runtime["runtime/samples_per_insert"] - 2.0) <= 128 / (2048 - 256) + 1e-9
    assert all(policy_path(tmp_path, seed, which).exists() for seed in (0, 1) for which in ("final", "best"))
    # the saved policies replay the final evaluation (same episode seeds), and the GIF is its first episode
    replay = evaluate_main([str(tmp_path), "--episodes", "3", "--gif", str(tmp_path / "episode.gif")])
    assert [row["mean"] for row in replay["seeds"]] == pytest.approx(
        [seed["final_eval_return"] for seed in summary["seeds"]])
    assert replay["gif"]["return"] == replay["seeds"][0]["returns"][0] and (tmp_path / "episode.gif").exists()
    # the best policies too, all of them played (the run reused the final returns where best was final)
    replay = evaluate_main([str(tmp_path), "--episodes", "3", "--which", "best"])
    assert [row["mean"] for row in replay["seeds"]] == pytest.approx(
        [seed["best_policy_eval_return"] for seed in summary["seeds"]])


def test_lockstep_runs_are_reproducible(tmp_path):
    runs = [tmp_path / "a", tmp_path / "b"]
    for run_dir in runs:
        train(compose_config(*SHORT, *SMALL["dqn"], "runtime.mode=lockstep"), run_dir)
    read = lambda run_dir: [timing_free(json.loads(line))
                            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert read(runs[0]) == read(runs[1])
    for seed in (0, 1):
        assert policy_path(runs[0], seed, "final").read_bytes() == policy_path(runs[1], seed, "final").read_bytes()


def test_an_env_that_raises_stops_the_run_naming_the_env_and_leaves_no_thread(tmp_path):
    before = threading.active_count()
    config = compose_config(*SHORT, *SMALL["dqn"], f"env.id={TEST_ID}", f"+env.kwargs.fail_seed={FIRST_ENV_SEED}",
                            "+env.kwargs.fail_step=50")
    with pytest.raises(HostRunError, match=rf"env step .* of {TEST_ID}.*failed at env index 0"):
        train(config, tmp_path)
    assert threading.active_count() == before


def test_a_resumed_run_continues_from_its_checkpoint(tmp_path):
    first = train(compose_config(*SHORT, *SMALL["apex"], "checkpoint.every=1024"), tmp_path)
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == [1024, 2048]
    resumed = train(compose_config(*SHORT, *SMALL["apex"], "checkpoint.every=1024", "resume=true",
                                   "total_env_steps=4096"), tmp_path)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["env_steps"] for r in records] == [1024, 2048, 3072, 4096]
    # the learner's updates go on from the checkpoint's: 2048 more env steps draw 2 x 2048 samples of 32
    updates = [r["runtime/learner_updates"] for r in records]
    assert updates[3] - updates[1] == pytest.approx(2 * 2048 / 32, abs=4) and updates[1] > 0
    assert resumed["env_steps"] == 4096 and first["env_steps"] == 2048
    assert len(json.loads((tmp_path / "summary.json").read_text())["seeds"]) == 2


def test_free_running_learns_between_blocks_and_ends(tmp_path):
    summary = train(compose_config(*SHORT, *SMALL["dqn"], "num_seeds=1", "runtime.samples_per_insert=null"), tmp_path)
    runtime = summary["runtime"]
    # no ratio: the learner draws what it can between blocks, at least a round per block once it started
    assert runtime["samples_per_insert_target"] is None and summary["env_steps"] == 2048
    assert runtime["runtime/learner_updates"] >= 4 * (2048 - 256) // 64


def test_an_evaluation_longer_than_the_timeout_holds_the_run_without_failing_it(monkeypatch, tmp_path):
    import lightspeed.framework.sebulba.trainer as host_trainer

    greedy_returns, played, slow = host_trainer.greedy_returns, [], 8.0  # seconds, past runtime.timeout_s

    def slow_first_evaluation(*args, **kwargs):  # an evaluation of whole Atari games, say
        if not played:
            time.sleep(slow)
        played.append(1)
        return greedy_returns(*args, **kwargs)

    monkeypatch.setattr(host_trainer, "greedy_returns", slow_first_evaluation)
    # a report every 128 env steps: more than the 4 the reports queue holds pile up behind the evaluation at
    # 1,024, so the learner, and behind it the actors, wait on the driver for longer than the timeout
    summary = train(compose_config(*SHORT, *SMALL["dqn"], "num_seeds=1", "log_every=128", "runtime.timeout_s=6"),
                    tmp_path)
    assert summary["env_steps"] == 2048 and len(played) >= 3


def test_env_on_error_restart_restarts_the_envs_and_finishes(tmp_path):
    config = compose_config(*SHORT, *SMALL["dqn"], f"env.id={TEST_ID}", f"+env.kwargs.fail_seed={FIRST_ENV_SEED}",
                            "+env.kwargs.fail_step=50", "env.on_error=restart", "num_seeds=1")
    summary = train(config, tmp_path)
    assert summary["env_steps"] == 2048 and summary["runtime"]["runtime/env_restarts"] == 1


@pytest.mark.parametrize("overrides, key", [
    (["algo=tabular_q"], "env"),  # its grid cells: the registry refuses the pair before the host path is reached
    (["algo=dqn", "num_devices=2"], "num_devices"),
    (["algo=dqn", "runtime.num_actor_threads=3"], "runtime.num_actor_threads"),
    (["algo=dqn", "actors=ray", "ray.num_actors=3"], "ray.num_actors"),  # refused before a cluster starts
    (["algo=dqn", "actors=ray", "ray.min_actors=3"], "ray.min_actors"),
    (["algo=dqn", "actors=processes"], "actors"),
])
def test_what_the_host_path_refuses(overrides, key, tmp_path):
    with pytest.raises(ConfigError) as refused:
        train(compose_config("env=gymnasium", *overrides), tmp_path)
    assert refused.value.key == key


def test_host_env_seeds_stay_below_2_to_the_32():
    """numpy's legacy RandomState (MinAtar's package) refuses larger seeds: seed=4242 used to crash the first
    evaluation of a MinAtar run. Every evaluation still gets a block of episode seeds of its own."""
    from lightspeed.framework.core.host_env import MAX_VECTOR_ENVS, derived_seed
    from lightspeed.framework.sebulba.trainer import EPISODES_APART, evaluation_seed

    for seed in (0, 4242, 8086, 2**32 - 1):
        for num_seeds in (1, 10, 40):
            starts = [evaluation_seed(seed, num_seeds, evaluation) for evaluation in range(-1, 100)]
            assert all(0 <= start and start + num_seeds * EPISODES_APART <= 2**32 for start in starts)
            assert len(set(starts)) == len(starts)
    seeds = {derived_seed(seed, thread, step) for seed in (0, 4242, 8086) for thread in range(4)
             for step in (0, 128, 2_000_000)}
    assert len(seeds) == 36 and all(0 <= seed <= 2**32 - MAX_VECTOR_ENVS for seed in seeds)
    np.random.RandomState(max(seeds) + MAX_VECTOR_ENVS - 1)  # a vector env's last env seed is still accepted


def test_actor_metrics_read_every_slots_envs_in_env_order():
    """Slot k owns columns k, k + slots, ...: the algorithm's actor_metrics sees them back in env order."""
    columns = column_order(6, 2)  # slot 0: envs 0, 2, 4; slot 1: envs 1, 3, 5
    slots = [SimpleNamespace(metric_inputs=lambda c=c: ({"clock": c[None] * 10}, c[None].astype(np.float32)))
             for c in columns]
    run = SimpleNamespace(actors=slots, env_order=np.argsort(columns.reshape(-1)),
                          actor_metrics=jax.vmap(lambda states, returns: {**states, "returns": returns}))
    metrics = HostRun.actor_side_metrics(run)
    np.testing.assert_array_equal(metrics["returns"], [np.arange(6)])
    np.testing.assert_array_equal(metrics["clock"], [np.arange(6) * 10])
    slots[1].metric_inputs = lambda: None  # a slot before its first block: nothing yet
    assert HostRun.actor_side_metrics(run) == {}
