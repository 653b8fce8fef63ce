"""The env and algorithm contracts are checked where they are made: a plugin that breaks one gets a
one-paragraph PluginError naming it, the field and what is allowed, before anything compiles."""
import dataclasses
import json
import textwrap

import jax
import jax.numpy as jnp
import pytest
from conftest import compose_config, run_cli

from lightspeed import envs
from lightspeed.framework.app.train import train
from lightspeed.framework.core import registry
from lightspeed.framework.core.algorithm import Algorithm, check_fields
from lightspeed.framework.core.env import Environment
from lightspeed.framework.core.errors import PluginError
from lightspeed.framework.run.common import format_line


@dataclasses.dataclass
class ProbeConfig:
    name: str = "contract_probe"
    num_envs: int = 3

    def validate(self):
        pass


BROKEN: dict = {}  # the Algorithm fields the next build replaces, and the probe's update's metrics


@registry.register_algorithm("contract_probe", config=ProbeConfig)
def make_probe(config, env, env_params):
    """Always pushes right on every env; `BROKEN` breaks one part of it."""
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def init(key):
        _, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, config.num_envs), env_params)
        return state, key

    def update(carry):
        state, key = carry
        key, step_key = jax.random.split(key)
        actions = jnp.ones(config.num_envs, jnp.int32)
        _, state, reward, *_ = step(jax.random.split(step_key, config.num_envs), state, actions, env_params)
        metrics = {"train/reward": reward.mean(), "train/steps": jnp.float32(1.0)}
        if BROKEN.get("vector_metric"):
            metrics["train/reward_per_env"] = reward  # [num_envs], not a scalar
        return (state, key), metrics

    def act(policy, state, obs, start, key):
        action = jnp.int32(1)
        return (action[None] if BROKEN.get("act_column") else action), state

    algorithm = Algorithm(init, update, lambda carry: jnp.zeros(()), act, env_steps_per_update=config.num_envs)
    return algorithm._replace(**BROKEN.get("fields", {}))


@pytest.fixture
def broken():
    BROKEN.clear()
    yield BROKEN
    BROKEN.clear()


def build_probe():
    return registry.build(registry.build_config("env", "cartpole", {}), ProbeConfig())


@pytest.mark.parametrize("fields, named, allowed", [
    ({"health_metrics": ("train/reward",)}, "learner_steps=None", "learner_steps naming the metric"),
    ({"env_steps_per_update": 0}, "env_steps_per_update=0", "a positive integer"),
    ({"env_steps_per_update": 2.5}, "env_steps_per_update=2.5", "a positive integer"),
    ({"counters": "train/steps"}, "counters='train/steps'", "a tuple of metric names"),
    ({"headline_metrics": ("train/reward",)}, "headline_metrics=('train/reward',)", "a tuple of (metric, label) pairs"),
    ({"act": None}, "act=None", "a function"),
    ({"act": lambda policy, obs, key: obs}, "act takes fewer than 5 arguments (the contract before this release was "
     "act(policy, obs [E, ...], key)", "act(policy, policy_state, obs, start, key) -> (action, policy_state)"),
    ({"update": None}, "update=None", "functions, or all three None with actor_learner given"),
    ({"parallel_learners": "yes"}, "parallel_learners='yes'", "True or False"),
    ({"learner_steps": 7}, "learner_steps=7", "None or a metric name"),
])
def test_a_bad_field_is_named_when_the_algorithm_is_built(broken, fields, named, allowed):
    broken["fields"] = fields
    with pytest.raises(PluginError) as error:
        build_probe()
    message = str(error.value)
    assert message.startswith("The algorithm 'contract_probe' breaks the framework's contract: ")
    assert named in message and f"Allowed: {allowed}" in message and "not in the config" in message
    assert "\n" not in message


def test_the_factory_must_return_an_algorithm():
    with pytest.raises(PluginError, match="its factory returned a dict. Allowed: a framework.core.algorithm.Algorithm"):
        check_fields("contract_probe", {"init": None})


@pytest.fixture
def no_compiling(monkeypatch):
    """Any XLA compile fails the test: the contract must be checked before."""
    def refuse(*args, **kwargs):
        raise AssertionError("compiled before the contract was checked")

    monkeypatch.setattr(jax.stages.Lowered, "compile", refuse)


def train_probe(tmp_path):
    train(compose_config("algo=contract_probe", "env=cartpole", "total_env_steps=30", "eval_episodes=16",
                         "compilation_cache=null"),
          tmp_path)


@pytest.mark.parametrize("broken_part, named", [
    ({"fields": {"health_metrics": ("train/loss",), "learner_steps": "train/steps"}},
     "health_metrics names 'train/loss', which update and state_metrics do not return"),
    ({"fields": {"learner_steps": "learner/updates"}}, "learner_steps names 'learner/updates'"),
    ({"fields": {"counters": ("train/steps", "env/steps")}}, "counters names 'env/steps'"),
    ({"fields": {"headline_metrics": (("train/episode_return", "train return"),)}},
     "headline_metrics names 'train/episode_return'"),
    ({"vector_metric": True}, "the metric 'train/reward_per_env' has shape (3,) per seed"),
    ({"act_column": True}, "act(...) for one observation returned (ShapeDtypeStruct(shape=(1,), dtype=int32)"),
])
def test_what_update_and_act_return_is_checked_before_compiling(broken, no_compiling, tmp_path, broken_part, named):
    broken.update(broken_part)
    with pytest.raises(PluginError) as error:
        train_probe(tmp_path)
    message = str(error.value)
    assert message.startswith("The algorithm 'contract_probe' breaks the framework's contract: ")
    assert named in message and "\n" not in message
    if "names" in named:  # the metrics it does return are listed
        assert "Allowed: names of the metrics they return: train/reward, train/steps" in message


def test_the_probe_itself_keeps_the_contract(broken, no_compiling, tmp_path):
    broken["fields"] = {"health_metrics": ("train/reward",), "learner_steps": "train/steps",
                        "counters": ("train/steps",), "headline_metrics": (("train/reward", "reward"),)}
    with pytest.raises(AssertionError, match="compiled before"):  # it got as far as compiling
        train_probe(tmp_path)


class MisdeclaredCorridor(Environment):
    """Declares 2 features and resets to 1."""
    name = "misdeclared"
    num_actions = 2
    observation_shape = (2,)
    default_params = None

    def max_episode_steps(self, params):
        return 4

    def reset_env(self, key, params):
        return jnp.zeros(1, jnp.float32), jnp.int32(0)


def test_an_env_whose_observations_differ_from_its_declared_shape_is_named():
    with pytest.raises(PluginError) as error:
        registry.check_env("misdeclared", MisdeclaredCorridor(), None)
    message = str(error.value)
    assert message.startswith("The env 'misdeclared' breaks the framework's contract: reset_env returns "
                              "observations of shape (1,) where observation_shape declares (2,)")
    assert "framework/core/env.py" in message


@pytest.mark.parametrize("name", ["cartpole", "gridworld"])
def test_the_builtin_envs_keep_their_declared_shapes(name):
    env, params = envs.make(name)
    registry.check_env(name, env, params)


def test_the_log_line_shows_the_metrics_the_algorithm_names():
    record = {"env_steps": 2048, "perf/env_steps_per_second": 1000.0, "train/loss": 0.25, "train/q_mean": 3.0}
    assert "loss" not in format_line(record, None)  # no headline named: none guessed
    line = format_line(record, None, (("train/q_mean", "mean Q"), ("train/loss", "loss")))
    assert line.endswith("mean Q 3  loss 0.25")


def test_a_loss_before_the_first_update_reads_not_started_and_a_nan_after_it_stays_nan():
    headline = (("train/loss", "loss"),)
    before = {"env_steps": 1024, "perf/env_steps_per_second": 1000.0, "learner/updates": 0, "train/loss": None}
    assert format_line(before, None, headline, "learner/updates").endswith("loss not started")
    assert format_line({**before, "train/loss": float("nan")}, None, headline, "learner/updates").endswith(
        "loss not started")
    after = {**before, "learner/updates": 8, "train/loss": float("nan")}
    assert format_line(after, None, headline, "learner/updates").endswith("loss nan")
    assert format_line({**after, "train/loss": 0.5}, None, headline, "learner/updates").endswith("loss 0.5")


PLUGIN = '''
"""A third-party algorithm with health metrics but no learner_steps."""
import dataclasses
import jax.numpy as jnp
from lightspeed.framework.core.algorithm import Algorithm
from lightspeed.framework.core.registry import register_algorithm


@dataclasses.dataclass
class CarelessConfig:
    name: str = "careless"

    def validate(self):
        pass


@register_algorithm("careless", config=CarelessConfig)
def make_careless(config, env, env_params):
    return Algorithm(lambda key: key, lambda key: (key, {"train/loss": jnp.float32(0)}), lambda key: jnp.zeros(()),
                     lambda policy, state, obs, start, key: (jnp.int32(0), state), env_steps_per_update=1,
                     health_metrics=("train/loss",))
'''


def test_run_py_reports_a_broken_plugin_in_one_paragraph(tmp_path):
    site = tmp_path / "site"
    dist_info = site / "careless_plugin-0.1.dist-info"
    dist_info.mkdir(parents=True)
    (site / "careless_plugin.py").write_text(PLUGIN)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: careless-plugin\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text(textwrap.dedent("""\
        [lightspeed.algorithms]
        careless = careless_plugin
        """))
    result = run_cli("algo=careless", "env=cartpole", run_dir=tmp_path / "run", env={"PYTHONPATH": str(site)})
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0, result.stderr
    assert result.stderr.startswith("The algorithm 'careless' breaks the framework's contract: health_metrics=")
    assert not (tmp_path / "run" / "summary.json").exists()
    assert not json.dumps(result.stdout).count("env steps")  # it never trained
