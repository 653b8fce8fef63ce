"""What the two drivers share (framework/anakin/trainer.py's single program, framework/sebulba/trainer.py's actors and
learner): the run dir, Ctrl-C and SIGTERM, the log line, the summary, the run's closing lines."""
import os
import shlex
import shutil
import signal
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np
from omegaconf import DictConfig, OmegaConf

from lightspeed.framework.core.config import TrainConfig
from lightspeed.framework.core.devices import is_writer
from lightspeed.framework.core.errors import ConfigError, check_writable_dir
from lightspeed.framework.run.checkpoint import CHECKPOINT_DIR, Checkpointer, check_resumable, refuse_to_overwrite
from lightspeed.framework.run.protocol import SOLVE_RULE


def rate_name(counter: str) -> str:
    """"learner/updates" -> "perf/learner_updates_per_second"."""
    return f"perf/{counter.replace('/', '_')}_per_second"


def format_line(record: dict, solved: Optional[str], headline_metrics: tuple[tuple[str, str], ...] = (),
                learner_steps: Optional[str] = None) -> str:
    """One log line: env steps, speed, the evaluation across seeds, how many are solved, and the few metrics
    the algorithm names as its headline, as (metric, label) pairs (the rest goes to metrics.jsonl). While the
    `learner_steps` metric is still 0, a learner's metric that has no value yet reads "not started", not NaN."""
    parts = [f"{record['env_steps']:>11,} env steps", f"{record['perf/env_steps_per_second']:>10,.0f} steps/s"]
    if "eval/return" in record:
        per_seed = record["eval/return_per_seed"]
        spread = f" (min {min(per_seed):.4g}, max {max(per_seed):.4g})" if len(per_seed) > 1 else ""
        parts.append(f"eval {record['eval/return']:.4g}{spread}")
    if solved is not None:
        parts.append(f"solved {solved}")
    not_started = learner_steps is not None and record.get(learner_steps) == 0
    parts += [f"{label} {headline_value(record[key], not_started)}" for key, label in headline_metrics if key in record]
    return "  ".join(parts)


def headline_value(value: Optional[float], not_started: bool) -> str:
    """A metric as the log line shows it; one with no value yet (null in metrics.jsonl, or NaN) before the
    learner's first update is "not started": after it, a NaN is a NaN."""
    value = float("nan") if value is None else value
    return "not started" if not_started and value != value else f"{value:.4g}"


def summarize(seeds: list[dict], progress: dict, compile_seconds: float, wall_seconds: float, train_cfg: TrainConfig,
              num_devices: int, interrupted_by: Optional[str]) -> dict:
    """summary.json: the final evaluation per seed and over seeds, the solve rule, the run's speed
    (measured after compilation)."""
    env_steps, train_seconds = progress["env_steps"], progress["train_seconds"]
    num_seeds = len(seeds)
    return {
        "interrupted": interrupted_by is not None,  # stopped by a signal before its last chunk
        "interrupted_by": interrupted_by,  # "SIGINT" (Ctrl-C), "SIGTERM" or null
        "final_eval_return": float(np.mean([seed["final_eval_return"] for seed in seeds])),
        "final_eval_episodes": train_cfg.final_eval_episodes,
        "target_return": train_cfg.target_return,
        "solve_window": train_cfg.solve_window,
        "solve_rule": SOLVE_RULE,
        "solved_seeds": sum(seed["solved_at_env_steps"] is not None for seed in seeds),
        "seeds": seeds,
        "env_steps": env_steps,
        "env_steps_per_second": num_seeds * env_steps / max(train_seconds, 1e-9),
        "env_steps_per_second_per_seed": env_steps / max(train_seconds, 1e-9),
        "compile_seconds": compile_seconds,
        "wall_seconds": wall_seconds,
        "num_devices": num_devices,
    }


def format_result(summary: dict) -> str:
    """The run's last line: what it ends with, over its seeds."""
    finals = [seed["final_eval_return"] for seed in summary["seeds"]]
    spread = f" (min {min(finals):.4g}, max {max(finals):.4g} over {len(finals)} seeds)" if len(finals) > 1 else ""
    solved = (f"; solved {summary['solved_seeds']}/{len(finals)} ({summary['solve_window']} evaluations in a row "
              f">= {summary['target_return']:g})" if summary["target_return"] is not None else "")
    return (f"final greedy return {summary['final_eval_return']:.4g}{spread} over {summary['final_eval_episodes']} "
            f"episodes per seed{solved}")


# what a run dir holds, the most wanted first (anything else it holds is listed after these)
OUTPUTS_FIRST = ("summary.json", "learning_curve.png", "policies", "q_values.png", "q_table.npy", "metrics.jsonl",
                 "config.yaml", "checkpoints")


def shown_path(path: Path) -> str:
    """`path` relative to the working directory when it lies under it (Hydra's outputs/...), else absolute."""
    path = path.absolute()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def format_outputs(run_dir: Path) -> list[str]:
    """The run's closing lines after its result: where its outputs are, what they are, how to play its policies."""
    entries = {entry.name: entry for entry in run_dir.iterdir() if not entry.name.startswith(".")}
    order = [name for name in OUTPUTS_FIRST if name in entries] + sorted(set(entries) - set(OUTPUTS_FIRST))
    notes = {"summary.json": " (the result)"}
    listed = ", ".join(name + ("/" if entries[name].is_dir() else "") + notes.get(name, "") for name in order)
    where = shown_path(run_dir)
    return [f"outputs in {where}: {listed}",
            f"play the saved policies: python -m lightspeed.framework.tools.evaluate {shlex.quote(where)}"]


def learning_curve_title(algo_name: str, env: Any) -> str:
    """"dqn on CartPole-v1": the env as built (a gymnax or MinAtar env names its id), not its config group."""
    return f"{algo_name} on {env.name}"


STOP_SIGNALS = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


class StopRequest:
    """Ctrl-C (SIGINT) or SIGTERM (what SLURM and Kubernetes send before stopping a job) asks the loop
    to stop after the running chunk, with a checkpoint and a summary; `signal` names the first one."""

    def __init__(self):
        self.signal: Optional[signal.Signals] = None

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def _handle(self, signum, frame) -> None:
        if self.requested:  # a second signal stops at once, in one line (no traceback through the training loop)
            print(f"{STOP_SIGNALS[signal.Signals(signum)]} again: aborted at once, without a checkpoint of this chunk "
                  "(checkpoints are written atomically: the last one written is whole)", file=sys.stderr, flush=True)
            os._exit(128 + signum)  # the shell's status for a signal's default action: 130 for Ctrl-C
        self.signal = signal.Signals(signum)
        print(f"{STOP_SIGNALS[self.signal]}: finishing this chunk, then a checkpoint and the summary "
              f"({STOP_SIGNALS[self.signal]} again to abort)", file=sys.stderr, flush=True)

    def __enter__(self) -> "StopRequest":
        self.previous = {signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def keep_first_lines(path: Path, count: int) -> None:
    """Keep the first `count` lines of a log (if it exists)."""
    if path.exists():
        lines = path.read_text().splitlines(keepends=True)[:count]
        path.write_text("".join(lines))


def open_run_dir(train_cfg: TrainConfig, cfg: DictConfig, run_dir: Path) -> Optional[Checkpointer]:
    """Check the run dir against resume, write the resolved config; the checkpointer, if the run keeps any."""
    check_writable_dir(run_dir)
    keeps = train_cfg.checkpoint.every or train_cfg.resume
    looked_in_new_folder = not (run_dir / CHECKPOINT_DIR).exists()
    checkpointer = Checkpointer(run_dir, train_cfg.checkpoint.keep) if keeps else None
    if train_cfg.resume and checkpointer.latest_step() is None:
        if looked_in_new_folder:  # the checkpointer made it: a refused run leaves no folder
            shutil.rmtree(run_dir / CHECKPOINT_DIR, ignore_errors=True)
        raise ConfigError("resume", True, "a run dir (hydra.run.dir) that holds a checkpoint",
                          f"none in {run_dir / CHECKPOINT_DIR}")
    if train_cfg.resume:
        check_resumable(run_dir, cfg)
    if not train_cfg.resume:
        refuse_to_overwrite(run_dir)
    if is_writer():
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    return checkpointer
