"""The errors a run reports as one paragraph on stderr, without a traceback: ConfigError (a bad config
value, exit status 2) and TrainingDiverged (a non-finite loss or Q-value, exit status 3)."""
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


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf")


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
        probe = path / ".write_probe"
        probe.write_bytes(b"\0" * 4096)
        probe.unlink()
    except OSError as error:
        raise ConfigError(key, str(path), "a writable directory with free space", error.strerror or str(error)) from None


class TrainingDiverged(RuntimeError):
    """A loss or Q-value became non-finite; the message names the metric, the seed and the env step."""
