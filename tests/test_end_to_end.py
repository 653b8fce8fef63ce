"""A tiny run through run.py writes every output; same seed repeats, another seed differs."""
import json

import jax
import numpy as np
import pytest
from conftest import deterministic_metrics, run_cli

TINY = ("algo=tabular_q", "env=gridworld", "algo.num_agents=4", "algo.steps_per_update=25", "num_seeds=2",
        "total_env_steps=4000", "eval_every=2000", "log_every=1000", "eval_episodes=4")



@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    dirs = {}
    for name, seed in (("first", 0), ("again", 0), ("other", 1)):
        run_dir = tmp_path_factory.mktemp(name)
        result = run_cli(*TINY, f"seed={seed}", run_dir=run_dir)
        assert result.returncode == 0, result.stderr
        dirs[name] = run_dir
    return dirs


def test_every_output_is_written(runs):
    run_dir = runs["first"]
    for name in ("config.yaml", ".hydra/config.yaml", "metrics.jsonl", "summary.json",
                 "learning_curve.png", "q_table.npy", "q_values.png"):
        assert (run_dir / name).is_file(), name
    assert np.load(run_dir / "q_table.npy").shape == (2, 4, 8, 12, 4)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["env_steps"] for r in records] == [1000, 2000, 3000, 4000]
    assert all("perf/wall_seconds" in r and "train/episode_return" in r for r in records)
    assert [("eval/return" in r) for r in records] == [False, True, False, True]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["seeds"]) == 2
    for seed in summary["seeds"]:
        assert set(seed) >= {"final_eval_return", "solved_at_env_steps", "solved_at_seconds"}
    assert summary["env_steps_per_second"] > 0 and summary["compile_seconds"] > 0


def test_same_seed_gives_identical_metrics(runs):
    assert deterministic_metrics(runs["first"]) == deterministic_metrics(runs["again"])
    assert np.array_equal(np.load(runs["first"] / "q_table.npy"), np.load(runs["again"] / "q_table.npy"))


def test_different_seeds_differ(runs):
    assert not np.array_equal(np.load(runs["first"] / "q_table.npy"), np.load(runs["other"] / "q_table.npy"))
    q_table = np.load(runs["first"] / "q_table.npy")
    assert not np.array_equal(q_table[0], q_table[1]), "the two vmapped seeds learned identically"


def test_target_return_stops_early_and_records_when(tmp_path):
    result = run_cli("algo=tabular_q", "env=gridworld", "env.height=3", "env.width=3", "env.start=[2,2]",
                            "total_env_steps=3000000", "eval_every=30000", "log_every=30000", "target_return=1.0",
                            run_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    solved = summary["seeds"][0]["solved_at_env_steps"]
    assert solved is not None and solved < 3000000 and summary["env_steps"] == solved
    assert summary["seeds"][0]["solved_at_seconds"] > 0


def test_seeds_split_across_devices_match_one_device(runs, tmp_path):
    # also a used run dir: a fresh (not resumed) run starts a fresh metrics.jsonl
    (tmp_path / "metrics.jsonl").write_text('{"env_steps": 999, "from": "an earlier run"}\n')
    result = run_cli(*TINY, "seed=0", run_dir=tmp_path,
                            env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "summary.json").read_text())["num_devices"] == 2
    assert np.array_equal(np.load(tmp_path / "q_table.npy"), np.load(runs["first"] / "q_table.npy"))
    assert deterministic_metrics(tmp_path) == deterministic_metrics(runs["first"])


def test_run_keys_differ_per_seed_and_per_evaluation():
    from lightspeed.framework.core.keys import run_keys

    data = lambda keys: np.asarray(jax.random.key_data(keys)).reshape(len(keys), -1)
    init_a, eval_a = run_keys(np.uint32(7), np.int32(0), 4)
    init_b, eval_b = run_keys(np.uint32(7), np.int32(1), 4)
    init_c, _ = run_keys(np.uint32(8), np.int32(0), 4)
    assert len({tuple(row) for row in data(init_a)}) == 4  # every seed its own init key
    np.testing.assert_array_equal(data(init_a), data(init_b))  # the evaluation number leaves init alone
    assert not np.array_equal(data(eval_a), data(eval_b))  # each evaluation its own episodes
    assert not np.array_equal(data(init_a), data(init_c))
    # the derivation the trainer used to run eagerly on the host, so old runs' keys are unchanged
    init_key, eval_root = jax.random.split(jax.random.key(7))
    np.testing.assert_array_equal(data(init_a), data(jax.random.split(init_key, 4)))
    np.testing.assert_array_equal(data(eval_b), data(jax.random.split(jax.random.fold_in(eval_root, 1), 4)))


def test_matmul_precision_reaches_jax_for_the_run_only_and_changes_nothing_on_a_cpu():
    """matmul_precision=highest asks accelerators for full float32 products; a CPU computes them so already, so the
    CPU runs the results page reports are the same with it or without; after the run JAX's default is back."""
    from lightspeed.framework.core.devices import jax_options

    if jax.default_backend() != "cpu":
        pytest.skip("the equality holds on a CPU")
    a, b = jax.random.normal(jax.random.key(0), (2, 64, 300))
    network = lambda a, b: jax.nn.tanh(a @ b.T) @ b
    default = jax.jit(network)(a, b)
    with jax_options(None, "highest"):
        assert jax.config.jax_default_matmul_precision == "highest"
        np.testing.assert_array_equal(jax.jit(network)(a, b), default)  # a new jit: compiled at this precision
    assert jax.config.jax_default_matmul_precision is None
