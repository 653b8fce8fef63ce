"""Every command in the README's bash blocks runs, after any it depends on, with small step counts.

The commands run in a temporary directory (so `runs/...` and `sweeps/...` land there) against
this checkout's run.py; `total_env_steps`, the evaluation cadence and episode counts are replaced by small
values. `python -m framework.tools.report` and `python -m framework.tools.evaluate` run as written.
Installing and the test suite itself are not rerun; `wandb sync` needs a network, so for it we
check that the path it is given exists.
"""
import glob
import os
import re
import shlex

import pytest
from conftest import ROOT, run_python

# final_eval_episodes = eval_episodes: the final evaluation runs the periodic one's program (one compile fewer)
SMALL = {"total_env_steps": "2048", "eval_every": "1024", "log_every": "1024", "eval_episodes": "2",
         "final_eval_episodes": "2"}
NOT_RERUN = ("pip install", "python -m pytest")


def readme_commands() -> list[str]:
    """Each command line of each bash block, comments dropped, `a && b` split in two."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S):
        for line in block.splitlines():
            line = re.split(r"\s+#", line)[0].strip()
            commands += [part.strip() for part in line.split("&&") if part.strip() and not line.startswith("#")]
    return [command for command in commands if not command.startswith(NOT_RERUN)]


def small_run(tokens: list[str]) -> list[str]:
    """run.py's overrides with the run shortened: small step counts, two Optuna trials, no progress bar.
    The added overrides join the command's own (argparse takes one run of them: `a=1 --cfg job b=2` fails)."""
    overrides = [t for t in tokens if t.partition("=")[0] not in SMALL]
    added = [f"{key}={value}" for key, value in SMALL.items()] + ["progress=false"]
    if any(t.startswith("+sweep=") for t in tokens):
        added.append("hydra.sweeper.n_trials=2")
    last = max((i for i, t in enumerate(overrides) if "=" in t and not t.startswith("-")), default=len(overrides) - 1)
    return overrides[:last + 1] + added + overrides[last + 1:]


def output_dirs(command: str) -> set[str]:
    """The run and sweep dirs a command names (`hydra.run.dir=runs/x`, `runs/x/...`, `sweeps/x`)."""
    return {match.group(1) for match in re.finditer(r"(?:^|[\s=])((?:runs|sweeps)/[\w.-]+)", command)}


def command_chains(commands: list[str]) -> list[list[str]]:
    """The commands in README order, grouped so a command that reads or resumes an earlier one's dir runs after
    it in the same test (pytest-xdist may run separate tests on separate workers, in any order)."""
    chains: list[list[str]] = []
    for command in commands:
        named = output_dirs(command)
        earlier = next((chain for chain in chains if named & set().union(*map(output_dirs, chain))), None)
        if earlier is None:
            chains.append([command])
        else:
            earlier.append(command)
    return chains


COMMANDS = readme_commands()
CHAINS = command_chains(COMMANDS)


def test_the_readme_has_commands_to_run():
    assert sum("run.py" in command for command in COMMANDS) >= 10


def test_a_command_that_reads_an_earlier_ones_dir_runs_after_it():
    chains = command_chains(["python run.py hydra.run.dir=runs/a", "python run.py",
                             "python -m framework.tools.evaluate runs/a --gif runs/a/x.gif",
                             "python run.py -m hydra.sweep.dir=sweeps/b", "python -m framework.tools.report sweeps/b"])
    assert chains == [["python run.py hydra.run.dir=runs/a",
                       "python -m framework.tools.evaluate runs/a --gif runs/a/x.gif"],
                      ["python run.py"], ["python run.py -m hydra.sweep.dir=sweeps/b",
                                          "python -m framework.tools.report sweeps/b"]]


@pytest.mark.parametrize("chain", CHAINS, ids=" ; ".join)
def test_readme_commands_run(chain, tmp_path):
    for command in chain:  # in a directory of their own: `runs/...` and `sweeps/...` land there
        run_readme_command(command, tmp_path)


def run_readme_command(command: str, workdir) -> None:
    tokens = shlex.split(command)
    env = dict(os.environ)
    while "=" in tokens[0] and not tokens[0].startswith("-"):  # VAR=value prefixes
        name, _, value = tokens.pop(0).partition("=")
        env[name] = value
    if tokens[:2] == ["wandb", "sync"]:
        assert glob.glob(str(workdir / tokens[2])), f"nothing for `{command}` to upload"
        return
    if tokens[:2] == ["python", "run.py"]:
        result = run_python(*small_run(tokens[2:]), cwd=workdir, env=env, timeout=600)
    elif tokens[:3] in (["python", "-m", "framework.tools.report"], ["python", "-m", "framework.tools.evaluate"]):
        env["PYTHONPATH"] = str(ROOT)
        result = run_python(*tokens[3:], module=tokens[2], cwd=workdir, env=env, timeout=600)
    else:
        pytest.fail(f"the README runs a command this test does not know: {command}")
    assert result.returncode == 0, f"{command}\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr


def configuration_table() -> dict[str, str]:
    """The `key | default | meaning` rows of the README's Configuration section."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Configuration\n"):]
    section = section[:section.index("\n## ", 1)]
    return dict(re.findall(r"^\| `([\w.]+)` \| ([^|`]+?) \| [^|]+ \|$", section, re.M))


def test_the_readme_keys_show_what_python_run_py_runs():
    """The few keys the README lists carry the values `python run.py --cfg job` shows (the dataclasses' defaults)."""
    import yaml
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from framework.core.config import CONF_DIR, register_schemas

    rows = configuration_table()
    assert len(rows) >= 8 and "total_env_steps" in rows
    register_schemas()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3", job_name="readme"):
        cfg = compose("config")
    shown = {key: yaml.safe_load(value) for key, value in rows.items()}
    assert shown == {key: OmegaConf.select(cfg, key) for key in rows}
