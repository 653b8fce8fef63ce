"""mkdocs hooks (mkdocs.yml `hooks:`).

- The key reference of configuration.md must be what docs/gen_config.py renders from the config dataclasses now:
  a stale page fails the build, naming the command that updates it.
- bench/README.md (the benchmarks, kept beside their scripts) is part of the site as bench.md; a page's links to
  `../bench/README.md` (right when the page is read on GitHub) lead there.
"""
import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench" / "README.md"


def on_pre_build(config) -> None:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "docs"))
    import gen_config

    problem = gen_config.stale()
    if problem:
        raise PluginError(problem)


def on_files(files, config):
    files.append(File.generated(config, "bench.md", content=BENCH.read_text()))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    return re.sub(r"\]\((?:\.\./)+bench/README\.md", "](bench.md", markdown)
