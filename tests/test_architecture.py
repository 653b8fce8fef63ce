"""The package map holds: framework/ is laid out by shape, its imports point one way and form no circle, no shared
module names an algorithm or env family, and the old flat import paths still work. Imports are read from the
source (every `import` statement, lazy ones inside functions included), not from what a run happens to load."""
import ast
import io
import re
import tokenize
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ("framework", "algorithms", "envs")
# what each room of framework/ may import of the project (besides itself)
ALLOWED = {
    "core": set(),
    "run": {"core"},
    "anakin": {"core", "run"},
    "sebulba": {"core", "run"},
    "tools": {"core", "run", "anakin", "sebulba"},
    "app": {"core", "run", "anakin", "sebulba", "tools"},
}
# names of the built-in algorithms and env families (and their engines): the shared rooms never say them in code
FAMILIES = re.compile(r"\b(dqn|apex|ape-x|tabular_q|tabular|r2d2|d4pg|minatar|atari|ale_py|pong|breakout|cartpole|"
                      r"gridworld|gymnax|popgym|mujoco|replay)\b", re.IGNORECASE)
SHARED_ROOMS = ("core", "run", "anakin", "sebulba")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(path): path for package in PROJECT for path in sorted((ROOT / package).rglob("*.py"))}


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules a file imports, each named as the module file it loads (`from lightspeed.framework.core
    import registry` imports framework.core.registry: the folder's package, installed under lightspeed)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            name = name.removeprefix("lightspeed.") if name.split(".")[1:2] and name.split(".")[1] in PROJECT else name
            if name in modules and name.split(".")[0] in PROJECT:
                found.add(name)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(path, modules) - {name} for name, path in modules.items()}


def room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "framework" and len(parts) > 1 else None


def test_framework_has_a_room_per_shape_and_no_flat_modules():
    rooms = {path.name for path in (ROOT / "framework").iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert set(ALLOWED) <= rooms and (ROOT / "framework" / "sebulba" / "ray").is_dir()
    assert [path.name for path in (ROOT / "framework").glob("*.py")] == ["__init__.py"]


def test_each_room_imports_only_the_rooms_below_it(graph):
    wrong = [(module, imported) for module, targets in graph.items() if room(module)
             for imported in targets
             if imported.split(".")[0] != "framework" or (room(imported) not in ALLOWED[room(module)] | {room(module)})]
    assert wrong == []


def test_core_imports_nothing_of_the_project_and_the_drivers_not_each_other(graph):
    assert all(room(imported) == "core" for module in graph if room(module) == "core" for imported in graph[module])
    between = [(module, imported) for module in graph for imported in graph[module]
               if {room(module), room(imported)} == {"anakin", "sebulba"}]
    assert between == []


def test_plugins_import_only_the_framework_core(graph):
    wrong = [(module, imported) for module, targets in graph.items() if module.split(".")[0] in ("algorithms", "envs")
             for imported in targets if imported.split(".")[0] == "framework" and room(imported) != "core"]
    assert wrong == []


def test_there_is_no_import_circle(graph):
    """Tarjan's strongly connected components over every import, lazy ones included: each must be one module."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    assert circles == []


def test_the_walk_sees_a_circle_and_a_lazy_import(tmp_path):
    """The reader above is not blind: a lazy import inside a function counts, and names resolve to modules."""
    path = tmp_path / "probe.py"
    path.write_text("def later():\n    from lightspeed.framework.core import registry\n"
                    "    import framework.run.policy\n")
    modules = {"framework.core.registry": path, "framework.run.policy": path, "framework.core": path}
    assert imports_of(path, modules) == {"framework.core.registry", "framework.run.policy", "framework.core"}


def code_tokens(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every name and string in a module's code: docstrings and comments left out."""
    source = path.read_text()
    docstring_lines = {node.body[0].lineno for node in ast.walk(ast.parse(source))
                       if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                       and ast.get_docstring(node, clean=False) is not None}
    return [(token.start[0], token.string) for token in tokenize.generate_tokens(io.StringIO(source).readline)
            if token.type in (tokenize.NAME, tokenize.STRING) and token.start[0] not in docstring_lines]


def test_no_shared_module_names_an_algorithm_or_env_family():
    named = [f"{path.relative_to(ROOT)}:{line}: {text}" for name, path in project_modules().items()
             if room(name) in SHARED_ROOMS for line, text in code_tokens(path) if FAMILIES.search(text)]
    assert named == []


def test_old_flat_import_paths_import_the_new_modules_with_a_warning():
    import framework.core.algorithm
    import framework.core.env
    import framework.core.registry

    for old, new in (("algorithm", framework.core.algorithm), ("env", framework.core.env),
                     ("registry", framework.core.registry)):
        with pytest.warns(DeprecationWarning, match=rf"framework\.{old} moved to {new.__name__}"):
            module = __import__(f"framework.{old}", fromlist=["_"])
        assert module is new and module.__spec__.name == new.__name__
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from framework.registry import register_algorithm
    assert register_algorithm is framework.core.registry.register_algorithm
