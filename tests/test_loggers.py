"""W&B logging works without network or API key, and metrics.jsonl stays valid JSON."""
import json
import math

import pytest
from conftest import run_cli

from lightspeed.framework.run.loggers import JsonlLogger, final_summary


def test_wandb_logger_goes_offline_without_an_api_key(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    result = run_cli("logger=wandb", "algo=tabular_q", "env=gridworld", "algo.num_agents=2", "algo.steps_per_update=10",
                     "total_env_steps=200", "log_every=100", "eval_every=100", "eval_episodes=2", run_dir=tmp_path,
                     timeout=180)
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "wandb").glob("offline-run-*")), "no offline W&B run was written"
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
    assert "wandb sync " + str(tmp_path / "wandb" / "offline-run-") in result.stderr


def test_wandb_online_without_network_falls_back_to_offline(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    fake_key = {"WANDB_API_KEY": "0" * 40}  # a key, but nothing reachable to check it with
    result = run_cli("logger=wandb", "logger.mode=online", "logger.init_timeout=5", "algo=tabular_q", "env=gridworld",
                     "algo.num_agents=2", "algo.steps_per_update=10", "total_env_steps=200", "log_every=100",
                     "eval_every=100", "eval_episodes=2", run_dir=tmp_path, env=fake_key, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "W&B online init failed" in result.stderr and "logging offline instead" in result.stderr
    assert "Traceback" not in result.stderr
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_final_summary_for_the_wandb_run_table():
    summary = {"seeds": [{"final_eval_return": 500.0, "solved_at_env_steps": 1000},
                         {"final_eval_return": 100.0, "solved_at_env_steps": None}],
               "env_steps": 2000, "env_steps_per_second": 5e4, "compile_seconds": 3.0, "wall_seconds": 9.0}
    final = final_summary(summary)
    assert final["final/eval_return"] == 300.0 and final["final/fraction_solved"] == 0.5
    assert final["final/env_steps"] == 2000 and final["final/wall_seconds"] == 9.0


def test_jsonl_writes_non_finite_values_as_null(tmp_path):
    logger = JsonlLogger(tmp_path / "metrics.jsonl")
    logger.log({"env_steps": 1, "train/loss": math.nan, "eval/return_per_seed": [1.0, math.inf]})
    logger.close()
    record = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert record == {"env_steps": 1, "train/loss": None, "eval/return_per_seed": [1.0, None]}



def _tensorboard_scalars(directory):
    """(tag, step, value) of every scalar in the TFRecord event files, read without TensorBoard."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    scalars = []
    for path in sorted(directory.glob("events.out.tfevents.*")):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = Event.FromString(data[offset + 12: offset + 12 + length])  # skip length and its crc
            offset += 12 + length + 4
            scalars += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
    return scalars


def test_tensorboard_logger_writes_the_metrics(tmp_path):
    result = run_cli("logger=tensorboard", "algo=tabular_q", "env=gridworld", "algo.num_agents=2",
                     "algo.steps_per_update=10", "total_env_steps=200", "log_every=100", "eval_every=100",
                     "eval_episodes=2", run_dir=tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr
    scalars = _tensorboard_scalars(tmp_path / "tensorboard")
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = {(tag, step): value for tag, step, value in scalars}
    for record in records:
        assert logged[("eval/return", record["env_steps"])] == pytest.approx(record["eval/return"])
        assert logged[("train/episode_return", record["env_steps"])] == pytest.approx(record["train/episode_return"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    finals = [value for tag, _, value in scalars if tag == "final/eval_return"]
    assert finals == [pytest.approx(summary["final_eval_return"])]
