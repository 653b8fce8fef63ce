"""The app behind `python run.py ...` and the `lightspeed ...` console script: checks the command line before
Hydra sees it, composes the config from conf/ (shipped with the package) and runs one job per composed config,
turning each kind of failure into its one paragraph and exit status."""
import logging
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any, Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from lightspeed.framework.app import cli
from lightspeed.framework.app.cli import HELP_FLAGS, help_text, preflight
from lightspeed.framework.core.config import CONF_DIR, register_schemas
from lightspeed.framework.core.errors import ConfigError, HostRunError, PluginError, TrainingDiverged

# the shell's 128 + signal number: what the signal's default action would have given
STOP_EXIT_STATUS = {"SIGINT": 130, "SIGTERM": 143}


class JobFailed(RuntimeError):
    """One job of a multirun that stopped with a config or plugin error (already reported on stderr)."""


def launcher() -> list[str]:
    """How this process was started, as a user would type it again: `python run.py` or `lightspeed`."""
    return ["python", "run.py"] if Path(sys.argv[0]).name == "run.py" else [Path(sys.argv[0]).name]


def stopped_message(summary: dict, hydra_cfg: Any, multirun: bool) -> str:
    """What stopped the run, what it left and the command that continues it."""
    run_dir = hydra_cfg.runtime.output_dir
    overrides = [o for o in hydra_cfg.overrides.task if not o.startswith(("resume=", "hydra.run.dir="))]
    command = shlex.join([*launcher(), *overrides, "resume=true", f"hydra.run.dir={run_dir}"])
    what = "Ctrl-C" if summary["interrupted_by"] == "SIGINT" else summary["interrupted_by"]
    sweep = f"; job {hydra_cfg.job.num} of the sweep, whose later jobs did not run" if multirun else ""
    return (f"stopped by {what} after {summary['env_steps']:,} env steps{sweep}. A checkpoint and summary.json "
            f"(\"interrupted\": true) are in {run_dir}; continue with resume=true: {command}")


# what a job's dir holds before training starts: Hydra's files, then the resolved config.yaml of the run dir's opening
STARTING_FILES = {".hydra", "run.log", "config.yaml"}


def remove_refused_run_dir(run_dir: Path) -> None:
    """A run refused before it started leaves no folder: its dir goes when it holds only what a run writes before
    training (a dir with anything else, a checkpoint to resume from say, stays), then the date folder of Hydra's
    default outputs/<date>/<time> layout and outputs/ itself once empty."""
    if not run_dir.is_dir() or not {entry.name for entry in run_dir.iterdir()} <= STARTING_FILES:
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    if run_dir.parent.parent.name == "outputs":
        for empty in (run_dir.parent, run_dir.parent.parent):
            try:
                empty.rmdir()
            except OSError:  # not empty: other runs live there
                return


LAUNCH_TIME: Optional[float] = None  # set by main(): when the process started, before its heavy imports


def run_job(cfg: DictConfig) -> float | None:
    """One Hydra job: train, report a failure as its paragraph and exit status, return the final return."""
    # JAX and the drivers: imported once the command line is known good
    from lightspeed.framework.app.train import train

    for noisy in ("jax", "absl"):  # Hydra sets the root logger to INFO
        logging.getLogger(noisy).setLevel(logging.WARNING)
    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode.name == "MULTIRUN"
    sweep_group = hydra_cfg.job.name + "-" + Path(hydra_cfg.sweep.dir).name if multirun else None
    try:
        summary = train(cfg, Path(hydra_cfg.runtime.output_dir), LAUNCH_TIME, sweep_group,
                        hydra_cfg.runtime.choices.get("algo_env"), cli.SETTINGS_NOTE)
    except (ConfigError, PluginError) as error:  # bad input, or a plugin's bug: found before compiling
        print(error, file=sys.stderr)
        remove_refused_run_dir(Path(hydra_cfg.runtime.output_dir))
        if multirun:  # Hydra records the failed job, runs the others and exits non-zero at the end
            reason = (f"the {error.kind} {error.name!r} is broken" if isinstance(error, PluginError)
                      else "invalid config")
            raise JobFailed(f"job {hydra_cfg.job.num} failed: {reason}") from None
        sys.exit(2)
    except TrainingDiverged as error:
        print(error, file=sys.stderr)
        if multirun:
            raise JobFailed(f"job {hydra_cfg.job.num} failed: training diverged") from None
        sys.exit(3)
    except HostRunError as error:
        print(error, file=sys.stderr)
        if multirun:
            raise JobFailed(f"job {hydra_cfg.job.num} failed: its host env or runtime failed") from None
        sys.exit(4)
    if summary["interrupted"]:
        print(stopped_message(summary, hydra_cfg, multirun), file=sys.stderr)
        # SystemExit passes through Hydra's launcher: under -m it stops the whole sweep
        sys.exit(STOP_EXIT_STATUS[summary["interrupted_by"]])
    return summary["final_eval_return"]  # the mean over seeds of the final evaluation: what sweepers optimise


def put_the_working_folder_on_the_path() -> None:
    """A project's own modules import from the folder the command runs in, as under `python -c` and `python -m`
    (`env.id=envs.my_env:My-v0`, a plugin's module): a console script's path starts at its bin/ folder instead.
    Last on the path, so a folder's files never shadow an installed package."""
    here = os.getcwd()
    if not any(entry in ("", here) for entry in sys.path):
        sys.path.append(here)


def main(launch_time: Optional[float] = None) -> None:
    """Check the command line, then hand it to Hydra (which reads sys.argv itself)."""
    global LAUNCH_TIME
    LAUNCH_TIME = launch_time
    put_the_working_folder_on_the_path()
    register_schemas()
    sys.argv[1:] = preflight(sys.argv[1:])
    if any(flag in sys.argv[1:] for flag in HELP_FLAGS):  # Hydra's own --help spends seconds listing its groups
        print(help_text(sys.argv[1:]))
        return
    hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")(run_job)()
