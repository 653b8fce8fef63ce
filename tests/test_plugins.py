"""Registry lookups, and a plugin package outside this repository running through run.py."""
import dataclasses
import json
import textwrap

import pytest
from conftest import compose_config, run_cli

from framework import registry
from framework.config import validated
from framework.errors import ConfigError

PLUGIN_MODULE = '''
"""A third-party package: a corridor env and a random-walk algorithm, registered by entry points."""
import dataclasses
import jax
import jax.numpy as jnp
from flax import struct
from framework.algorithm import Algorithm
from framework.env import Environment
from framework.errors import check_positive_int
from framework.registry import register_algorithm, register_env


@dataclasses.dataclass
class CorridorConfig:
    name: str = "corridor"
    length: int = 5

    def validate(self):
        check_positive_int("env.length", self.length, minimum=2)


@struct.dataclass
class CorridorParams:
    length: int = 5


class Corridor(Environment):
    name = "corridor"
    stochastic_transitions = False
    num_actions = 2
    observation_shape = (1,)
    default_params = CorridorParams()

    def max_episode_steps(self, params):
        return 4 * params.length

    def reset_env(self, key, params):
        return jnp.zeros(1, jnp.float32), jnp.int32(0)

    def step_env(self, key, position, action, params):
        position = jnp.clip(position + 2 * action - 1, 0, params.length)
        terminated = position == params.length
        return position.astype(jnp.float32)[None], position, terminated.astype(jnp.float32), terminated, jnp.bool_(False), {}


@register_env("corridor", config=CorridorConfig)
def make_corridor(config):
    params = CorridorParams(config.length)
    return Corridor(), params


@dataclasses.dataclass
class RightwardConfig:
    name: str = "rightward"
    num_envs: int = 3

    def validate(self):
        check_positive_int("algo.num_envs", self.num_envs)


@register_algorithm("rightward", config=RightwardConfig)
def make_rightward(config, env, env_params):
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def init(key):
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, config.num_envs), env_params)
        return state, key

    def update(carry):
        state, key = carry
        key, step_key = jax.random.split(key)
        actions = jnp.ones(config.num_envs, jnp.int32)
        _, state, reward, *_ = step(jax.random.split(step_key, config.num_envs), state, actions, env_params)
        return (state, key), {"train/reward": reward.mean()}

    def policy(carry):
        return jnp.ones((), jnp.int32)  # the action it always takes

    def act(action, obs, key):
        return jnp.full(obs.shape[0], action, jnp.int32)

    return Algorithm(init, update, policy, act, env_steps_per_update=config.num_envs)
'''


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    """A package installed only through a dist-info entry on PYTHONPATH, as pip would leave it."""
    site = tmp_path_factory.mktemp("site")
    (site / "corridor_plugin.py").write_text(PLUGIN_MODULE)
    dist_info = site / "corridor_plugin-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: corridor-plugin\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text(textwrap.dedent("""\
        [lightspeed.envs]
        corridor = corridor_plugin
        [lightspeed.algorithms]
        rightward = corridor_plugin
        """))
    return site


def test_plugin_runs_through_run_py(plugin_path, tmp_path):
    result = run_cli("algo=rightward", "env=corridor", "env.length=4", "total_env_steps=60", "log_every=30",
                     "eval_every=30", "eval_episodes=2", run_dir=tmp_path, env={"PYTHONPATH": str(plugin_path)})
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["seeds"][0]["final_eval_return"] == 1.0
    assert (tmp_path / "learning_curve.png").is_file()


def test_plugin_options_are_listed_and_checked(plugin_path, tmp_path):
    result = run_cli("algo=nope", run_dir=tmp_path, env={"PYTHONPATH": str(plugin_path)})
    assert result.returncode == 2 and "rightward" in result.stderr and "tabular_q" in result.stderr
    result = run_cli("algo=rightward", "env=corridor", "env.length=1", run_dir=tmp_path, env={"PYTHONPATH": str(plugin_path)})
    assert result.returncode == 2 and "env.length" in result.stderr and "Traceback" not in result.stderr


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ConfigError, match="cartpole, gridworld"):
        registry.lookup("env", "pong")
    with pytest.raises(ConfigError, match="tabular_q"):
        registry.lookup("algo", "ppo")


def test_envs_make_applies_and_checks_overrides():
    import envs

    env, params = envs.make("gridworld", height=4, width=5, start=[3, 4])
    assert env.grid_shape == (4, 5) and list(params.start) == [3, 4]
    with pytest.raises(ConfigError, match="env.colour"):
        envs.make("gridworld", colour="red")


@pytest.mark.parametrize("algo", ["apex", "dqn", "tabular_q"])
def test_an_algorithms_config_class_defaults_to_what_its_yaml_runs(algo):
    """`make_apex(ApexConfig(), ...)` from Python builds the algorithm `algo=apex` runs (no env-specific layer)."""
    ran = validated(compose_config(f"algo={algo}", "env=gridworld", "~algo_env")).algo
    defaults = registry.lookup("algo", algo).config_class()
    differing = [(f.name, getattr(ran, f.name), getattr(defaults, f.name)) for f in dataclasses.fields(ran)
                 if getattr(ran, f.name) != getattr(defaults, f.name)]
    assert not differing, differing  # (key, the yaml's value, the class's)
