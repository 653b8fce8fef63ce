"""Built-in environments; importing this package registers them."""
from typing import Any

from envs import atari_env, cartpole, gridworld, gymnasium_env, gymnax_env  # noqa: F401  (registration; gymnax, ale-py load when built)
from framework.core import registry


def make(name: str, **overrides: Any) -> tuple[Any, Any]:
    """(env, env_params) of a registered environment, config `overrides` validated."""
    config = registry.build_config("env", name, overrides)
    return registry.lookup("env", name).factory(config)
