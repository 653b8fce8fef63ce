"""W&B logging works without network or API key, and metrics.jsonl stays valid JSON."""
import json
import math

from conftest import run_cli
from framework.loggers import JsonlLogger


def test_wandb_logger_goes_offline_without_an_api_key(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    result = run_cli("logger=wandb", "algo=tabular_q", "env=gridworld", "algo.num_agents=2", "algo.steps_per_update=10", "total_env_steps=200",
                     "log_every=100", "eval_every=100", "eval_episodes=2", run_dir=tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "wandb").glob("offline-run-*")), "no offline W&B run was written"
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


def test_jsonl_writes_non_finite_values_as_null(tmp_path):
    logger = JsonlLogger(tmp_path / "metrics.jsonl")
    logger.log({"env_steps": 1, "train/loss": math.nan, "eval/return_per_seed": [1.0, math.inf]})
    logger.close()
    record = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert record == {"env_steps": 1, "train/loss": None, "eval/return_per_seed": [1.0, None]}
