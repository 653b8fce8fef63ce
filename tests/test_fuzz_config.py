"""Fuzzed bad input: any override of any key either passes the checks and builds, or stops with a
message naming the key (the same checks run.py runs before compiling), never with a traceback."""
import dataclasses
import re
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import ROOT, check_like_run_py, compose_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from framework import registry
from framework.cli import ComposeError
from framework.config import TrainConfig, register_schemas
from framework.errors import ConfigError

register_schemas()
TOP_LEVEL = [f.name for f in dataclasses.fields(TrainConfig)
             if f.name not in ("algo", "env", "logger", "distributed", "checkpoint", "compilation_cache")]
TOP_LEVEL += ["checkpoint.every", "checkpoint.keep", "num_devices", "distributed.num_processes",
              "distributed.process_id", "logger.project", "logger.mode"]
NAMES_A_KEY = re.compile(r"\b(algo|env|logger|distributed|checkpoint)(\.\w+)?\b|\b("
                         + "|".join(f.name for f in dataclasses.fields(TrainConfig)) + r")\b")
BAD_VALUES = st.sampled_from(["abc", "-1", "0", "-0.5", "1.5", "2", "nan", "inf", "-inf", "1e12", "[]", "[0]",
                              "[-3,2]", "true", "null", "''", "[[0,0]]", "[[1,0],[0,1]]", "0.0001", "100000000"])


def _keys(group: str, name: str) -> list[str]:
    fields = dataclasses.fields(registry.lookup(group, name).config_class)
    return [f"{group}.{f.name}" for f in fields if f.name != "name"]


@st.composite
def bad_overrides(draw) -> list[str]:
    algo = draw(st.sampled_from(registry.known("algo")))
    env = draw(st.sampled_from(registry.known("env")))
    keys = _keys("algo", algo) + _keys("env", env) + TOP_LEVEL + ["algo.no_such_key", "env.colour"]
    chosen = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=3, unique=True))
    return [f"algo={algo}", f"env={env}", *(f"{key}={draw(BAD_VALUES)}" for key in chosen)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bad_overrides())
def test_every_bad_override_is_named_or_accepted(overrides):
    try:
        check_like_run_py(overrides)
    except (ConfigError, ComposeError) as error:
        message = str(error)
        assert "\n" not in message.strip(), message
        # a combination (batch vs buffer, walls vs goal, apex on grid cells) may name the partner key
        assert NAMES_A_KEY.search(message), (overrides, message)


@pytest.mark.parametrize("overrides", [
    ["algo=dqn", "env=cartpole", "algo.batch_size=100000", "algo.buffer_size=1000"],
    ["algo=apex", "env=cartpole", "algo.n_step=0"],
    ["algo=tabular_q", "env=gridworld", "env.walls=[[0,1],[1,0]]"],
    ["algo=apex", "env=cartpole", "num_devices=64"],
    ["algo=dqn", "env=gridworld", "algo.hidden_sizes=[]"],
])
def test_a_handful_through_run_py(overrides, tmp_path):
    import subprocess

    result = subprocess.run([sys.executable, str(ROOT / "run.py"), *overrides, "progress=false",
                             f"hydra.run.dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert overrides[-1].partition("=")[0] in result.stderr or "Invalid config" in result.stderr


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
    algo = draw(st.sampled_from(registry.known("algo")))
    env = "gridworld" if algo == "tabular_q" else "cartpole"
    fields = [f for f in dataclasses.fields(registry.lookup("algo", algo).config_class) if _edge_value(f) is not None]
    chosen = draw(st.lists(st.sampled_from(fields), min_size=1, max_size=4, unique_by=lambda f: f.name))
    return [f"algo={algo}", f"env={env}", *(f"algo.{f.name}={draw(_edge_value(f))}" for f in chosen)]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(overrides=edge_overrides())
def test_accepted_edge_values_train_for_a_few_steps(overrides, tmp_path):
    from framework.trainer import train

    short = [*overrides, "total_env_steps=256", "eval_every=256", "log_every=256", "eval_episodes=1"]
    try:
        check_like_run_py(short)
    except (ConfigError, ComposeError):
        return  # refused with a message: covered above
    run_dir = Path(tempfile.mkdtemp(dir=tmp_path))  # one per example: Hypothesis may draw the same one twice
    summary = train(compose_config(*short), run_dir)
    assert summary["env_steps"] >= 256 and (run_dir / "metrics.jsonl").exists()
