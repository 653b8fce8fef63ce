"""Fuzzed bad input: any override of any key either passes the checks and builds, or stops with a
message naming the key (the same checks run.py runs before compiling), never with a traceback."""
import dataclasses
import re
import tempfile
from pathlib import Path

import pytest
from conftest import check_like_run_py, compose_config, run_cli
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lightspeed.framework.app.cli import ComposeError
from lightspeed.framework.core import registry
from lightspeed.framework.core.config import TrainConfig, register_schemas
from lightspeed.framework.core.errors import ConfigError

register_schemas()
TOP_LEVEL = [f.name for f in dataclasses.fields(TrainConfig)
             if f.name not in ("algo", "env", "logger", "distributed", "checkpoint", "compilation_cache")]
TOP_LEVEL += ["checkpoint.every", "checkpoint.keep", "num_devices", "distributed.num_processes",
              "distributed.process_id", "logger.project", "logger.mode"]
# a combination check names one key of the pair it compares: the key a message may name -> the other keys
# whose values can make that check fail (the checks in algorithms/*.py, envs/gridworld.py, framework/)
PARTNERS = {
    "algo.batch_size": {"algo.buffer_size"},
    # Ape-X's iteration, R2D2's whole sequences, a frame ring's stack
    "algo.buffer_size": {"algo.num_actors", "algo.envs_per_actor", "algo.rollout_length", "algo.num_envs",
                         "algo.burn_in", "algo.sequence_length", "algo.sequence_period"},
    "algo.n_step": {"algo.buffer_size", "algo.num_envs", "algo.num_actors", "algo.envs_per_actor"},  # a frame ring
    "algo.train_every": {"algo.num_envs"},
    "algo.rollout_length": {"algo.sequence_period"},  # R2D2's iterations end where a sequence may start
    "algo.torso": {"env", "env.height", "env.width", "env.observation"},  # a conv torso on small or flat observations
    "env": {"algo"},  # an env whose observations the algorithm cannot take
    "env.observation": {"algo"},
    "env.width": {"env.height"},  # a 1x1 grid
    "algo.sigma_min": {"algo.sigma_max"},  # D4PG's noise ladder runs from sigma_max down to sigma_min
    "algo.ou_dt": {"algo.ou_theta"},  # D4PG's OU process decays only while ou_theta * ou_dt <= 1
    "env.id": {"env.id_pattern"},  # the default id outside a changed pattern
    "env.start": {"env.height", "env.width", "env.walls"},  # outside the grid, or a wall
    "env.goal": {"env.height", "env.width", "env.walls", "env.start"},
    "env.walls": {"env.height", "env.width", "env.start", "env.goal", "env.random_start"},  # cut off, or outside
    "distributed.process_id": {"distributed.num_processes"},
    "distributed.coordinator_address": {"distributed.num_processes"},
}


def named_key(message: str) -> str:
    """The key a one-paragraph error names: ours ("Invalid config: KEY=VALUE ..."), or the override Hydra could
    not merge ("Error merging override KEY=VALUE", "Could not override 'KEY'"); its "key:" can be a list
    index (env.walls=[0] gives "key: 0")."""
    found = (re.match(r"Invalid config: ([\w.\[\]]+)=", message)
             or re.search(r"(?:Error merging override |Could not override ')([\w.]*\w)", message))
    assert found, message
    key = re.sub(r"\[\d+\]$", "", found.group(1))  # env.walls[2] -> env.walls
    return "env.params" if key.startswith("env.params.") else key  # a gymnax param of its own


def blames_a_changed_key(message: str, overrides: list[str]) -> bool:
    changed = {override.partition("=")[0] for override in overrides}  # algo=..., env=... are changed keys too
    key = named_key(message)
    return key in changed or bool(PARTNERS.get(key, set()) & changed)


# the shipped algorithms: a test plugin (test_contracts.py's contract_probe, registered when that module runs in
# the same worker) has no validate() by design, so its bad values are contract errors, not config errors
PRODUCT_ALGOS = [name for name in registry.known("algo") if name != "contract_probe"]

BAD_VALUES = st.sampled_from(["abc", "-1", "0", "-0.5", "1.5", "2", "nan", "inf", "-inf", "1e12", "[]", "[0]",
                              "[-3,2]", "true", "null", "''", "[[0,0]]", "[[1,0],[0,1]]", "0.0001", "100000000"])


def _keys(group: str, name: str) -> list[str]:
    fields = dataclasses.fields(registry.lookup(group, name).config_class)
    return [f"{group}.{f.name}" for f in fields if f.name != "name"]


@st.composite
def bad_overrides(draw) -> list[str]:
    algo = draw(st.sampled_from(PRODUCT_ALGOS))
    env = draw(st.sampled_from(registry.known("env")))
    keys = _keys("algo", algo) + _keys("env", env) + TOP_LEVEL + ["algo.no_such_key", "env.colour"]
    chosen = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=3, unique=True))
    return [f"algo={algo}", f"env={env}", *(f"{key}={draw(BAD_VALUES)}" for key in chosen)]


def bad_override_is_named_or_accepted(overrides: list[str]) -> None:
    try:
        check_like_run_py(overrides)
    except (ConfigError, ComposeError) as error:
        message = str(error)
        assert "\n" not in message.strip(), message
        # a combination (batch vs buffer, walls vs goal, apex on grid cells) may name the partner key
        assert blames_a_changed_key(message, overrides), (overrides, message)


# the default suite draws 40 cases; `pytest -m slow` draws 150 (new ones on every run, as both do)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bad_overrides())
def test_bad_overrides_are_named_or_accepted(overrides):
    bad_override_is_named_or_accepted(overrides)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bad_overrides())
def test_every_bad_override_is_named_or_accepted(overrides):
    bad_override_is_named_or_accepted(overrides)


def test_the_named_key_is_read_from_both_kinds_of_message():
    assert named_key("Invalid config: env.walls[1]=[9, 9] (the cell is outside the grid). Allowed: ...") == "env.walls"
    hydra_message = "Invalid config: Error merging override seed=null; field 'seed' is not Optional; key: seed."
    assert named_key(hydra_message) == "seed"
    assert named_key(hydra_message.replace("seed", "algo.n_step")) == "algo.n_step"
    assert named_key("Invalid config: Could not override 'env.colour'.; Key 'colour' not in 'GridWorldConfig'; "
                     "key: env.colour.") == "env.colour"
    # a key that no changed key bears on (algo.n_step's partners are a frame ring's sizes, not the discount)
    assert not blames_a_changed_key("Invalid config: algo.n_step=0. Allowed: an integer >= 1.",
                                    ["algo=dqn", "env=cartpole", "algo.discount=2"])
    assert blames_a_changed_key("Invalid config: algo.batch_size=64 (a batch cannot be larger than the buffer).",
                                ["algo=dqn", "env=cartpole", "algo.buffer_size=2"])


@pytest.mark.parametrize(("overrides", "key"), [
    (["algo=dqn", "env=cartpole", "algo.batch_size=100000", "algo.buffer_size=1000"], "algo.batch_size"),
    (["algo=dqn", "env=cartpole", "algo.buffer_size=16"], "algo.batch_size"),  # the partner of the changed key
    (["algo=apex", "env=cartpole", "algo.n_step=0"], "algo.n_step"),
    (["algo=tabular_q", "env=gridworld", "env.walls=[[0,1],[1,0]]"], "env.walls"),
    (["algo=apex", "env=cartpole", "num_devices=64"], "num_devices"),
    (["algo=dqn", "env=gridworld", "algo.hidden_sizes=[]"], "algo.hidden_sizes"),
])
def test_a_handful_through_run_py(overrides, key, tmp_path):
    result = run_cli(*overrides, run_dir=tmp_path, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert named_key(message) == key, result.stderr
    assert blames_a_changed_key(message, overrides)


def _edge_value(field: dataclasses.Field):
    """Unusual but plausible values of a field's type (sizes of 1, probabilities of 0 and 1, ...)."""
    kind = str(field.type)
    if "bool" in kind:
        return st.sampled_from(["true", "false"])
    if "int" in kind and "list" not in kind:
        return st.sampled_from(["1", "2", "3", "7"])
    if "float" in kind:
        return st.sampled_from(["0.0", "0.5", "1.0", "0.001"])
    if "list" in kind and field.name == "hidden_sizes":
        return st.sampled_from(["[1]", "[3,2]"])
    return None


@st.composite
def edge_overrides(draw) -> list[str]:
    algo = draw(st.sampled_from(PRODUCT_ALGOS))
    env = "gridworld" if algo == "tabular_q" else "cartpole"
    fields = [f for f in dataclasses.fields(registry.lookup("algo", algo).config_class) if _edge_value(f) is not None]
    chosen = draw(st.lists(st.sampled_from(fields), min_size=1, max_size=4, unique_by=lambda f: f.name))
    return [f"algo={algo}", f"env={env}", *(f"algo.{f.name}={draw(_edge_value(f))}" for f in chosen)]


def edge_values_train_for_a_few_steps(overrides: list[str], tmp_path: Path) -> bool:
    """Whether the case trained (False: refused with a message, which the tests above cover)."""
    from lightspeed.framework.app.train import train

    # final_eval_episodes = eval_episodes: the final evaluation runs the periodic one's program (one compile fewer)
    short = [*overrides, "total_env_steps=256", "eval_every=256", "log_every=256", "eval_episodes=1",
             "final_eval_episodes=1"]
    try:
        check_like_run_py(short)
    except (ConfigError, ComposeError):
        return False  # refused with a message: covered above
    run_dir = Path(tempfile.mkdtemp(dir=tmp_path))  # one per example: Hypothesis may draw the same one twice
    summary = train(compose_config(*short), run_dir)
    assert summary["env_steps"] >= 256 and (run_dir / "metrics.jsonl").exists()
    return True


# each case compiles a run: the default suite trains 3 accepted cases (a refused one is drawn again: about a
# third are), `pytest -m slow` draws 8
@settings(max_examples=3, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(overrides=edge_overrides())
def test_accepted_edge_values_train(overrides, tmp_path):
    assume(edge_values_train_for_a_few_steps(overrides, tmp_path))


@pytest.mark.slow
@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(overrides=edge_overrides())
def test_accepted_edge_values_train_for_a_few_steps(overrides, tmp_path):
    edge_values_train_for_a_few_steps(overrides, tmp_path)
