"""Registry lookups, and a plugin package outside this repository running through run.py."""
import dataclasses
import json
import textwrap

import pytest
from conftest import compose_config, run_cli

from lightspeed.framework.core import registry
from lightspeed.framework.core.config import validated
from lightspeed.framework.core.errors import ConfigError

PLUGIN_MODULE = '''
"""A third-party package: a corridor env and a random-walk algorithm, registered by entry points."""
import dataclasses
import jax
import jax.numpy as jnp
from flax import struct
from lightspeed.framework.core.algorithm import Algorithm
from lightspeed.framework.core.env import Environment
from lightspeed.framework.core.errors import check_positive_int
from lightspeed.framework.core.registry import register_algorithm, register_env


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
        reward = terminated.astype(jnp.float32)
        return position.astype(jnp.float32)[None], position, reward, terminated, jnp.bool_(False), {}


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

    def act(action, state, obs, start, key):
        return action, state

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
    result = run_cli("algo=rightward", "env=corridor", "env.length=1", run_dir=tmp_path,
                     env={"PYTHONPATH": str(plugin_path)})
    assert result.returncode == 2 and "env.length" in result.stderr and "Traceback" not in result.stderr


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ConfigError, match="cartpole, .*gridworld"):  # other tests' plugin envs may sit between
        registry.lookup("env", "pong")
    with pytest.raises(ConfigError, match="tabular_q"):
        registry.lookup("algo", "trpo")


def test_envs_make_applies_and_checks_overrides():
    from lightspeed import envs

    env, params = envs.make("gridworld", height=4, width=5, start=[3, 4])
    assert env.grid_shape == (4, 5) and list(params.start) == [3, 4]
    with pytest.raises(ConfigError, match="env.colour"):
        envs.make("gridworld", colour="red")


def own_keys(path) -> dict:
    """What a file in conf/ writes itself (its defaults list left out), interpolations unresolved."""
    from omegaconf import OmegaConf

    own = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    own.pop("defaults", None)
    return own


def is_interpolation(value) -> bool:
    return isinstance(value, str) and "${" in value


def repeated_keys(own: dict, beneath: dict, prefix: str = "") -> list[tuple[str, object]]:
    """The keys of `own` that only repeat the value beneath them (interpolations are never repeats)."""
    repeats = []
    for key, value in own.items():
        if is_interpolation(value):
            continue
        if isinstance(value, dict) and value and isinstance(beneath.get(key), dict):
            repeats += repeated_keys(value, beneath[key], f"{prefix}{key}.")
        elif key in beneath and value == beneath[key]:
            repeats.append((f"{prefix}{key}", value))
    return repeats


def dataclass_defaults(config_class: type) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(config_class), resolve=False)


RUN_KEYS = ("total_env_steps", "eval_every", "log_every", "eval_episodes", "final_eval_episodes")


@pytest.mark.parametrize("algo", ["apex", "dqn", "tabular_q"])
def test_an_algorithms_config_class_defaults_to_what_its_yaml_runs(algo):
    """The dataclass holds the defaults: conf/algo/<algo>.yaml sets only keys whose value differs from the
    dataclass's (or interpolations, such as apex's `lr_decay_env_steps: ${total_env_steps}`), and
    `algo=<algo>` runs the dataclass's defaults except those (`make_apex(ApexConfig(), ...)` from Python
    builds the algorithm `algo=apex` runs, up to the keys its YAML sets)."""
    from lightspeed.framework.core.config import CONF_DIR, TrainConfig

    config_class = registry.lookup("algo", algo).config_class
    own = own_keys(CONF_DIR / "algo" / f"{algo}.yaml")
    own_algo = own.pop("algo", {})
    assert not repeated_keys(own_algo, dataclass_defaults(config_class), "algo.")
    assert not repeated_keys(own, dataclass_defaults(TrainConfig))
    train = validated(compose_config(f"algo={algo}", "env=gridworld", "~algo_env"))
    ran, defaults = train.algo, config_class()
    differing = {f.name for f in dataclasses.fields(ran) if getattr(ran, f.name) != getattr(defaults, f.name)}
    assert differing <= set(own_algo), differing - set(own_algo)  # what the YAML does not set is the class's
    assert all(getattr(ran, key) == value for key, value in own_algo.items() if not is_interpolation(value))
    run_defaults = TrainConfig()
    differing = {key for key in RUN_KEYS if getattr(train, key) != getattr(run_defaults, key)}
    assert differing <= set(own) and all(getattr(train, key) == own[key] for key in own), (differing, own)


def conf_files(*groups: str) -> list:
    from lightspeed.framework.core.config import CONF_DIR

    return sorted(path for group in groups for path in (CONF_DIR / group).glob("*.yaml"))


def schema_class(path) -> type:
    """The dataclass a file in conf/ extends: the `<group>_<name>_schema` entry of its defaults list."""
    from omegaconf import OmegaConf

    from lightspeed.framework.core.config import DistributedConfig, LoggerConfig, TrainConfig

    entries = [entry for entry in OmegaConf.load(path).get("defaults", []) if isinstance(entry, str)]
    schema = next(entry for entry in entries if "_schema" in entry).lstrip("/").partition("@")[0]
    schema = schema.removesuffix("_schema")
    fixed = {"train": TrainConfig, "logger": LoggerConfig, "distributed": DistributedConfig}
    group, _, name = schema.partition("_")
    return fixed[schema] if schema in fixed else registry.lookup(group, name).config_class


@pytest.mark.parametrize("path", conf_files("env", "logger", "distributed"),
                         ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_a_group_option_sets_only_what_it_changes(path):
    """conf/<group>/<option>.yaml writes only keys whose value differs from its dataclass's (or interpolations),
    and the composed config holds the dataclass's defaults for every other key."""
    from omegaconf import OmegaConf

    config_class, own = schema_class(path), own_keys(path)
    defaults = dataclass_defaults(config_class)
    assert not repeated_keys(own, defaults), repeated_keys(own, defaults)
    group = path.parent.name
    composed = OmegaConf.to_container(compose_config(f"{group}={path.stem}")[group], resolve=True)
    differing = {key for key, value in composed.items() if value != defaults[key]}
    assert differing <= set(own), differing - set(own)


def test_the_top_level_config_sets_only_what_it_changes():
    from lightspeed.framework.core.config import CONF_DIR, TrainConfig

    assert schema_class(CONF_DIR / "config.yaml") is TrainConfig
    assert not repeated_keys(own_keys(CONF_DIR / "config.yaml"), dataclass_defaults(TrainConfig))


@pytest.mark.parametrize("path", conf_files("algo_env"), ids=lambda path: path.stem)
def test_an_algo_env_file_sets_only_what_it_changes(path):
    """conf/algo_env/<algo>_<env>.yaml writes only keys whose value differs from what lies beneath it: the
    algorithm's option (and the algo_env files it extends), or interpolations."""
    from omegaconf import OmegaConf

    algo = next(name for name in registry.known("algo") if path.stem.startswith(f"{name}_"))
    env = path.stem.removeprefix(f"{algo}_")
    beneath = OmegaConf.to_container(compose_config(f"algo={algo}", f"env={env}", "~algo_env"), resolve=False)
    for parent in OmegaConf.load(path).get("defaults", []):
        if parent != "_self_":
            beneath = OmegaConf.to_container(OmegaConf.merge(beneath, own_keys(path.parent / f"{parent}.yaml")))
    assert not repeated_keys(own_keys(path), beneath), repeated_keys(own_keys(path), beneath)


def test_help_lists_the_groups_a_user_chooses_and_how_to_see_every_key(plugin_path):
    """`python run.py --help`: the groups and their options (a plugin's too), no internal schema configs."""
    from lightspeed.framework.app.cli import group_options

    result = run_cli("--help", env={"PYTHONPATH": str(plugin_path)})
    assert result.returncode == 0, result.stderr
    assert "schema" not in result.stdout
    lines = result.stdout.splitlines()
    # algo and env by name: this process also holds the probes other test modules register
    for group in ("logger", "distributed", "sweep"):
        assert f"{group}: {', '.join(group_options(group))}" in lines, group
    assert "algo: apex, d4pg, dqn, ppo, r2d2, rightward, tabular_q" in lines
    assert "env: atari, cartpole, corridor, gridworld, gymnasium, gymnax, minatar" in lines
    assert "Chosen here: algo=apex env=cartpole logger=console distributed=auto." in result.stdout
    assert "--cfg job" in result.stdout and "Traceback" not in result.stderr
