"""Every optional extra of pyproject.toml installs (the CI step before) and its packages import."""
import importlib
import importlib.metadata
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

IMPORT_NAMES = {"stable-baselines3": "stable_baselines3", "hydra-optuna-sweeper": "hydra_plugins.hydra_optuna_sweeper",
                "tensorboardX": "tensorboardX", "lightspeed": "lightspeed", "pytest-xdist": "xdist",
                "opencv-python-headless": "cv2", "mkdocs-material": "material",
                "griffelib": "griffe"}


def requirements(extra: str, extras: dict) -> list[Requirement]:
    """The extra's requirements, an extra made of other extras (`lightspeed[a,b]`) expanded."""
    found = []
    for requirement in map(Requirement, extras[extra]):
        if requirement.name == "lightspeed" and requirement.extras:
            found += [inner for nested in sorted(requirement.extras) for inner in requirements(nested, extras)]
        else:
            found.append(requirement)
    return found


def missing_extra_requirements(requirement: Requirement) -> list[str]:
    """What a package's own extras (`ray[client]`) need and this environment lacks: importing the package
    does not show it (plain `ray` imports without grpcio, and its head then refuses a client server port)."""
    missing = []
    for dependency in map(Requirement, importlib.metadata.requires(requirement.name) or []):
        marker = dependency.marker
        needed = marker is not None and any(marker.evaluate({"extra": e}) for e in requirement.extras)
        if needed and not marker.evaluate({"extra": ""}):
            try:
                importlib.metadata.version(dependency.name)
            except importlib.metadata.PackageNotFoundError:
                missing.append(f"{dependency.name} (for {requirement})")
    return missing


def main() -> int:
    extras = tomllib.loads(Path("pyproject.toml").read_text())["project"]["optional-dependencies"]
    failed = []
    for extra in extras:
        for requirement in requirements(extra, extras):
            name = requirement.name
            module = IMPORT_NAMES.get(name, name.replace("-", "_").lower())
            try:
                importlib.import_module(module)
                print(f"[{extra}] {name} {importlib.metadata.version(name)}: import {module} ok")
            except Exception as error:  # report every broken one, then fail
                failed.append(f"[{extra}] {name}: import {module} failed: {type(error).__name__}: {error}")
            failed += [f"[{extra}] {lack} is not installed" for lack in missing_extra_requirements(requirement)]
    print("\n".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
