"""Where log events go: metrics.jsonl always, the console line, and optionally W&B or TensorBoard."""
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Optional

from lightspeed.framework.core.config import LoggerConfig


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

    def close(self, summary: Optional[dict] = None) -> None:
        self.file.close()


def _wandb_init(config: LoggerConfig, run_dir: Path, resolved_config: dict, group: Optional[str], mode: str):
    import wandb

    algo, env = resolved_config["algo"]["name"], resolved_config["env"]["name"]
    return wandb.init(
        project=config.project, entity=config.entity, group=config.group or group, tags=[algo, env],
        name=f"{algo}-{env}-seed{resolved_config['seed']}", dir=str(run_dir), config=resolved_config, mode=mode,
        reinit="finish_previous", settings=wandb.Settings(init_timeout=config.init_timeout, silent=True),
    )


class WandbLogger:
    """A W&B run per job, tagged with its algo and env; offline without an API key or a network."""

    def __init__(self, config: LoggerConfig, run_dir: Path, resolved_config: dict, group: Optional[str]):
        mode = config.mode
        if mode == "auto":
            mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
        try:
            self.run = _wandb_init(config, run_dir, resolved_config, group, mode)
        except Exception as error:  # no network or a rejected key must not cost the run
            if mode != "online":
                raise
            print(f"warning: W&B online init failed ({str(error).splitlines()[0]}); logging offline instead",
                  file=sys.stderr)
            mode = "offline"
            self.run = _wandb_init(config, run_dir, resolved_config, group, mode)
        self.offline = mode == "offline"

    def log(self, record: dict[str, Any]) -> None:
        scalars = {k: _jsonable(v) for k, v in record.items() if not isinstance(v, (list, tuple))}
        self.run.log(scalars, step=int(record["env_steps"]))

    def close(self, summary: Optional[dict] = None) -> None:
        if summary is not None:
            self.run.summary.update(final_summary(summary))
        run_files = Path(self.run.dir).parent  # wandb/offline-run-<time>-<id>
        self.run.finish()
        if self.offline:
            print(f"W&B run saved offline in {run_files}; upload it with: wandb sync {run_files}", file=sys.stderr)


def final_summary(summary: dict) -> dict:
    """The run's result in a few scalars for W&B's run table."""
    seeds = summary["seeds"]
    solved = [s["solved_at_env_steps"] for s in seeds if s["solved_at_env_steps"] is not None]
    return {"final/eval_return": sum(s["final_eval_return"] for s in seeds) / len(seeds),
            "final/fraction_solved": len(solved) / len(seeds),
            "final/env_steps": summary["env_steps"], "final/env_steps_per_second": summary["env_steps_per_second"],
            "final/compile_seconds": summary["compile_seconds"], "final/wall_seconds": summary["wall_seconds"]}


class TensorBoardLogger:
    """Scalars as TensorBoard event files in <run dir>/tensorboard (`tensorboard --logdir <run dir>`)."""

    def __init__(self, run_dir: Path):
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, record: dict[str, Any]) -> None:
        for name, value in record.items():
            value = _jsonable(value)
            if name != "env_steps" and isinstance(value, (int, float)):
                self.writer.add_scalar(name, value, global_step=int(record["env_steps"]))
        self.writer.flush()

    def close(self, summary: Optional[dict] = None) -> None:
        if summary is not None:
            for name, value in final_summary(summary).items():
                self.writer.add_scalar(name, value, global_step=int(summary["env_steps"]))
        self.writer.close()


class Loggers:
    """Fan one record out to every configured sink."""

    def __init__(self, sinks: list):
        self.sinks = sinks

    def log(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.log(record)

    def close(self, summary: Optional[dict] = None) -> None:
        for sink in self.sinks:
            sink.close(summary)


def make_loggers(config: LoggerConfig, run_dir: Path, resolved_config: dict, group: Optional[str] = None) -> Loggers:
    sinks: list = [JsonlLogger(run_dir / "metrics.jsonl")]
    if config.wandb:
        sinks.append(WandbLogger(config, run_dir, resolved_config, group))
    if config.tensorboard:
        sinks.append(TensorBoardLogger(run_dir))
    return Loggers(sinks)
