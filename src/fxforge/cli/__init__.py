"""The ``fxforge`` command line: a thin layer over the Python API.

This package holds the console-script entry point and nothing heavy: importing it does not import torch,
so that ``fxforge --help`` is fast and Ctrl-C in the first seconds (while torch loads) still ends with one
line and exit code 130. The commands live in :mod:`fxforge.cli.commands` (one module per command), their
shared options in :mod:`fxforge.cli.options`, the error handling in :mod:`fxforge.cli.app` and all rich
output in :mod:`fxforge.cli.render`.

Exit codes (docs/commands/index.md): 0 success · 1 findings (lint) or mismatch (verify) · 2 bad input ·
3 capture failed · 4 internal error · 130 interrupted.
"""

from __future__ import annotations

import sys
from typing import Any

EXIT_INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``) and return the exit code; never raises."""
    try:
        from fxforge.cli.app import main as run_app

        return run_app(argv)
    except KeyboardInterrupt:  # while the commands (and torch) were still being imported
        return interrupted()


def interrupted() -> int:
    """Ctrl-C: one line, no traceback, exit code 130."""
    try:
        sys.stderr.write("interrupted\n")
        sys.stderr.flush()
    except Exception:  # stderr closed: the exit code still says it
        pass
    return EXIT_INTERRUPTED


def run() -> None:
    """Console-script entry point (``fxforge``)."""
    try:
        code = main()
    except KeyboardInterrupt:  # a second Ctrl-C while the first was being reported
        code = EXIT_INTERRUPTED
    sys.exit(code)


def __getattr__(name: str) -> Any:
    # ``fxforge.cli.cli``, the click group, for docs and tests: loaded only when asked for.
    if name == "cli":
        from fxforge.cli.app import cli

        return cli
    raise AttributeError(f"module 'fxforge.cli' has no attribute {name!r}")
