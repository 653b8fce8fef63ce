"""The errors a run reports as one paragraph on stderr, without a traceback: ConfigError (a bad config
value, exit status 2), PluginError (an env or algorithm that breaks the framework's contract, exit status
2), TrainingDiverged (a non-finite loss or Q-value, exit status 3) and HostRunError (a host env or an actor or
learner thread failed, exit status 4)."""
import importlib.util
import tempfile
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A config value that cannot be used; names the key, the value and what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str, reason: str = ""):
        self.key, self.value, self.allowed = key, value, allowed
        because = f" ({reason})" if reason else ""
        super().__init__(f"Invalid config: {key}={value!r}{because}. Allowed: {allowed}.")


def check(condition: bool, key: str, value: Any, allowed: str, reason: str = "") -> None:
    """Raise a ConfigError for `key` unless `condition` holds."""
    if not condition:
        raise ConfigError(key, value, allowed, reason)


def install_hint(extra: str) -> str:
    """How a user installs one of the project's extras, wherever they stand (not only in the repository)."""
    return f'pip install "lightspeed[{extra}]"'


def check_installed(module: str, extra: str, key: str, value: Any) -> None:
    """A one-paragraph ConfigError naming the extra to install unless `module` can be imported."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module blocked with sys.modules[name] = None
        found = False
    check(found, key, value, f"an option whose dependencies are installed: {install_hint(extra)}",
          f"{module} is not installed")


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
            and abs(value) != float("inf"))


def check_number(key: str, value: Any, low: float | None = None, high: float | None = None,
                 low_inclusive: bool = True, high_inclusive: bool = True) -> None:
    """A finite number inside [low, high] (bounds optional, open or closed)."""
    lo = "" if low is None else f"{'>=' if low_inclusive else '>'} {low}"
    hi = "" if high is None else f"{'<=' if high_inclusive else '<'} {high}"
    allowed = "a finite number" + (f" {lo}" if lo else "") + (" and" if lo and hi else "") + (f" {hi}" if hi else "")
    check(_is_number(value), key, value, allowed)
    if low is not None:
        check(value >= low if low_inclusive else value > low, key, value, allowed)
    if high is not None:
        check(value <= high if high_inclusive else value < high, key, value, allowed)


def check_positive_int(key: str, value: Any, minimum: int = 1) -> None:
    """An integer >= minimum."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
    check(ok, key, value, f"an integer >= {minimum}")


def check_choice(key: str, value: Any, choices: tuple) -> None:
    check(value in choices, key, value, f"one of {', '.join(map(str, choices))}")


def check_writable_dir(path: Path, key: str = "hydra.run.dir") -> None:
    """Fail before compiling when `path` cannot be created or written (read-only, full disk)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        # a probe of its own: processes checking one directory at once (a multi-process run) must not share one
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write_probe") as probe:
            probe.write(b"\0" * 4096)
            probe.flush()
    except OSError as error:
        raise ConfigError(key, str(path), "a writable directory with free space",
                          error.strerror or str(error)) from None


class TrainingDiverged(RuntimeError):
    """A loss or Q-value became non-finite; the message names the metric, the seed and the env step."""


class HostRunError(RuntimeError):
    """A host env or a thread of the actor-learner runtime failed and the run stopped; the message names the
    env id and the env step."""


class PluginError(Exception):
    """An env or algorithm (built in or a plugin) that breaks the framework's contract, found when it is built
    or traced, before anything compiles. Its author's bug, not the user's config, so not a ConfigError (whose
    "Invalid config: key=value" would send the user after a value they did not get wrong): the message
    names the plugin, the field or function, what it got and what the framework needs."""

    def __init__(self, kind: str, name: str, problem: str, allowed: str):
        self.kind, self.name = kind, name
        documented = {"algorithm": "framework/core/algorithm.py", "env": "framework/core/env.py"}[kind]
        super().__init__(f"The {kind} {name!r} breaks the framework's contract: {problem}. Allowed: {allowed}. "
                         f"This is a bug in the {kind}'s code, not in the config ({documented} documents the "
                         "contract).")
