"""Entry point: `python run.py algo=tabular_q env=gridworld num_seeds=4` (Hydra overrides)."""
import time

LAUNCH_TIME = time.time()  # before the heavy imports, so solve times count them

import gc  # noqa: E402

# Imports, config composition and tracing allocate objects that live all run; the collector's
# scans of them cost ~0.3 s of startup. The trainer freezes them and re-enables it once compiled.
gc.disable()

import logging  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from framework.cli import preflight  # noqa: E402
from framework.config import register_schemas  # noqa: E402
from framework.errors import ConfigError, HostRunError, PluginError, TrainingDiverged  # noqa: E402

register_schemas()
sys.argv[1:] = preflight(sys.argv[1:])  # Hydra reads sys.argv itself


# the shell's 128 + signal number: what the signal's default action would have given
STOP_EXIT_STATUS = {"SIGINT": 130, "SIGTERM": 143}


class JobFailed(RuntimeError):
    """One job of a multirun that stopped with a config or plugin error (already reported on stderr)."""


def stopped_message(summary: dict, hydra_cfg: Any, multirun: bool) -> str:
    """What stopped the run, what it left and the command that continues it."""
    run_dir = hydra_cfg.runtime.output_dir
    overrides = [o for o in hydra_cfg.overrides.task if not o.startswith(("resume=", "hydra.run.dir="))]
    command = shlex.join(["python", "run.py", *overrides, "resume=true", f"hydra.run.dir={run_dir}"])
    what = "Ctrl-C" if summary["interrupted_by"] == "SIGINT" else summary["interrupted_by"]
    sweep = f"; job {hydra_cfg.job.num} of the sweep, whose later jobs did not run" if multirun else ""
    return (f"stopped by {what} after {summary['env_steps']:,} env steps{sweep}. A checkpoint and summary.json "
            f"(\"interrupted\": true) are in {run_dir}; continue with resume=true: {command}")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    from framework.trainer import train

    for noisy in ("jax", "absl"):  # Hydra sets the root logger to INFO
        logging.getLogger(noisy).setLevel(logging.WARNING)
    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode.name == "MULTIRUN"
    sweep_group = hydra_cfg.job.name + "-" + Path(hydra_cfg.sweep.dir).name if multirun else None
    try:
        summary = train(cfg, Path(hydra_cfg.runtime.output_dir), LAUNCH_TIME, sweep_group)
    except (ConfigError, PluginError) as error:  # bad input, or a plugin's bug: found before compiling
        print(error, file=sys.stderr)
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


if __name__ == "__main__":
    main()
