"""A run killed with SIGKILL and resumed ends bit-identical to one that was never interrupted."""
import json
import shutil
import signal
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from conftest import deterministic_metrics, run_cli, shared_dir, start_python

# a checkpoint every 16,000 env steps, not every 4,000: each costs ~0.1 s, 30 a run were a third of it; the first
# (where the SIGKILL tests stop a run) then comes after two evaluations, so it carries a best policy too
# no early stop (dqn_cartpole.yaml ends a solved seed): the run goes to total_env_steps whenever this CPU solves it
DQN_TWO_SEEDS = ("algo=dqn", "env=cartpole", "target_return=null",
                 "num_seeds=2", "total_env_steps=120000", "log_every=4000",
                 "eval_every=8000", "eval_episodes=4", "checkpoint.every=16000", "checkpoint.keep=2",
                 "algo.learning_starts=500")
# learners on two forced devices: the checkpoint holds both devices' actors, replay shards and keys. No early stop
# (apex_cartpole.yaml ends a solved seed): the run goes to total_env_steps whenever this CPU's floats solve it
APEX_TWO_DEVICES = ("algo=apex", "env=cartpole", "target_return=null", "num_seeds=1", "total_env_steps=122880",
                    "log_every=4096", "eval_every=8192", "eval_episodes=4", "checkpoint.every=16384",
                    "checkpoint.keep=2", "algo.learning_starts=500", "algo.learner_updates_per_iteration=8")
TWO_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
# recurrent: the checkpoint holds the actors' LSTM states, the stored sequences' states and the sum tree over slots
# (no early stop, as for Ape-X: r2d2_cartpole.yaml has a target return)
R2D2_TWO_SEEDS = ("algo=r2d2", "env=cartpole", "env.observe=position", "target_return=null", "num_seeds=2",
                  "total_env_steps=40960", "log_every=2560", "eval_every=5120", "eval_episodes=4",
                  "checkpoint.every=2560", "checkpoint.keep=2", "algo.lstm_size=16", "algo.hidden_sizes=[16]")
# continuous actions: the policy and critic with their targets, float actions in replay, the actors' noise keys
D4PG_TWO_SEEDS = ("algo=d4pg", "env=gymnax", "env.id=Pendulum-v1", "num_seeds=2", "total_env_steps=8000",
                  "log_every=1000", "eval_every=2000", "eval_episodes=2", "checkpoint.every=2000", "checkpoint.keep=2",
                  "algo.policy_hidden_sizes=[32]", "algo.critic_hidden_sizes=[32]", "algo.learning_starts=500")

# on-policy with Box actions: the checkpoint holds the latest block, the observation and return statistics
PPO_PENDULUM = ("algo=ppo", "env=gymnax", "env.id=Pendulum-v1", "num_seeds=2", "total_env_steps=16384",
                "log_every=2048", "eval_every=4096", "eval_episodes=2", "checkpoint.every=4096", "checkpoint.keep=2",
                "algo.num_envs=4", "algo.rollout_length=64", "algo.hidden_sizes=[32]",
                "algo.normalize_observations=true", "algo.scale_rewards=true")


def with_values(overrides: tuple[str, ...], **values: str) -> tuple[str, ...]:
    """The overrides with some keys' values replaced (a dotted key's dots written as __)."""
    replaced = {key.replace("__", "."): value for key, value in values.items()}
    return tuple(f"{key}={replaced.get(key, value)}" for key, value in (o.split("=", 1) for o in overrides))


# a million-item replay per seed makes each checkpoint big enough to be caught half-written
# (checkpoints every 4,000 env steps: several a run, one to catch half-written after one finished)
DQN_BIG_REPLAY = (*with_values(DQN_TWO_SEEDS, total_env_steps="24000", checkpoint__every="4000"),
                  "algo.buffer_size=1000000")
RUNS = {"dqn": (DQN_TWO_SEEDS, {}), "apex_two_devices": (APEX_TWO_DEVICES, TWO_DEVICES), "r2d2": (R2D2_TWO_SEEDS, {}),
        "d4pg": (D4PG_TWO_SEEDS, {}), "dqn_big_replay": (DQN_BIG_REPLAY, {}), "ppo": (PPO_PENDULUM, {})}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """A RUNS entry's run dir, run to its end without interruption: once per session, the reference its tests
    compare with (they never change it: a test that resumes or damages a run works on a copy)."""
    def run(name):
        overrides, env = RUNS[name]

        def make(run_dir):
            result = run_cli(*overrides, run_dir=run_dir, env=env)
            assert result.returncode == 0, result.stderr

        return shared_dir(tmp_path_factory, f"resume-{name}", make)

    return run


def _copy(run_dir, to):
    shutil.copytree(run_dir, to, symlinks=True)
    return to


def _saved_policies(run_dir):
    """Every saved policy file's bytes (final and best, every seed)."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted((run_dir / "policies").rglob("*.msgpack"))}


def _seed_results(run_dir):
    """summary.json's per-seed results without what depends on the clock."""
    seeds = json.loads((run_dir / "summary.json").read_text())["seeds"]
    return [{k: v for k, v in seed.items() if k != "solved_at_seconds"} for seed in seeds]


def _final_state(run_dir):
    steps = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    newest = (run_dir / "checkpoints" / str(steps[-1]) / "state").absolute()
    return steps[-1], ocp.StandardCheckpointer().restore(newest)



def _start(run_dir, overrides, env):
    return start_python(*overrides, "progress=false", f"hydra.run.dir={run_dir}", env=env)


def _kill_after_first_checkpoint(run_dir, overrides, env):
    process = _start(run_dir, overrides, env)
    deadline = time.time() + 120
    checkpoints = run_dir / "checkpoints"
    while time.time() < deadline and process.poll() is None:
        if checkpoints.exists() and any(p.name.isdigit() for p in checkpoints.iterdir()):
            break
        time.sleep(0.02)
    assert process.poll() is None, f"the run ended before it could be killed: {process.communicate()[1]}"
    process.send_signal(signal.SIGKILL)
    process.wait()


# DQN's, R2D2's and D4PG's are slow-marked (25-40 s each): Ape-X's on two devices covers the resume path in CI (and
# the Ctrl-C test below resumes DQN bit-identically); R2D2's adds its recurrent state, D4PG's two networks and float
# actions; PPO's (in CI) the on-policy learner, its Gaussian policy and running statistics
@pytest.mark.parametrize("name", [pytest.param("dqn", marks=pytest.mark.slow), "apex_two_devices",
                                  pytest.param("r2d2", marks=pytest.mark.slow),
                                  pytest.param("d4pg", marks=pytest.mark.slow), "ppo"])
def test_sigkill_then_resume_is_bit_identical(tmp_path, name, uninterrupted):
    overrides, env = RUNS[name]
    uninterrupted, interrupted = uninterrupted(name), tmp_path / "interrupted"

    _kill_after_first_checkpoint(interrupted, overrides, env)
    assert not (interrupted / "summary.json").exists()
    result = run_cli(*overrides, "resume=true", run_dir=interrupted, env=env)
    assert result.returncode == 0, result.stderr

    step_a, state_a = _final_state(uninterrupted)
    step_b, state_b = _final_state(interrupted)
    assert step_a == step_b >= int(dict(o.split("=", 1) for o in overrides)["total_env_steps"])
    leaves_a, leaves_b = jax.tree.leaves(state_a), jax.tree.leaves(state_b)
    assert len(leaves_a) == len(leaves_b) > 10
    for a, b in zip(leaves_a, leaves_b, strict=True):
        np.testing.assert_array_equal(a, b)
    assert deterministic_metrics(interrupted) == deterministic_metrics(uninterrupted)
    # each seed's best policy came through the checkpoint: the same bytes, the same final evaluation
    policies = _saved_policies(uninterrupted)
    num_seeds = int(dict(o.split("=", 1) for o in overrides)["num_seeds"])
    assert len(policies) == 2 * num_seeds and _saved_policies(interrupted) == policies
    assert _seed_results(interrupted) == _seed_results(uninterrupted)


def test_resume_without_a_checkpoint_is_a_clear_error(tmp_path):
    result = run_cli("resume=true", run_dir=tmp_path, timeout=120)
    assert result.returncode == 2 and "resume" in result.stderr and "Traceback" not in result.stderr


def test_a_fresh_run_refuses_a_run_dir_holding_checkpoints(tmp_path, uninterrupted):
    run_dir = _copy(uninterrupted("dqn"), tmp_path / "run")
    saved = {p: p.stat().st_mtime_ns for p in (run_dir / "checkpoints").rglob("*") if p.is_file()}
    result = run_cli(*DQN_TWO_SEEDS, "seed=1", run_dir=run_dir)  # the command again, forgetting resume=true
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "resume=False" in result.stderr and "earlier run's checkpoints" in result.stderr
    assert "hydra.run.dir" in result.stderr
    assert {p: p.stat().st_mtime_ns for p in (run_dir / "checkpoints").rglob("*") if p.is_file()} == saved


def test_ctrl_c_writes_a_checkpoint_and_the_summary_then_resume_finishes_identically(tmp_path, uninterrupted):
    # no periodic checkpoints: Ctrl-C must write one; the reference is the same run with them (they change nothing)
    overrides = tuple("checkpoint.every=0" if o.startswith("checkpoint.every=") else o for o in DQN_TWO_SEEDS)
    uninterrupted, interrupted = uninterrupted("dqn"), tmp_path / "interrupted"

    process = _start(interrupted, overrides, {})
    deadline = time.time() + 120
    while time.time() < deadline and not (interrupted / "metrics.jsonl").exists():
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "resume=true" in stderr and "Traceback" not in stderr
    summary = json.loads((interrupted / "summary.json").read_text())
    assert summary["interrupted"] and summary["env_steps"] < 120000
    assert any(p.name.isdigit() for p in (interrupted / "checkpoints").iterdir())

    newest = max(int(p.name) for p in (interrupted / "checkpoints").iterdir() if p.name.isdigit())
    result = run_cli(*overrides, "resume=true", run_dir=interrupted)
    assert result.returncode == 0, result.stderr
    assert f"resumed at {newest:,} env steps of 120,000, from {interrupted / 'checkpoints' / str(newest)}" in (
        result.stdout.splitlines())
    assert not json.loads((interrupted / "summary.json").read_text())["interrupted"]
    assert deterministic_metrics(interrupted) == deterministic_metrics(uninterrupted)


def test_a_damaged_newest_checkpoint_is_reported_and_the_previous_one_used(tmp_path, uninterrupted):
    overrides = DQN_BIG_REPLAY
    reference = uninterrupted("dqn_big_replay")
    damaged = _copy(reference, tmp_path / "damaged")
    newest = max((p for p in (damaged / "checkpoints").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    largest = max((p for p in (newest / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    largest.write_bytes(largest.read_bytes()[: largest.stat().st_size // 2])  # a write cut short

    result = run_cli(*overrides, "resume=true", run_dir=damaged)
    assert result.returncode == 0, result.stderr
    assert f"checkpoint {newest.name} cannot be read" in result.stderr and "Traceback" not in result.stderr
    assert (damaged / "checkpoints_unreadable" / newest.name).is_dir()
    assert deterministic_metrics(damaged) == deterministic_metrics(reference)
    step_a, state_a = _final_state(reference)
    step_b, state_b = _final_state(damaged)
    assert step_a == step_b
    for a, b in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b), strict=True):
        np.testing.assert_array_equal(a, b)


def _checkpoint_files(run_dir):
    """Every checkpoint file's modification time and SHA-256."""
    import hashlib

    return {str(p.relative_to(run_dir)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted((run_dir / "checkpoints").rglob("*")) if p.is_file()}


DQN_SETTINGS = dict(override.split("=", 1) for override in DQN_TWO_SEEDS)


def _overrides(settings):
    return [f"{key}={value}" for key, value in settings.items()]


CHANGES = [({"algo.hidden_sizes": "[32,32]"}, "algo.hidden_sizes=[64, 64] in the run dir, [32, 32] now"),
           ({"algo": "apex"}, "algo.name='dqn' in the run dir, 'apex' now"),
           ({"env.max_steps": "200"}, "env.max_steps=500 in the run dir, 200 now")]


def test_resume_with_a_changed_network_algorithm_or_env_exits_2_and_touches_no_checkpoint(tmp_path, uninterrupted):
    run_dir = _copy(uninterrupted("dqn"), tmp_path / "run")
    saved = _checkpoint_files(run_dir)
    for change, named in CHANGES:
        result = run_cli(*_overrides({**DQN_SETTINGS, **change}), "resume=true", run_dir=run_dir)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert named in result.stderr and result.stderr.strip().count("\n") == 0
        assert _checkpoint_files(run_dir) == saved and not (run_dir / "checkpoints_unreadable").exists()
    # the right config still resumes
    assert run_cli(*_overrides(DQN_SETTINGS), "resume=true", run_dir=run_dir).returncode == 0


def test_an_intact_checkpoint_that_does_not_fit_the_devices_is_not_moved_aside(tmp_path, uninterrupted):
    """Learners on 2 devices, resumed on 1 (num_devices: null both times): the state's shape differs."""
    run_dir = _copy(uninterrupted("apex_two_devices"), tmp_path / "run")
    saved = _checkpoint_files(run_dir)
    result = run_cli(*APEX_TWO_DEVICES, "resume=true", run_dir=run_dir, env={"XLA_FLAGS": ""})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "is intact but does not fit this run's state" in result.stderr
    assert _checkpoint_files(run_dir) == saved and not (run_dir / "checkpoints_unreadable").exists()


DIVERGING = ("algo=dqn", "env=cartpole", "num_seeds=2", "algo.learning_rate=1e30", "algo.learning_starts=4096",
             "total_env_steps=8192", "log_every=2048", "eval_every=4096", "eval_episodes=2", "checkpoint.every=2048")


def test_a_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    result = run_cli(*DIVERGING, run_dir=tmp_path)
    assert result.returncode == 3 and "Traceback" not in result.stderr
    assert "is not finite for seed 0 at env step 4,096" in result.stderr and "nan_policy" in result.stderr
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["2048"]  # from before the learner started
    _, state = _final_state(tmp_path)
    assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(state) if np.issubdtype(leaf.dtype, np.floating))


def test_nan_policy_warn_only_logs(tmp_path):
    result = run_cli(*DIVERGING, "nan_policy=warn", run_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "is not finite for seed 0" in result.stderr and "(nan_policy=warn)" in result.stderr


def test_sigkill_while_a_checkpoint_is_written_resumes_from_the_one_before(tmp_path, uninterrupted):
    overrides = DQN_BIG_REPLAY
    reference, killed = uninterrupted("dqn_big_replay"), tmp_path / "killed"

    process = _start(killed, overrides, {})
    checkpoints, deadline, caught = killed / "checkpoints", time.time() + 180, None
    while time.time() < deadline and process.poll() is None and caught is None:
        if checkpoints.exists():
            finished = [p for p in checkpoints.iterdir() if p.name.isdigit()]
            writing = [p for p in checkpoints.iterdir() if "tmp" in p.name]
            caught = writing[0].name if finished and writing else None
        time.sleep(0.005)
    assert caught is not None, "never saw a checkpoint being written"
    process.send_signal(signal.SIGKILL)
    process.wait()

    result = run_cli(*overrides, "resume=true", run_dir=killed)
    assert result.returncode == 0, result.stderr
    assert deterministic_metrics(killed) == deterministic_metrics(reference)
    (_, state_a), (_, state_b) = _final_state(reference), _final_state(killed)
    for a, b in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_checkpoint_of_the_flat_layout_is_refused_in_one_paragraph():
    """Before framework/ was laid out by shape, a checkpoint's JSON was the driver's own progress dict."""
    from lightspeed.framework.core.errors import ConfigError
    from lightspeed.framework.run.loop import PROGRESS_LAYOUT, Progress
    from lightspeed.framework.run.protocol import EvaluationHistory

    flat = {"chunk": 3, "env_steps": 15360, "train_seconds": 4.2, "metrics_lines": 3, "history": {}}
    with pytest.raises(ConfigError) as refused:
        Progress.from_saved(flat, 15360)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("Invalid config: resume=True")
    assert "env step 15,360 was written by an earlier lightspeed" in message and "start a new run" in message
    saved = Progress(env_steps=7, evaluations=2, chunks=1).saved(EvaluationHistory(2, None, 3), {"inserts": 5})
    assert saved["layout"] == PROGRESS_LAYOUT and saved["counters"] == {"inserts": 5}
    assert Progress.from_saved(json.loads(json.dumps(saved)), 7) == Progress(env_steps=7, evaluations=2, chunks=1)
