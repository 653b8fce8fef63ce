"""A griffe extension (mkdocs.yml's mkdocstrings `extensions:`) for docs/reference.md: `::: lightspeed.train` and the
other public names document what `import lightspeed` gives.

- The repository's framework/, algorithms/ and envs/ are `lightspeed.framework`, ... only through pyproject.toml's
  package-dir mapping (and lightspeed/__init__.py's `__path__`, in a source checkout), which griffe's static loading
  does not follow: they are loaded from the checkout beside lightspeed/ and grafted onto the `lightspeed` package,
  so that the code's own `from lightspeed.framework... import ...` resolve too.
- lightspeed/__init__.py exports its names lazily (`_EXPORTS`, a module `__getattr__`): each becomes an alias of the
  object it names, so a heading reads `lightspeed.train`, not the module that defines it.
- A class attribute without a docstring (the fields of Algorithm, ActorLearner, ...) takes its comment, as
  docs/gen_config.py reads the config dataclasses': the `#` comment ending its line, else the whole-line `#`
  comments right above it.
"""
import ast
import io
import tokenize
from pathlib import Path

import griffe

PACKAGE = "lightspeed"
MAPPED = ("framework", "algorithms", "envs")  # pyproject.toml's [tool.setuptools.package-dir] (conf/ holds no code)


class LightspeedPublicNames(griffe.Extension):
    def __init__(self) -> None:
        super().__init__()
        self._comments: dict[str, tuple[dict[int, str], dict[int, str]]] = {}

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        if pkg.name != PACKAGE:
            return
        checkout = Path(pkg.filepath).resolve().parent.parent
        loader.finder.insert_search_path(0, checkout)
        for name in MAPPED:
            if name not in pkg.members and (checkout / name / "__init__.py").is_file():
                module = loader.load(name, try_relative_path=False)
                loader.modules_collection.members.pop(name, None)
                pkg.set_member(name, module)
        exports = exported_names(Path(pkg.filepath))
        for name, module in exports.items():
            pkg.set_member(name, griffe.Alias(name, f"{module}.{name}", parent=pkg))
        pkg.exports = sorted(exports)

    def on_attribute(self, *, attr: griffe.Attribute, loader: griffe.GriffeLoader, **kwargs) -> None:
        if attr.docstring is not None or not attr.parent.is_class or attr.lineno is None:
            return
        end_of_line, whole_line = self.comments(Path(attr.filepath))
        text = end_of_line.get(attr.endlineno or attr.lineno)
        if text is None:
            above, row = [], attr.lineno - 1
            while row in whole_line:
                above.insert(0, whole_line[row])
                row -= 1
            text = " ".join(above) or None
        if text:
            attr.docstring = griffe.Docstring(text, parent=attr, parser=loader.docstring_parser,
                                              parser_options=loader.docstring_options)

    def comments(self, path: Path) -> tuple[dict[int, str], dict[int, str]]:
        """A file's comments by line: those ending a line of code, and those alone on their line."""
        if str(path) not in self._comments:
            source = path.read_text()
            lines = source.splitlines()
            end_of_line, whole_line = {}, {}
            for token in tokenize.generate_tokens(io.StringIO(source).readline):
                if token.type == tokenize.COMMENT:
                    row = token.start[0]
                    alone = lines[row - 1].strip().startswith("#")
                    (whole_line if alone else end_of_line)[row] = token.string.lstrip("#").strip()
            self._comments[str(path)] = (end_of_line, whole_line)
        return self._comments[str(path)]


def exported_names(init: Path) -> dict[str, str]:
    """lightspeed/__init__.py's `_EXPORTS`: public name -> the module that defines it."""
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "_EXPORTS" for target in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError(f"{init} has no _EXPORTS")
