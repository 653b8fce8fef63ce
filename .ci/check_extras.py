"""Every optional extra of pyproject.toml installs (the CI step before) and its packages import."""
import importlib
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

IMPORT_NAMES = {"stable-baselines3": "stable_baselines3", "hydra-optuna-sweeper": "hydra_plugins.hydra_optuna_sweeper",
                "tensorboardX": "tensorboardX", "lightspeed": "framework", "pytest-xdist": "xdist",
                "opencv-python-headless": "cv2"}


def requirement_names(extra: str, extras: dict) -> list[str]:
    names = []
    for requirement in extras[extra]:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
        nested = re.search(r"\[(.*)\]", requirement)
        if name == "lightspeed" and nested:  # an extra made of other extras
            names += [n for inner in nested.group(1).split(",") for n in requirement_names(inner.strip(), extras)]
        else:
            names.append(name)
    return names


def main() -> int:
    extras = tomllib.loads(Path("pyproject.toml").read_text())["project"]["optional-dependencies"]
    failed = []
    for extra in extras:
        for name in requirement_names(extra, extras):
            module = IMPORT_NAMES.get(name, name.replace("-", "_").lower())
            try:
                importlib.import_module(module)
                print(f"[{extra}] {name} {importlib.metadata.version(name)}: import {module} ok")
            except Exception as error:  # report every broken one, then fail
                failed.append(f"[{extra}] {name}: import {module} failed: {type(error).__name__}: {error}")
    print("\n".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
