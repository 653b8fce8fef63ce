"""Name -> factory registries for environments and algorithms, extended by entry points.

Third-party packages add their own with entry points in the groups `lightspeed.envs` and
`lightspeed.algorithms`; each entry point names a module (or object) whose import registers.
"""
import dataclasses
import importlib
from importlib.metadata import entry_points
from typing import Any, Callable

from framework.errors import ConfigError

ENTRY_POINT_GROUPS = {"env": "lightspeed.envs", "algo": "lightspeed.algorithms"}
BUILTIN_MODULES = {"env": ("envs",), "algo": ("algorithms",)}


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    factory: Callable[..., Any]
    config_class: type


_REGISTRIES: dict[str, dict[str, Entry]] = {"env": {}, "algo": {}}
_loaded = False


def _register(kind: str, name: str, config_class: type) -> Callable:
    def decorator(factory: Callable) -> Callable:
        _REGISTRIES[kind][name] = Entry(name, factory, config_class)
        return factory

    return decorator


def register_env(name: str, config: type) -> Callable:
    """Decorate `factory(config) -> (env, env_params)`; `config` is its dataclass schema."""
    return _register("env", name, config)


def register_algorithm(name: str, config: type) -> Callable:
    """Decorate `factory(config, env, env_params) -> Algorithm`; `config` is its schema."""
    return _register("algo", name, config)


def load_plugins() -> None:
    """Import the built-in packages and every installed entry point, once."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for kind, modules in BUILTIN_MODULES.items():
        for module in modules:
            importlib.import_module(module)
        for entry_point in entry_points(group=ENTRY_POINT_GROUPS[kind]):
            entry_point.load()


def known(kind: str) -> list[str]:
    load_plugins()
    return sorted(_REGISTRIES[kind])


def lookup(kind: str, name: str) -> Entry:
    """The registered entry, or a ConfigError listing the known names."""
    load_plugins()
    if name not in _REGISTRIES[kind]:
        raise ConfigError(kind, name, f"one of {', '.join(known(kind))}", f"unknown {kind}")
    return _REGISTRIES[kind][name]


def build_config(kind: str, name: str, overrides: dict[str, Any]) -> Any:
    """The validated config dataclass of `name` with `overrides` applied."""
    config_class = lookup(kind, name).config_class
    allowed_keys = {f.name for f in dataclasses.fields(config_class)} - {"name"}
    for key in overrides:
        if key not in allowed_keys:
            raise ConfigError(f"{kind}.{key}", overrides[key], f"keys of {kind}={name}: {', '.join(sorted(allowed_keys))}", "unknown key")
    config = config_class(**overrides)
    config.validate()
    return config


def build(env_config: Any, algo_config: Any) -> tuple[Any, Any, Any]:
    """(env, env_params, algorithm) from validated env and algo configs (may raise ConfigError)."""
    env, env_params = lookup("env", env_config.name).factory(env_config)
    algorithm = lookup("algo", algo_config.name).factory(algo_config, env, env_params)
    return env, env_params, algorithm
