"""`lightspeed.train(...)`: a run from Python, with the command line's composition, checks and run dir, returning
what it ended with (lightspeed/__init__.py re-exports it)."""
import dataclasses
import re
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

from lightspeed.framework.app.cli import (
    check_group_choices,
    composed,
    untuned_settings,
    with_open_keys_added,
)
from lightspeed.framework.core.config import register_schemas
from lightspeed.framework.core.errors import ConfigError, PluginError, check, check_writable_dir


@dataclasses.dataclass(frozen=True)
class Run:
    """A finished (or stopped) run: its dir and what summary.json holds."""

    run_dir: Path
    summary: dict

    @property
    def final_return(self) -> float:
        """The mean over seeds of the final greedy evaluation."""
        return self.summary["final_eval_return"]

    @property
    def final_returns(self) -> list[float]:
        """Each seed's final greedy evaluation, seed 0 first."""
        return [seed["final_eval_return"] for seed in self.summary["seeds"]]

    @property
    def interrupted(self) -> bool:
        """Stopped by Ctrl-C or SIGTERM: a checkpoint is in run_dir; train(..., resume=True, run_dir=...) goes on."""
        return self.summary["interrupted"]

    def policy(self, seed_index: int = 0, which: str = "final") -> Any:
        """One seed's saved greedy policy as a function of observations (lightspeed.load_policy)."""
        from lightspeed.framework.run.policy import load_policy

        return load_policy(self.run_dir, seed_index, which)

    def evaluate(self, episodes: int = 100, which: str = "final", seed: Optional[int] = None) -> np.ndarray:
        """Every seed's greedy returns [seeds, episodes] (lightspeed.evaluate)."""
        from lightspeed.framework.tools.evaluate import evaluate

        return evaluate(self.run_dir, episodes, which, seed)


# a value Hydra's override grammar reads back as itself without quotes
PLAIN_VALUE = re.compile(r"[A-Za-z0-9_./:+-]+")


def override_value(value: Any) -> str:
    """`value` in Hydra's override grammar: true/false, null, numbers, quoted strings, [lists] and {dicts}."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float, np.integer, np.floating)):
        return repr(value.item() if isinstance(value, np.generic) else value)
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        if PLAIN_VALUE.fullmatch(value) and value.lower() not in ("true", "false", "null", "none"):
            return value
        # Hydra's quoted strings: a backslash escapes only the quote or the backslashes before a quote or the end
        escaped = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value)
        return "'" + escaped + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(override_value, value)) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{override_value(item)}" for key, item in value.items()) + "}"
    raise ConfigError("a setting", repr(value), "a bool, None, number, string, list or dict",
                      f"a {type(value).__name__} cannot be written as a config value")


def as_overrides(algo: str, env: str, settings: dict[str, Any]) -> list[str]:
    """The command line a run of these settings is: `algo=... env=... key=value ...`. A dotted name sets a nested
    key (`**{"algo.learning_rate": 1e-3}`); a dict for a key of the config sets its keys one by one."""
    overrides = [f"algo={algo}", f"env={env}"]
    for key, value in settings.items():
        if key == "algo_env" and value is None:  # the tuned settings left out, as ~algo_env does
            overrides.append("~algo_env")
        elif isinstance(value, dict) and key not in ("env.kwargs", "ray.actor_resources", "env.params"):
            overrides += as_overrides_of(key, value)
        else:
            overrides.append(f"{key}={override_value(value)}")
    return overrides


def as_overrides_of(prefix: str, values: dict[str, Any]) -> list[str]:
    return [item for key, value in values.items()
            for item in (as_overrides_of(f"{prefix}.{key}", value) if isinstance(value, dict)
                         else [f"{prefix}.{key}={override_value(value)}"])]


def new_run_dir() -> Path:
    """Hydra's default layout, outputs/<date>/<time> under the working folder, made unique within the second."""
    base = Path("outputs") / time.strftime("%Y-%m-%d") / time.strftime("%H-%M-%S")
    candidate, number = base, 0
    while candidate.exists():
        number += 1
        candidate = base.with_name(f"{base.name}-{number}")
    return candidate


def train(algo: str = "apex", env: str = "cartpole", run_dir: Optional[Path | str] = None, **settings: Any) -> Run:
    """Train `algo` on `env` as `python run.py algo=ALGO env=ENV key=value ...` does: the same config groups
    (conf/algo_env's tuned settings included), checks and outputs, in `run_dir` (default: `outputs/<date>/<time>`).

        run = lightspeed.train("ppo", "cartpole", num_seeds=10, total_env_steps=200_000)
        run = lightspeed.train("dqn", "gymnasium", **{"env.id": "Acrobot-v1", "algo.learning_rate": 1e-3})

    Bad input raises lightspeed.ConfigError (one paragraph naming the key and what is allowed) before anything
    compiles, and leaves no run dir; `algo_env=None` leaves conf/algo_env's settings out (as ~algo_env does);
    a Ctrl-C ends the run with a checkpoint (Run.interrupted). Returns the Run.
    """
    from lightspeed.framework.app.main import remove_refused_run_dir
    from lightspeed.framework.app.train import train as train_composed

    launch_time = time.time()
    check(isinstance(algo, str) and isinstance(env, str), "algo/env", (algo, env), "option names, as strings")
    overrides = with_open_keys_added(as_overrides(algo, env, settings))
    if settings.get("resume") is True:
        check(run_dir is not None, "resume", True, "resume=True with run_dir= the dir of the run to continue",
              "a new run dir holds no checkpoint")
    run_dir = Path(run_dir) if run_dir is not None else new_run_dir()
    existed = first_existing(run_dir)
    try:
        register_schemas()
        check_group_choices(overrides)
        check_writable_dir(run_dir, "run_dir")
        cfg, choices = composed(overrides)
        if note := untuned_settings(cfg, choices, overrides):  # tuned for other env ids: left out, as the CLI does
            overrides.append("~algo_env")
            cfg, choices = composed(overrides)
        summary = train_composed(cfg, run_dir, launch_time, None, choices.get("algo_env"), note)
    except (ConfigError, PluginError):
        remove_refused_run_dir(run_dir)
        remove_empty_dirs(run_dir, existed)
        raise
    return Run(run_dir, summary)


def first_existing(path: Path) -> Path:
    """`path` or its nearest ancestor that exists."""
    return next(folder for folder in (path, *path.parents) if folder.exists())


def remove_empty_dirs(path: Path, keep: Path) -> None:
    """The empty folders from `path` up to `keep` (not included): what checking a refused run's dir made."""
    for folder in (path, *path.parents):
        if folder == keep or not folder.is_relative_to(keep):
            return
        try:
            folder.rmdir()
        except OSError:  # not empty, or gone already
            if folder.exists():
                return
