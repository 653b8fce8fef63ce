"""Name -> factory registries for environments and algorithms, extended by entry points.

Third-party packages add their own with entry points in the groups `lightspeed.envs` and
`lightspeed.algorithms`; each entry point names a module (or object) whose import registers.
"""
import dataclasses
import importlib
import numbers
from importlib.metadata import entry_points
from typing import Any, Callable, Optional

import jax

from lightspeed.framework.core.algorithm import check_fields
from lightspeed.framework.core.errors import ConfigError, PluginError, check
from lightspeed.framework.core.spaces import BOX, DISCRETE, Box, Discrete

ENTRY_POINT_GROUPS = {"env": "lightspeed.envs", "algo": "lightspeed.algorithms"}
BUILTIN_MODULES = {"env": ("lightspeed.envs",), "algo": ("lightspeed.algorithms",)}


# What observations are, for an algorithm to say what it consumes and an env what it gives: "vector"
# features [D], "image" [H, W, C], "cell" grid indices (tabular agents). Networks take the first two.
NETWORK_INPUTS = ("vector", "image")


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    factory: Callable[..., Any]
    config_class: type
    # envs: the values of the config's `observation` key and the kind each gives (None: no choice)
    encodings: Optional[dict[str, str]] = None
    # algorithms: the observation kinds it consumes, and the action space kinds it acts in
    consumes: tuple[str, ...] = NETWORK_INPUTS
    acts: tuple[str, ...] = (DISCRETE,)
    # envs stepped on the host in Python (framework/sebulba/trainer.py), not in JAX
    host: bool = False


_REGISTRIES: dict[str, dict[str, Entry]] = {"env": {}, "algo": {}}
_loaded = False


def _register(kind: str, name: str, config_class: type, **declared: Any) -> Callable:
    def decorator(factory: Callable) -> Callable:
        _REGISTRIES[kind][name] = Entry(name, factory, config_class, **declared)
        return factory

    return decorator


def register_env(name: str, config: type, encodings: Optional[dict[str, str]] = None, host: bool = False) -> Callable:
    """Decorate `factory(config) -> (env, env_params)`; `config` is its dataclass schema; `host`: the env is
    stepped in Python by actor threads (it has the spaces of framework/core/env.py's Environment, not its JAX step).

    `encodings`: an env that can encode its observations several ways names them (its config's
    `observation` key) with the kind each gives; `observation: null` lets the algorithm choose.
    Otherwise the kind follows the observation's rank: [D] vector, [H, W, C] image.
    """
    return _register("env", name, config, encodings=encodings, host=host)


def register_algorithm(name: str, config: type, consumes: tuple[str, ...] = NETWORK_INPUTS,
                       acts: tuple[str, ...] = (DISCRETE,)) -> Callable:
    """Decorate `factory(config, env, env_params) -> Algorithm`; `config` is its schema, `consumes`
    the observation kinds it takes, `acts` the action space kinds it acts in ("discrete", "box")."""
    unknown = set(acts) - {DISCRETE, BOX}
    if unknown or not acts:
        raise PluginError("algorithm", name, f"acts={acts!r}", f"a non-empty tuple of {DISCRETE!r} and {BOX!r}")
    return _register("algo", name, config, consumes=consumes, acts=tuple(acts))


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
            raise ConfigError(f"{kind}.{key}", overrides[key],
                              f"keys of {kind}={name}: {', '.join(sorted(allowed_keys))}", "unknown key")
    config = config_class(**overrides)
    config.validate()
    return config


def observation_kind(env: Any) -> str:
    """What the env's observations are: its own `observation_kind`, else by rank."""
    return getattr(env, "observation_kind", None) or ("image" if len(env.observation_shape) == 3 else "vector")


def with_encoding(env_config: Any, algo: Entry) -> Any:
    """The env config with the observation encoding the algorithm consumes (chosen when it is null)."""
    encodings = lookup("env", env_config.name).encodings
    if not encodings:
        return env_config
    usable = [encoding for encoding, kind in encodings.items() if kind in algo.consumes]
    wants = f"algo={algo.name} consumes {' or '.join(algo.consumes)} observations"
    if env_config.observation is None:
        if not usable:
            raise ConfigError("env", env_config.name, f"an env whose observations algo={algo.name} consumes",
                              f"{wants}; env={env_config.name} gives {', '.join(sorted(set(encodings.values())))}")
        return dataclasses.replace(env_config, observation=usable[0])
    check(env_config.observation in usable, "env.observation", env_config.observation,
          f"{' or '.join(usable) if usable else 'none of ' + ', '.join(encodings)}, "
          "or null to let the algorithm choose",
          f"{wants}; {env_config.observation} gives {encodings.get(env_config.observation)}")
    return env_config


def declared_spaces(name: str, env: Any, env_params: Any) -> tuple[Any, Any]:
    """The env's (observation space, action space), each a Discrete or a Box whose shape agrees with
    `observation_shape` (else a PluginError)."""
    declared = getattr(env, "observation_shape", None)
    is_count = lambda value: isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1
    if not (isinstance(declared, (tuple, list)) and all(is_count(size) for size in declared)):
        raise PluginError("env", name, f"observation_shape={declared!r}", "a tuple of positive ints, e.g. (4,)")
    try:
        actions, observations = env.action_space(env_params), env.observation_space(env_params)
    except NotImplementedError as error:
        raise PluginError("env", name, str(error), "num_actions (discrete actions) or action_space(params)") from None
    for what, space in (("action_space", actions), ("observation_space", observations)):
        if not isinstance(space, (Discrete, Box)):
            raise PluginError("env", name, f"{what}(params) returned {space!r}",
                              "a framework.core.spaces.Discrete or Box")
    if isinstance(observations, Box) and observations.shape != tuple(declared):
        raise PluginError("env", name, f"observation_space(params) has shape {observations.shape} where "
                          f"observation_shape declares {tuple(declared)}", "the two the same")
    return observations, actions


def check_env(name: str, env: Any, env_params: Any) -> tuple[Any, Any]:
    """An env's declared spaces and `observation_shape` against what its `reset_env` returns (traced only,
    nothing runs): an algorithm sizes its network and replay from the declared ones. The declared spaces."""
    spaces = declared_spaces(name, env, env_params)
    declared = env.observation_shape
    obs, _ = jax.eval_shape(lambda: env.reset_env(jax.random.key(0), env_params))
    if tuple(obs.shape) != tuple(declared):
        raise PluginError("env", name, f"reset_env returns observations of shape {tuple(obs.shape)} where "
                          f"observation_shape declares {declared}", "the two the same: one observation, unbatched")
    return spaces


def build(env_config: Any, algo_config: Any) -> tuple[Any, Any, Any]:
    """(env, env_params, algorithm) from validated env and algo configs (may raise ConfigError, or
    PluginError when the env or the algorithm breaks its contract)."""
    algo = lookup("algo", algo_config.name)
    entry = lookup("env", env_config.name)
    env, env_params = entry.factory(with_encoding(env_config, algo))
    # a host env has no JAX reset to trace (its checks ran when it was built): its spaces alone
    _, actions = (declared_spaces if entry.host else check_env)(env_config.name, env, env_params)
    check(actions.kind in algo.acts, "env", env_config.name, f"an env whose actions are {' or '.join(algo.acts)}",
          f"{env.name}'s actions are {actions.describe()}, and algo={algo.name} acts in {' or '.join(algo.acts)} "
          "action spaces only")
    kind = observation_kind(env)
    check(kind in algo.consumes, "env", env_config.name, f"an env whose observations are {' or '.join(algo.consumes)}",
          f"algo={algo.name} cannot take its {kind} observations of shape {list(env.observation_shape)}")
    algorithm = algo.factory(algo_config, env, env_params)
    check_fields(algo.name, algorithm)
    return env, env_params, algorithm
