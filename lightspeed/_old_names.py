"""The import names lightspeed had before it was installed under its own (`framework`, `algorithms`, `envs`), kept
for plugins that import them: each resolves to the module under `lightspeed.` (the same object, so registries and
classes are shared), with a DeprecationWarning, but only where no other package of that name is found first, so a
user's own `envs/` or `algorithms/` package always wins. The flat modules of the layout before `framework/` had a
room per shape (`framework.registry`, `framework.trainer`, ...) resolve to the module that replaced them."""
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from pathlib import Path
from types import CodeType, ModuleType
from typing import Optional

OLD_NAMES = ("framework", "algorithms", "envs")

# the flat layout's modules (before 2026-12) -> where each one lives now
MOVED = {
    "framework.algorithm": "framework.core.algorithm",
    "framework.env": "framework.core.env",
    "framework.errors": "framework.core.errors",
    "framework.registry": "framework.core.registry",
    "framework.config": "framework.core.config",
    "framework.parallel": "framework.core.devices",
    "framework.host_env": "framework.core.host_env",
    "framework.evaluation": "framework.core.evaluation",
    "framework.checkpoint": "framework.run.checkpoint",
    "framework.loggers": "framework.run.loggers",
    "framework.plots": "framework.run.plots",
    "framework.policy": "framework.run.policy",
    "framework.progress": "framework.run.progress",
    "framework.protocol": "framework.run.protocol",
    "framework.resources": "framework.run.resources",
    "framework.run_common": "framework.run.common",
    "framework.trainer": "framework.anakin.trainer",
    "framework.host_actor": "framework.sebulba.actor",
    "framework.host_trainer": "framework.sebulba.trainer",
    "framework.runtime": "framework.sebulba.runtime",
    "framework.ray_actors": "framework.sebulba.ray.actors",
    "framework.ray_cluster": "framework.sebulba.ray.cluster",
    "framework.ray_reaper": "framework.sebulba.ray.reaper",
    "framework.evaluate": "framework.tools.evaluate",
    "framework.report": "framework.tools.report",
    "framework.cli": "framework.app.cli",
}


def new_name(old: str) -> str:
    """lightspeed's module for an old import name."""
    return "lightspeed." + MOVED.get(old, old)


class _AsNewModule(importlib.abc.Loader):
    """Loads an old import name as the module that has it now (the same object, so state is shared)."""

    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{spec.name} moved to {self.new}: import it from there (or its public names from lightspeed)",
                      DeprecationWarning, stacklevel=2)
        module = importlib.import_module(self.new)
        self.new_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.new_spec  # the import machinery set the old name's spec on it: undo that

    def get_code(self, name: str) -> Optional[CodeType]:
        """The new module's code: `python -m framework.tools.evaluate` runs lightspeed's."""
        return importlib.util.find_spec(self.new).loader.get_code(self.new)


def is_lightspeeds(top: str, search_locations: Optional[list[str]]) -> bool:
    """Whether the package a search of sys.path found for `top` is lightspeed's own folder (a source checkout)."""
    own = importlib.util.find_spec(f"lightspeed.{top}").submodule_search_locations
    return {Path(p).resolve() for p in search_locations or ()} == {Path(p).resolve() for p in own}


class OldNames(importlib.abc.MetaPathFinder):
    """First on sys.meta_path: an old name is lightspeed's module unless sys.path holds another package of it."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> Optional[importlib.machinery.ModuleSpec]:
        top = fullname.partition(".")[0]
        if top not in OLD_NAMES:
            return None
        if fullname == top:
            found = importlib.machinery.PathFinder.find_spec(top)
            if found is not None and not is_lightspeeds(top, found.submodule_search_locations):
                return None  # the user's own package of that name
        elif sys.modules.get(top) is not sys.modules.get(f"lightspeed.{top}"):
            return None  # a submodule of the user's own package
        new = new_name(fullname)
        spec = importlib.util.find_spec(new)
        if spec is None:
            return None
        # the new module's file as origin: `python -m` puts it in sys.argv[0] (None there broke JAX's cache key)
        return importlib.util.spec_from_loader(fullname, _AsNewModule(new), origin=spec.origin,
                                               is_package=spec.submodule_search_locations is not None)


def install() -> None:
    if not any(isinstance(finder, OldNames) for finder in sys.meta_path):
        sys.meta_path.insert(0, OldNames())


def become_lightspeeds(name: str) -> None:
    """For a package of the source checkout imported by its old top-level name before lightspeed: make it the
    module lightspeed has under its own name instead of a second copy (its body must not run again)."""
    install()
    sys.modules[name] = importlib.import_module(new_name(name))
