"""The tools' command lines: the module's docstring as their --help, errors in one paragraph."""
import argparse
import inspect
import sys


class OneParagraphParser(argparse.ArgumentParser):
    """argparse with this project's errors (one paragraph on stderr, exit status 2) and a module's whole docstring,
    laid out as written, as the text of --help."""

    def __init__(self, prog: str, doc: str):
        super().__init__(prog=prog, description=inspect.cleandoc(doc),
                         formatter_class=argparse.RawDescriptionHelpFormatter)

    def error(self, message: str) -> None:
        usage = " ".join(self.format_usage().split()).removeprefix("usage: ")
        print(f"Invalid command line: {message}. Usage: {usage}", file=sys.stderr)
        sys.exit(2)
