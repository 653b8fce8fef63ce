"""Every optional extra of pyproject.toml installs (the CI step before) and its packages import."""
import importlib
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

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
            names.append(requirement)
    return names


def missing_extra_requirements(requirement: str) -> list[str]:
    """What a package's own extras (`ray[client]`) need and this environment lacks: importing the package
    does not show it (plain `ray` imports without grpcio, and its head then refuses a client server port)."""
    name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
    nested = re.search(r"\[(.*)\]", requirement)
    wanted = {extra.strip() for extra in nested.group(1).split(",")} if nested else set()
    missing = []
    for dependency in map(Requirement, importlib.metadata.requires(name) or []):
        needed = dependency.marker is not None and any(dependency.marker.evaluate({"extra": e}) for e in wanted)
        if needed and not dependency.marker.evaluate({"extra": ""}):
            try:
                importlib.metadata.version(dependency.name)
            except importlib.metadata.PackageNotFoundError:
                missing.append(f"{dependency.name} (for {name}[{','.join(sorted(wanted))}])")
    return missing


def main() -> int:
    extras = tomllib.loads(Path("pyproject.toml").read_text())["project"]["optional-dependencies"]
    failed = []
    for extra in extras:
        for requirement in requirement_names(extra, extras):
            name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
            module = IMPORT_NAMES.get(name, name.replace("-", "_").lower())
            try:
                importlib.import_module(module)
                print(f"[{extra}] {name} {importlib.metadata.version(name)}: import {module} ok")
            except Exception as error:  # report every broken one, then fail
                failed.append(f"[{extra}] {name}: import {module} failed: {type(error).__name__}: {error}")
            lacking = missing_extra_requirements(requirement)
            failed += [f"[{extra}] {requirement}: {lack} is not installed" for lack in lacking]
    print("\n".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
