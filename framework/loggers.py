"""Where log events go: metrics.jsonl always, the console line, and optionally W&B."""
import json
import math
import os
from pathlib import Path
from typing import Any, Optional

from framework.config import LoggerConfig


def _jsonable(value: Any) -> Any:
    """Plain Python numbers for JSON; non-finite floats become null (JSON has no NaN)."""
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class JsonlLogger:
    """One JSON object per log event, appended and flushed so a killed run keeps its lines."""

    def __init__(self, path: Path):
        self.file = open(path, "a", encoding="utf-8")

    def log(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps({k: _jsonable(v) for k, v in record.items()}) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class WandbLogger:
    """A W&B run per job; offline without an API key so it never waits on a network."""

    def __init__(self, config: LoggerConfig, run_dir: Path, resolved_config: dict, group: Optional[str]):
        import wandb

        mode = config.mode
        if mode == "auto":
            mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
        self.run = wandb.init(
            project=config.project, entity=config.entity, group=config.group or group,
            dir=str(run_dir), config=resolved_config, mode=mode, reinit="finish_previous",
            settings=wandb.Settings(init_timeout=60, silent=True),
        )

    def log(self, record: dict[str, Any]) -> None:
        scalars = {k: _jsonable(v) for k, v in record.items() if not isinstance(v, (list, tuple))}
        self.run.log(scalars, step=int(record["env_steps"]))

    def close(self) -> None:
        self.run.finish()


class Loggers:
    """Fan one record out to every configured sink."""

    def __init__(self, sinks: list):
        self.sinks = sinks

    def log(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.log(record)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def make_loggers(config: LoggerConfig, run_dir: Path, resolved_config: dict, group: Optional[str] = None) -> Loggers:
    sinks: list = [JsonlLogger(run_dir / "metrics.jsonl")]
    if config.wandb:
        sinks.append(WandbLogger(config, run_dir, resolved_config, group))
    return Loggers(sinks)
