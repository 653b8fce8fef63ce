"""lightspeed's framework, one sub-package per room:

    core/      the contracts (algorithm, env, host env, registry, config, errors, keys, devices): imports nothing
               else of the project
    run/       what every run does whatever its shape: run dir, protocol, logging, checkpoints, policies
    anakin/    the single-program shape: a JAX env and the update compiled into one program per chunk
    sebulba/   the actors-and-learner shape: host envs on actor threads, or Ray actor processes (sebulba/ray/)
    tools/     evaluate and report, over finished runs
    app/       the command line: run.py and the `lightspeed` command

Modules of the old flat layout (`framework.algorithm`, `framework.env`, `framework.registry`, ...) still import,
as the module that replaced them, with a DeprecationWarning naming the new path.
"""
import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import CodeType, ModuleType
from typing import Optional

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


class _MovedModule(importlib.abc.Loader):
    """Loads an old module name as the module that replaced it (the same object, so state is shared)."""

    def __init__(self, new_name: str):
        self.new_name = new_name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{spec.name} moved to {self.new_name}: import it from there", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(self.new_name)
        self.new_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.new_spec  # the import machinery set the old name's spec on it: undo that

    def get_code(self, name: str) -> Optional[CodeType]:
        """The new module's code: `python -m framework.evaluate` runs framework.tools.evaluate."""
        return importlib.util.find_spec(self.new_name).loader.get_code(self.new_name)


class _MovedModules(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> Optional[importlib.machinery.ModuleSpec]:
        new_name = MOVED.get(fullname)
        if new_name is None:
            return None
        # the new module's file as origin: `python -m` puts it in sys.argv[0] (None there broke JAX's cache key)
        origin = importlib.util.find_spec(new_name).origin
        return importlib.util.spec_from_loader(fullname, _MovedModule(new_name), origin=origin)


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
