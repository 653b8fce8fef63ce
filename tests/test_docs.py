"""The README and every page of the docs site: their commands run and do what the page says, the key reference is
the one the config dataclasses give, and the site builds strictly.

How a page states what its commands do, right after a ```bash block (every bash block carries at least one):

    <!-- expect: stdout "TEXT" -->              the block's commands printed TEXT (stdout or stderr)
    <!-- expect: file PATTERN -->               a file or dir matching the glob exists
    <!-- expect: json PATTERN KEY -->           every JSON file matching the glob has KEY (a.b for nested keys)
    <!-- expect: gif PATTERN -->                every file matching the glob is a GIF
    <!-- expect: contains PATTERN "TEXT" -->    every file matching the glob holds TEXT
    <!-- expect: count PATTERN N -->            exactly N files or dirs match the glob

Paths are relative to the directory the commands ran in. A ```python block runs as a script (this checkout on
PYTHONPATH) and needs an `assert` of its own or an expectation; `<!-- save: NAME.py -->` after it also saves it as
NAME.py (or DIR/NAME.py, DIR/__init__.py made) for the commands after it to import. ```text and ```toml blocks
are not run: a page uses them for what cannot run here (machines of your own, hours on a GPU), and says so.

How the commands run: in a temporary directory per chain, where a chain is the blocks (README first, then the pages
in mkdocs.yml's order) that share a run or sweep dir (`runs/x`, `sweeps/x`), a saved module or a command; a command
already run in its chain is not run again (its output counts for the later block). `python run.py` and the
`lightspeed` command (the same app, as `python run.py` with the same arguments, so that this checkout's code runs)
get small step counts; `python -m lightspeed.framework.tools.*` runs as written (these two forked by
tests/forkserver.py where that is the same as a fresh interpreter); `pip install` and `python -m pytest` are not
rerun; `wandb sync` needs a network, so its path must exist. A command with `actors=ray` starts a local Ray head: it
runs in a private network namespace (`unshare -n`), as tests/test_ray_actors.py's clusters do.
"""
import dataclasses
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import forkserver
import pytest
import yaml
from conftest import ROOT, finish

sys.path.insert(0, str(ROOT / "docs"))
import gen_config  # noqa: E402

# final_eval_episodes = eval_episodes: the final evaluation runs the periodic one's program (one compile fewer)
SMALL = {"total_env_steps": "2048", "eval_every": "1024", "log_every": "1024", "eval_episodes": "2",
         "final_eval_episodes": "2"}
NOT_RERUN = ("pip install", "python -m pytest")
TOOLS = ("lightspeed.framework.tools.report", "lightspeed.framework.tools.evaluate")
EXPECTATIONS = ("stdout", "file", "json", "gif", "contains", "count")
GENERATED_PAGES = {"bench.md"}  # docs/hooks.py makes it from bench/README.md


def nav_pages() -> list[str]:
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    return [page for entry in nav for page in entry.values()]


def documents() -> list[Path]:
    """The README, then every page of the site in the nav's order."""
    return [ROOT / "README.md"] + [ROOT / "docs" / page for page in nav_pages() if page not in GENERATED_PAGES]


@dataclasses.dataclass
class Block:
    doc: str  # the file, relative to the repository
    line: int  # of its opening fence
    lang: str
    code: str
    expects: list[str]  # "KIND ARGS" of each expectation
    save: Optional[str] = None

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
NOTE = re.compile(r"^\s*<!-- (expect|save): (.*?) -->\s*$")


def blocks_of(path: Path) -> list[Block]:
    """Every fenced block of a page, with the `<!-- expect/save: ... -->` lines right after its closing fence."""
    lines, blocks, i = path.read_text().splitlines(), [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, end = len(opening[1]), i + 1
        while not re.match(r"^\s*```\s*$", lines[end]):
            end += 1
        block = Block(str(path.relative_to(ROOT)), i + 1, opening[2],
                      "\n".join(line[indent:] for line in lines[i + 1:end]) + "\n", [])
        i = end + 1
        while i < len(lines) and NOTE.match(lines[i]):
            kind, value = NOTE.match(lines[i]).groups()
            if kind == "save":
                block.save = value
            else:
                block.expects.append(value)
            i += 1
        blocks.append(block)
    return blocks


def commands_of(block: Block) -> list[str]:
    """Each command line of a bash block: comments dropped, `\\` continuations joined, `a && b` split in two."""
    commands = []
    for line in block.code.replace("\\\n", " ").splitlines():
        line = re.split(r"\s+#", line)[0].strip()
        if line and not line.startswith("#"):
            commands += [part.strip() for part in line.split("&&") if part.strip()]
    return commands


def runnable(blocks: list[Block]) -> list[Block]:
    return [block for block in blocks if block.lang in ("bash", "python")]


ALL_BLOCKS = [block for doc in documents() for block in blocks_of(doc)]
BLOCKS = runnable(ALL_BLOCKS)


def resources(block: Block, saved: set[str]) -> set[str]:
    """What ties a block to others: the run and sweep dirs it names, the saved modules it uses, its commands."""
    text = block.code + " ".join(block.expects)
    named = {match[1] for match in re.finditer(r"(?:^|[\s=\"'])((?:runs|sweeps)/[\w.-]+)", text)}
    modules = {name for name in saved if re.search(rf"\b{re.escape(Path(name).stem)}\b", block.code)}
    commands = set(commands_of(block)) if block.lang == "bash" else set()
    return named | modules | commands


def chains_of(blocks: list[Block]) -> list[list[Block]]:
    """The blocks in page order, grouped so that a block that reads an earlier one's dir, module or command runs
    after it in the same test (pytest-xdist may run separate tests on separate workers, in any order)."""
    saved = {block.save for block in blocks if block.save}
    position = {id(block): i for i, block in enumerate(blocks)}
    chains: list[tuple[set[str], list[Block]]] = []
    for block in blocks:
        mine = resources(block, saved)
        joined = [chain for chain in chains if chain[0] & mine]
        members = [member for chain in joined for member in chain[1]] + [block]
        chains = [chain for chain in chains if not chain[0] & mine] + [(mine.union(*(c[0] for c in joined)), members)]
    ordered = [sorted(members, key=lambda member: position[id(member)]) for _, members in chains]
    return sorted(ordered, key=lambda members: position[id(members[0])])


CHAINS = chains_of(BLOCKS)


# ---------------------------------------------------------------------------------------------------------------
# Running a chain


def small_run(tokens: list[str]) -> list[str]:
    """run.py's overrides with the run shortened: small step counts, two Optuna trials, no progress bar.
    The added overrides join the command's own (argparse takes one run of them: `a=1 --cfg job b=2` fails)."""
    overrides = [t for t in tokens if t.partition("=")[0] not in SMALL]
    added = [f"{key}={value}" for key, value in SMALL.items()] + ["progress=false"]
    if any(t.startswith("+sweep=") for t in tokens):
        added.append("hydra.sweeper.n_trials=2")
    last = max((i for i, t in enumerate(overrides) if "=" in t and not t.startswith("-")), default=len(overrides) - 1)
    return overrides[:last + 1] + added + overrides[last + 1:]


def run_argv(argv: list[str], workdir: Path, env: dict) -> str:
    """Run to its end; its stdout and stderr together, after checking that it succeeded."""
    if argv[0] == sys.executable:  # run.py and the tools: forked by the tests' server where that is the same
        result = finish(forkserver.popen(argv[1:], workdir, env), timeout=600)
    else:
        result = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{shlex.join(argv)}\n{output[-3000:]}"
    assert "Traceback" not in result.stderr, f"{shlex.join(argv)}\n{result.stderr[-3000:]}"
    return output


def in_private_network(argv: list[str]) -> list[str]:
    """`argv` in a network namespace of its own, loopback up: a Ray head it starts is reachable from nowhere."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode:
        pytest.skip("a Ray head runs in a private network namespace here: needs `unshare -n` (root or user namespaces)")
    return ["unshare", "-n", "sh", "-c", f"ip link set lo up && exec {shlex.join(argv)}"]


def run_command(command: str, workdir: Path) -> str:
    tokens = shlex.split(command)
    env = {key: value for key, value in os.environ.items() if key != "WANDB_API_KEY"}  # W&B offline, no network
    env["PYTHONPATH"] = str(ROOT)
    while "=" in tokens[0] and not tokens[0].startswith("-"):  # VAR=value prefixes
        name, _, value = tokens.pop(0).partition("=")
        env[name] = os.pathsep.join([str(workdir / value), str(ROOT)]) if name == "PYTHONPATH" else value
    if tokens[:2] == ["wandb", "sync"]:
        assert glob.glob(str(workdir / tokens[2])), f"nothing for `{command}` to upload"
        return ""
    if tokens[:2] == ["python", "run.py"] or tokens[0] == "lightspeed":
        argv = [sys.executable, str(ROOT / "run.py"), *small_run(tokens[2 if tokens[0] == "python" else 1:])]
        if "actors=ray" in tokens:
            argv = in_private_network(argv)
    elif tokens[:2] == ["python", "-m"] and tokens[2] in TOOLS:
        argv = [sys.executable, *tokens[1:]]
    else:
        pytest.fail(f"a page runs a command this test does not know: {command}")
    return run_argv(argv, workdir, env)


def check_expectation(expect: str, output: str, workdir: Path, where: str) -> None:
    kind, *args = shlex.split(expect)
    assert kind in EXPECTATIONS, f"{where}: unknown expectation {expect!r} (known: {', '.join(EXPECTATIONS)})"
    if kind == "stdout":
        assert args[0] in output, f"{where}: {args[0]!r} not printed; the end of the output:\n{output[-3000:]}"
        return
    matches = sorted(glob.glob(str(workdir / args[0])))
    if kind == "count":
        assert len(matches) == int(args[1]), f"{where}: {len(matches)} match {args[0]}, not {args[1]}: {matches}"
    assert matches, f"{where}: nothing matches {args[0]} in {sorted(p.name for p in workdir.iterdir())}"
    for match in matches:
        path = Path(match)
        if kind == "json":
            value = json.loads(path.read_text())
            for key in args[1].split("."):
                assert key in value, f"{where}: {match} has no {args[1]!r}: {sorted(value)}"
                value = value[key]
        elif kind == "gif":
            assert path.read_bytes()[:6] in (b"GIF87a", b"GIF89a"), f"{where}: {match} is not a GIF"
        elif kind == "contains":
            assert args[1] in path.read_text(), f"{where}: {match} does not hold {args[1]!r}"


def run_block(block: Block, workdir: Path, ran: dict[str, str]) -> None:
    """A block's commands (those not yet run in its chain), then its expectations."""
    if block.lang == "python":
        script = workdir / (block.save or f"block_{Path(block.doc).stem}_{block.line}.py")
        if script.parent != workdir:  # a module saved into a package of the project (envs/x.py): a regular one
            script.parent.mkdir(parents=True, exist_ok=True)
            (script.parent / "__init__.py").touch()
        script.write_text(block.code)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        output = run_argv([sys.executable, str(script.relative_to(workdir))], workdir, env)
    else:
        output = ""
        for command in commands_of(block):
            if command.startswith(NOT_RERUN):
                continue
            if command not in ran:
                ran[command] = run_command(command, workdir)
            output += ran[command]
    for expect in block.expects:
        check_expectation(expect, output, workdir, block.where)


@pytest.mark.parametrize("chain", CHAINS, ids=lambda chain: "+".join(block.where for block in chain))
def test_doc_commands_run_and_do_what_the_page_says(chain, tmp_path):
    ran: dict[str, str] = {}
    for block in chain:  # in a directory of their own: `runs/...` and `sweeps/...` land there
        run_block(block, tmp_path, ran)


# ---------------------------------------------------------------------------------------------------------------
# The conventions hold


def test_every_bash_block_says_what_to_expect():
    missing = [block.where for block in ALL_BLOCKS if block.lang == "bash" and not block.expects]
    assert missing == [], f"bash blocks without an <!-- expect: ... --> line: {missing}"
    kinds = {shlex.split(expect)[0] for block in ALL_BLOCKS for expect in block.expects}
    assert kinds <= set(EXPECTATIONS), kinds - set(EXPECTATIONS)


def test_every_python_block_checks_something():
    unchecked = [block.where for block in ALL_BLOCKS
                 if block.lang == "python" and "assert" not in block.code and not block.expects]
    assert unchecked == []


def test_every_block_is_run_or_said_to_be_shown():
    """Blocks are run (bash, python) or shown (text, toml); any other language would go unchecked."""
    assert {block.lang for block in ALL_BLOCKS} <= {"bash", "python", "text", "toml"}


def test_the_docs_have_commands_to_run():
    commands = [command for block in BLOCKS if block.lang == "bash" for command in commands_of(block)]
    assert sum(("run.py" in command or command.startswith("lightspeed")) for command in commands) >= 10
    assert any(command.startswith("lightspeed") for command in commands)


def test_a_block_that_reads_an_earlier_ones_dir_runs_after_it():
    def bash(code: str, line: int) -> Block:
        return Block("x.md", line, "bash", code, ["file x"])

    a = bash("python run.py hydra.run.dir=runs/a\n", 1)
    b = bash("python run.py\n", 2)
    c = bash("python -m lightspeed.framework.tools.evaluate runs/a --gif runs/a/x.gif\n", 3)
    d = bash("python run.py -m hydra.sweep.dir=sweeps/b\n", 4)
    e = bash("python -m lightspeed.framework.tools.report sweeps/b\n", 5)
    f = Block("x.md", 6, "python", 'load_policy("runs/a")\n', [])
    assert [[block.line for block in chain] for chain in chains_of([a, b, c, d, e, f])] == [[1, 3, 6], [2], [4, 5]]
    same = bash("python run.py\n", 7)  # the same command twice: one chain, run once
    assert [[block.line for block in chain] for chain in chains_of([b, same])] == [[2, 7]]


# ---------------------------------------------------------------------------------------------------------------
# The README, the site, the key reference


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


def test_every_page_is_in_the_nav_and_every_nav_page_exists():
    pages = {path.name for path in (ROOT / "docs").glob("*.md")}
    assert pages == set(nav_pages()) - GENERATED_PAGES


def test_the_readmes_links_lead_somewhere():
    text = (ROOT / "README.md").read_text()
    links = [link for link in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"\w+://", link)]
    assert links, "the README links into the docs"
    missing = [link for link in links if not (ROOT / link.split("#")[0]).exists()]
    assert missing == []


def test_the_docs_build_strictly(tmp_path):
    """mkdocs.yml's `strict: true` and validation: a broken link or anchor, a page outside the nav or a stale key
    reference (docs/hooks.py) fails the build."""
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "configuration" / "index.html").is_file()
    assert (tmp_path / "site" / "bench" / "index.html").is_file()


def test_the_key_reference_is_what_the_dataclasses_give():
    """docs/configuration.md's generated part is `python docs/gen_config.py`'s output for the code as it is."""
    assert gen_config.stale() is None


def test_a_key_added_to_a_dataclass_makes_the_page_stale(monkeypatch):
    import lightspeed.framework.core.config as config
    from lightspeed.framework.core import registry

    grown = dataclasses.make_dataclass("TrainConfig", [("brand_new_key", int, dataclasses.field(default=7))],
                                       bases=(config.TrainConfig,))
    monkeypatch.setattr(config, "TrainConfig", grown)
    assert "`brand_new_key` | int | `7`" in gen_config.render()
    assert "stale" in gen_config.stale()
    monkeypatch.undo()

    entry = registry.lookup("algo", "dqn")
    grown = dataclasses.make_dataclass("DQNConfig", [("brand_new_key", float, dataclasses.field(default=0.5))],
                                       bases=(entry.config_class,))
    monkeypatch.setitem(registry._REGISTRIES["algo"], "dqn", dataclasses.replace(entry, config_class=grown))
    assert "`algo.brand_new_key` | float | `0.5`" in gen_config.render()
    assert "stale" in gen_config.stale()


def test_a_fields_comment_is_its_description():
    @dataclasses.dataclass
    class Example:
        # the line above
        # and the one above that
        spread: int = 1  # and its own
        plain: str = "x"

    comments = gen_config.field_comments(Example)
    assert comments == {"spread": "the line above and the one above that and its own"}


def test_the_groups_table_lists_every_option_of_conf_and_the_registry():
    """configuration.md's Groups table names every file of conf/'s groups and every built-in algorithm and env, the
    ones registered without a file (env=gymnasium, env=atari) included, with a description each."""
    from lightspeed.framework.core.config import CONF_DIR

    page = (ROOT / "docs" / "configuration.md").read_text()
    table = page[page.index(gen_config.GROUPS_BEGIN):page.index(gen_config.GROUPS_END)]
    rows = {tuple(cell.strip() for cell in line.split(" | ")[:2]): line.rsplit(" | ", 1)[1]
            for line in table.splitlines() if line.startswith("| `")}
    expected = {(f"| `{path.parent.name}/`", f"`{'+sweep=' if path.parent.name == 'sweep' else ''}{path.stem}`")
                for group in gen_config.GROUPS for path in (CONF_DIR / group).glob("*.yaml")}
    expected |= {(f"| `{kind}/`", f"`{name}`") for kind in ("algo", "env") for name, _ in gen_config.builtin(kind)}
    listed = {(group, option.split(" (")[0]) for group, option in rows}
    assert expected <= listed, expected - listed
    assert ("| `algo/`", "`apex` (default)") in rows and ("| `algo_env/`", "`dqn_gymnasium` (tuned for env.id "
                                                          "CartPole-v1)") in rows
    assert all(len(description.strip(" |")) > 10 for description in rows.values()), rows


def test_every_key_has_a_description():
    """Every row of the generated key tables has a description: each config field carries a comment."""
    header = "| key | type | default | description |"
    keys, empty, section, in_table = 0, [], "", False
    for line in gen_config.render().splitlines():
        if line.startswith("### "):
            section = line[4:]
        if line == header:
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and line.startswith("| `"):
            cells = re.split(r"(?<!\\)\|", line)[1:-1]  # a description's own `|` is escaped
            assert len(cells) == 4, line
            keys += 1
            if not cells[-1].strip():
                empty.append(f"{cells[0].strip()} ({section})")
    assert keys > 100, "no key tables found in gen_config.render()"
    assert not empty, f"keys whose field has no comment: {', '.join(empty)}"


def configuration_table() -> dict[str, str]:
    """The `key | default | meaning` rows of the configuration page's "The keys most runs touch"."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text[text.index("## The keys most runs touch\n"):]
    section = section[:section.index("\n## ", 1)]
    return dict(re.findall(r"^\| `([\w.]+)` \| ([^|`]+?) \| [^|]+ \|$", section, re.M))


def test_the_keys_most_runs_touch_show_what_python_run_py_runs():
    """The keys the page lists carry the values `python run.py --cfg job` shows."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from lightspeed.framework.core.config import CONF_DIR, register_schemas

    rows = configuration_table()
    assert len(rows) >= 8 and "total_env_steps" in rows
    register_schemas()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3", job_name="docs"):
        cfg = compose("config")
    shown = {key: yaml.safe_load(value) for key, value in rows.items()}
    assert shown == {key: OmegaConf.select(cfg, key) for key in rows}
