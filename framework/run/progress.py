"""A rich progress bar with env steps, steps/s and the latest evaluation return; the run's printed lines, also
kept in its run dir's run.log."""
import contextlib
import logging
import sys
from pathlib import Path
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class ProgressBar:
    """Drawn on a terminal only, so logs of batch jobs stay clean."""

    def __init__(self, total_env_steps: int, enabled: bool):
        console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]env steps"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[rate]} steps/s"), TextColumn("eval {task.fields[eval_return]}"),
            TimeElapsedColumn(), console=console, disable=not (enabled and console.is_terminal),
        )
        self.task = self.progress.add_task("train", total=total_env_steps, rate="-", eval_return="-")

    def __enter__(self) -> "ProgressBar":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def update(self, env_steps: int, steps_per_second: float, eval_return: float | None) -> None:
        fields = {"rate": f"{steps_per_second:,.0f}"}
        if eval_return is not None:
            fields["eval_return"] = f"{eval_return:.2f}"
        self.progress.update(self.task, completed=env_steps, **fields)


RUN_LOG = logging.getLogger("lightspeed.run")
RUN_LOG.setLevel(logging.INFO)
RUN_LOG.propagate = False  # the root logger's handlers (Hydra's console one) would print every line twice


class RunLogFile(logging.FileHandler):
    """run.log, opened at the first line (a run called from Python makes its run dir after it starts)."""

    def __init__(self, path: Path):
        super().__init__(path, mode="a", encoding="utf-8", delay=True)

    def _open(self):
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


@contextlib.contextmanager
def run_log(run_dir: Path) -> Iterator[None]:
    """While the run lasts, every printed line is appended to run_dir/run.log too, as it was printed."""
    handler = RunLogFile(run_dir / "run.log")
    RUN_LOG.addHandler(handler)
    try:
        yield
    finally:
        RUN_LOG.removeHandler(handler)
        handler.close()


def print_line(text: str) -> None:
    print(text, file=sys.stdout, flush=True)
    RUN_LOG.info(text)
