"""The run loop both drivers share (the single program's chunks, the host runtime's reports): resume, the log record
and its line, periodic evaluations with the best policies they find, checkpoints, and the results a run ends with.

A driver owns only what its shape does between two records (a chunk of updates, or a learner's report) and how it
evaluates a policy; everything it writes goes through a `RunLoop`:

    loop = RunLoop(train, cfg, run_dir, env, algorithm, seconds, sweep_group, checkpointer, best, writer)
    state, counters = loop.resume(state)            # a resumed run: its checkpoint (else the state as given)
    with loop.logging():
        record = loop.record(env_steps, metrics, rate)
        loop.evaluated(record, returns, policies)    # where an evaluation was due
        loop.log(record)
        loop.checkpoint(env_steps, state, counters)  # where one was due
    summary = loop.summarize(final_returns, best_returns, compile_seconds, num_devices, interrupted_by)
    loop.write_results(summary, final_policies, best_policies)
"""
import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
from omegaconf import OmegaConf

from lightspeed.framework.core.algorithm import Algorithm
from lightspeed.framework.core.config import TrainConfig
from lightspeed.framework.core.errors import ConfigError
from lightspeed.framework.run.checkpoint import CHECKPOINT_DIR, Checkpointer
from lightspeed.framework.run.common import (
    format_line,
    format_outputs,
    format_result,
    keep_first_lines,
    learning_curve_title,
    summarize,
)
from lightspeed.framework.run.loggers import Loggers, make_loggers
from lightspeed.framework.run.plots import plot_learning_curve
from lightspeed.framework.run.policy import save_policies
from lightspeed.framework.run.progress import print_line
from lightspeed.framework.run.protocol import BestPolicies, EvaluationHistory, seed_results

# the layout of what a checkpoint keeps beside the device state; 2: Progress, since framework/ was laid out by shape;
# 3: the state of an algorithm written as parts (framework/anakin/compose.py), with actor states and keys in `act`;
# 4: learners that say when they are ready (their state counts what filled them), the host limiter's start with them
PROGRESS_LAYOUT = 4


@dataclasses.dataclass
class Progress:
    """Where a run stands: what its log lines and summary count and, with the evaluation history and the host
    runtime's counters, what a checkpoint keeps beside the device state (a resumed run continues from it)."""

    env_steps: int = 0  # one seed's env steps so far, all of its envs together
    train_seconds: float = 0.0  # seconds spent training, compilation excluded, summed over resumes
    metrics_lines: int = 0  # lines of metrics.jsonl: a resumed run drops those written after its checkpoint
    evaluations: int = 0  # periodic evaluations so far (the host runtime numbers its evaluation seeds by it)
    chunks: int = 0  # the single program's chunks done: the next chunk's index (it numbers evaluation keys)

    def saved(self, history: EvaluationHistory, counters: Optional[dict] = None) -> dict:
        """The checkpoint's JSON: this progress, the history and the runtime's counters, with the layout."""
        return {"layout": PROGRESS_LAYOUT, "progress": dataclasses.asdict(self), "history": history.to_dict(),
                "counters": counters}

    @staticmethod
    def from_saved(saved: dict, step: int) -> "Progress":
        """The progress of a checkpoint's JSON; one of an older layout is refused in one paragraph."""
        if saved.get("layout") != PROGRESS_LAYOUT:
            raise ConfigError("resume", True, f"a run dir whose checkpoints this version wrote (layout "
                              f"{PROGRESS_LAYOUT})", f"the checkpoint at env step {step:,} was written by an earlier "
                              "lightspeed (before framework/ was laid out by shape), whose progress this version "
                              "does not read; finish that run with the version that started it, or start a new run")
        return Progress(**saved["progress"])


class RunLoop:
    """One run's bookkeeping around its driver: history, best policies, progress, loggers and checkpoints. Only the
    `writer` (the first process of a multi-process run) writes files and log lines."""

    def __init__(self, train: TrainConfig, cfg: Any, run_dir: Path, env: Any, algorithm: Algorithm,
                 seconds: Callable[[], float], sweep_group: Optional[str], checkpointer: Optional[Checkpointer],
                 best: BestPolicies, writer: bool = True, env_params: Any = None):
        self.train, self.cfg, self.run_dir, self.env, self.algorithm = train, cfg, run_dir, env, algorithm
        self.env_params = env_params  # a JAX env's (its spaces may depend on them); None: a host env's
        self.seconds, self.sweep_group, self.checkpointer, self.writer = seconds, sweep_group, checkpointer, writer
        self.history = EvaluationHistory(train.num_seeds, train.target_return, train.solve_window)
        self.best, self.progress = best, Progress()
        # with a target, each seed's run ends where it is solved, with its best policy so far (early stopping that
        # restores the best weights); the seeds of one program train on until all are solved, drawing the curve
        self.ended = BestPolicies(best.policies, best.seed_axis)
        self.loggers = Loggers([])
        self.summary: Optional[dict] = None  # what the loggers close with

    @property
    def latest_eval(self) -> Optional[float]:
        return float(np.mean(self.history.returns[-1])) if self.history.returns else None

    def resume(self, template: Any) -> tuple[Any, Optional[dict]]:
        """The newest checkpoint's device state (shaped like `template`) and runtime counters, its history,
        progress and best policies taken in; a run that does not resume gets `template` back."""
        if not self.train.resume:
            return template, None
        step = self.checkpointer.latest_step()
        state, policies, saved = self.checkpointer.restore_latest(template, self.kept_policies())
        self.best.policies, self.ended.policies = policies["best"], policies["ended"]
        self.progress = Progress.from_saved(saved, step)
        self.history.load(saved["history"])
        if self.writer:
            print_line(f"resumed at {step:,} env steps of {self.train.total_env_steps:,}, from "
                       f"{self.run_dir / CHECKPOINT_DIR / str(step)}")
        return state, saved["counters"]

    @contextlib.contextmanager
    def logging(self) -> Iterator[None]:
        """The loggers open (metrics.jsonl cut back to the checkpoint's lines), closed with the summary."""
        if self.writer:
            keep_first_lines(self.run_dir / "metrics.jsonl", self.progress.metrics_lines)
            self.loggers = make_loggers(self.train.logger, self.run_dir,
                                        OmegaConf.to_container(self.cfg, resolve=True), self.sweep_group)
        try:
            yield
        finally:
            self.loggers.close(self.summary)

    def solved(self) -> Optional[str]:
        """"3/10": seeds solved so far (None without a target)."""
        if self.train.target_return is None:
            return None
        return f"{sum(at is not None for at in self.history.solved_at_env_steps)}/{self.train.num_seeds}"

    def record(self, env_steps: int, metrics: dict, rate: float) -> dict:
        """A log record: env steps, wall seconds, speed and the mean over seeds of each metric."""
        return {"env_steps": env_steps, "perf/wall_seconds": self.seconds(), "perf/env_steps_per_second": rate,
                **{name: float(np.mean(value)) for name, value in metrics.items()}}

    def evaluated(self, record: dict, returns: np.ndarray, policies: Callable[[], Any]) -> None:
        """A periodic evaluation's mean return per seed [S] into the history and `record`; the seeds it improved
        keep `policies()` (host arrays, laid out as the best policies) as their best."""
        solved_before = self.solved_seeds()
        improved = self.history.record(record["env_steps"], returns, self.seconds())
        newly_solved = self.solved_seeds() & ~solved_before
        if improved.any():
            self.best.keep(improved, policies())
        self.ended.keep(newly_solved, self.best.policies)
        self.progress.evaluations += 1
        record.update({"eval/return": float(returns.mean()), "eval/return_per_seed": returns.tolist()})

    def solved_seeds(self) -> np.ndarray:
        return np.array([at is not None for at in self.history.solved_at_env_steps])

    def final_policies(self, policies: Any) -> Any:
        """Each seed's result: its policy where it was solved (with a target), else `policies`, the policies the
        run ends with (host arrays, laid out as the best policies)."""
        ended = BestPolicies(policies, self.best.seed_axis)
        ended.keep(self.solved_seeds(), self.ended.policies)
        return ended.policies

    def kept_policies(self) -> dict:
        """What a checkpoint keeps of the host-side policies: the best and the solved ones."""
        return {"best": self.best.policies, "ended": self.ended.policies}

    def log(self, record: dict) -> None:
        """The record to every logger, and its line to the terminal."""
        self.loggers.log(record)
        self.progress.metrics_lines += 1
        if self.writer:
            print_line(format_line(record, self.solved(), self.algorithm.headline_metrics,
                                   self.algorithm.learner_steps))

    def checkpoint(self, env_steps: int, state: Any, counters: Optional[dict] = None) -> None:
        """A checkpoint of the device state, this loop's progress and history, the runtime's counters and the best
        policies (a run that keeps none still takes one when a signal stops it)."""
        if self.checkpointer is None:
            self.checkpointer = Checkpointer(self.run_dir, self.train.checkpoint.keep)
        self.checkpointer.save(env_steps, state, self.progress.saved(self.history, counters), self.kept_policies())

    def summarize(self, final_returns: np.ndarray, best_returns: np.ndarray, compile_seconds: float,
                  num_devices: int, interrupted_by: Optional[str]) -> dict:
        """summary.json's content: the final evaluation of every seed's final and best policy."""
        self.summary = summarize(seed_results(self.history, final_returns, best_returns),
                                 dataclasses.asdict(self.progress), compile_seconds, self.seconds(), self.train,
                                 num_devices, interrupted_by)
        return self.summary

    def write_results(self, summary: dict, final_policies: Any, best_policies: Any) -> None:
        """summary.json, each seed's final and best policy, the learning curve, and the run's closing lines."""
        if not self.writer:
            return
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        for which, policies in (("final", final_policies), ("best", best_policies)):
            save_policies(self.run_dir, which, policies, self.train, self.env, self.env_params, self.algorithm)
        if self.history.env_steps:  # a run stopped before its first evaluation has no curve
            plot_learning_curve(self.history.env_steps, np.array(self.history.returns),
                                self.run_dir / "learning_curve.png", self.train.target_return,
                                learning_curve_title(self.train.algo.name, self.env))

    def closing_lines(self, summary: dict) -> None:
        if self.writer:
            for line in (format_result(summary), *format_outputs(self.run_dir)):
                print_line(line)

    def close(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.close()
