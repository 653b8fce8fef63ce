"""Built-in environments; importing this package registers them."""
from typing import Any

from lightspeed.envs import atari_env, cartpole, gridworld, gymnasium_env, gymnax_env  # noqa: F401  (registration; gymnax, ale-py load when built)
from lightspeed.framework.core import registry


def make(name: str, **overrides: Any) -> tuple[Any, Any]:
    """(env, env_params) of a registered environment, config `overrides` validated."""
    config = registry.build_config("env", name, overrides)
    return registry.lookup("env", name).factory(config)

if __name__ == "envs":  # its old top-level name, from a source checkout: lightspeed's module, not a
    # second copy (what ran above, in the module given up, imported lightspeed's own)
    from lightspeed._old_names import become_lightspeeds

    become_lightspeeds(__name__)
