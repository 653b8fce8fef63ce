"""lightspeed: reinforcement learning on JAX, from a laptop CPU to many GPUs, in one jitted program per chunk.

    import lightspeed

    run = lightspeed.train("ppo", "cartpole", num_seeds=10)      # what `python run.py algo=ppo env=cartpole` does
    run.final_returns                                            # each seed's final greedy evaluation
    policy = lightspeed.load_policy(run.run_dir)                 # observation -> action, for your own loop
    returns = lightspeed.evaluate(run.run_dir, episodes=100)     # [seeds, episodes]

Plugins register with `@lightspeed.register_algorithm(...)` and `@lightspeed.register_env(...)` on the contract
types exported here (Algorithm, ActorLearner, ActorStep, Memory, Environment, HostEnvironment, Discrete, Box).

The repository's framework/, algorithms/, envs/ and conf/ are this package's `framework`, `algorithms`, `envs` and
`conf`: installed under lightspeed's own name, they leave a project's own `envs` or `algorithms` package alone.
The names below load on first use, so `import lightspeed` (and the `lightspeed` command) starts without JAX.
"""
import importlib
from pathlib import Path
from typing import Any

from lightspeed import _old_names

_CHECKOUT = Path(__file__).resolve().parent.parent
if not (Path(__file__).parent / "framework").is_dir() and (_CHECKOUT / "framework" / "__init__.py").is_file():
    __path__.append(str(_CHECKOUT))  # a source checkout: lightspeed.framework is the repository's framework/

_old_names.install()

# public name -> the module that defines it
_EXPORTS = {
    "train": "lightspeed.framework.app.api",
    "Run": "lightspeed.framework.app.api",
    "evaluate": "lightspeed.framework.tools.evaluate",
    "load_policy": "lightspeed.framework.run.policy",
    "LoadedPolicy": "lightspeed.framework.run.policy",
    "register_algorithm": "lightspeed.framework.core.registry",
    "register_env": "lightspeed.framework.core.registry",
    "Algorithm": "lightspeed.framework.core.algorithm",
    "ActorLearner": "lightspeed.framework.core.algorithm",
    "ActorStep": "lightspeed.framework.core.algorithm",
    "Memory": "lightspeed.framework.core.algorithm",
    "Environment": "lightspeed.framework.core.env",
    "HostEnvironment": "lightspeed.framework.core.host_env",
    "Discrete": "lightspeed.framework.core.spaces",
    "Box": "lightspeed.framework.core.spaces",
    "ConfigError": "lightspeed.framework.core.errors",
    "PluginError": "lightspeed.framework.core.errors",
    "TrainingDiverged": "lightspeed.framework.core.errors",
    "HostRunError": "lightspeed.framework.core.errors",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'lightspeed' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
