"""The click group and :func:`main`, which turns every outcome into one line and a documented exit code.

Errors print one ``error:`` line (plus a ``hint:`` line) on stderr; an unexpected exception prints one
``internal error:`` line (``--debug`` or ``FXFORGE_DEBUG=1`` shows the traceback); Ctrl-C prints
``interrupted`` and exits 130. Nothing here imports torch: the commands import the library when they run.
"""

from __future__ import annotations

import ast
import contextlib
import faulthandler
import importlib
import io
import os
import pkgutil
import sys
import traceback
from pathlib import Path
from typing import Any

import click
from rich.text import Text

from fxforge import __version__
from fxforge.cli import interrupted, interruption_word, sigint_seen, stop_if_interrupted
from fxforge.cli.options import emit_json_error, forget_documents, stderr, user_prints_to_stderr, warnings_as_lines
from fxforge.errors import (
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_USAGE,
    NO_WORDS,
    SYSTEM_REFUSALS,
    FxforgeError,
    NotEnoughSpace,
    command_line_wording,
    one_line_reason,
    raised_in_user_code,
)


class _Stopped(Exception):
    """Ctrl-C (or SIGTERM) carried past click, whose own handler prints a blank line on stderr before the one
    "interrupted" line (QA: stderr was "\ninterrupted")."""


class _Group(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)  # keep declaration order: the natural workflow order

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            raise _Stopped from exc


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="fxforge")
@click.option("--debug", is_flag=True, help="Show full tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Capture, inspect, lint, rewrite, verify, export and benchmark PyTorch models as torch.fx graphs.

    MODEL is a spec: demo, torchvision:resnet18, timm:NAME, transformers:CLASS, path/to/file.py:factory,
    package.module:attr, model.pt2, model.pt (--trust-pickle), model.onnx, or a directory written by fxforge.
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug or bool(os.environ.get("FXFORGE_DEBUG"))


# The order `fxforge --help` lists commands in: the natural workflow. A command module not named here (a new
# one) is listed after these, alphabetically.
COMMAND_ORDER = ("inspect", "lint", "optimize", "verify", "quantize", "passes", "export", "bench")


def _register_commands() -> None:
    """Add every module of :mod:`fxforge.cli.commands` (each defines ``command``); importing them is cheap, as
    they import the library only when their command runs."""
    import fxforge.cli.commands as package

    names = sorted(module.name for module in pkgutil.iter_modules(package.__path__))
    ordered = [n for n in COMMAND_ORDER if n in names] + [n for n in names if n not in COMMAND_ORDER]
    for name in ordered:
        module = importlib.import_module(f"{package.__name__}.{name}")
        if module.command.help is None:
            module.command.help = _docstring_in_source(module, "command")
        cli.add_command(module.command)
    if cli.help is None:
        cli.help = _docstring_in_source(sys.modules[__name__], "cli")


def _docstring_in_source(module: Any, function: str) -> str | None:
    """``function``'s docstring read from ``module``'s source: under ``python -OO`` (PYTHONOPTIMIZE=2, which some
    production images set) docstrings are dropped, and with them every command's help (QA: ``fxforge --help``
    listed bare command names)."""
    try:
        tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, TypeError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return ast.get_docstring(node)
    return None


_register_commands()


_OFF = ("", *NO_WORDS)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and turn every error into one line and an exit code."""
    args = list(argv if argv is not None else sys.argv[1:])
    # "0", "false", "no" and "off" are off, as for FXFORGE_TRUST_PICKLE (FXFORGE_DEBUG=0 turned debug on, QA)
    debug = "--debug" in args or os.environ.get("FXFORGE_DEBUG", "").strip().lower() not in _OFF
    if "--debug" in args[1:]:  # "rerun with --debug" is followed by adding it at the end: a global option, moved
        args = ["--debug", *(arg for arg in args if arg != "--debug")]
    as_json = "--json" in args
    forget_documents()
    _report_crashes()
    try:
        if any("\x00" in arg for arg in args):  # no file name, spec or value can hold one; os calls would raise
            raise FxforgeError("an argument contains a NUL character")
        with user_prints_to_stderr(as_json), command_line_wording(), warnings_as_lines(not debug):
            cli.main(args=args, prog_name="fxforge", standalone_mode=False)
        stop_if_interrupted()  # a command without a capture step: Ctrl-C still ends it with 130
    except (KeyboardInterrupt, _Stopped):
        return _interrupted(as_json)
    except click.exceptions.Abort:  # click's own Ctrl-C (at a prompt)
        return _interrupted(as_json)
    except FxforgeError as exc:
        if debug:  # the traceback, then the same line, exit code and JSON document as without --debug
            traceback.print_exc(file=sys.stderr)
        if sigint_seen():  # the failure came from the interruption (see sigint_seen)
            return _interrupted(as_json)
        return _failed("error:", exc.message, exc.hint, exc.exit_code, as_json)
    except click.ClickException as exc:
        exc.show()
        if as_json:
            emit_json_error(exc.format_message(), None, exc.exit_code)
        return exc.exit_code
    except SystemExit as exc:
        called_at = raised_in_user_code(exc)  # None for fxforge's own exits (a command's exit code)
        if called_at is not None:
            # the model's forward, a pass or a data function ended the run: its code is no exit code of fxforge's
            # (QA: sys.exit() in a forward made inspect exit 0 with no output, sys.exit(1) read as "mismatch")
            message = f"the code fxforge ran called sys.exit({exc.code!r}) at {called_at}"
            hint = "a model, pass or data function must return or raise, not end the process"
            return _failed("error:", message, hint, EXIT_USAGE, as_json)
        if exc.code is None:
            return EXIT_OK
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except BaseException as exc:  # Ctrl-C and exits are taken above; GeneratorExit or a plug-in's own (QA: traceback)
        if debug:  # (QA: raising it gave exit 1, "findings", and no JSON document for a bad spec)
            traceback.print_exc(file=sys.stderr)
        if sigint_seen():
            return _interrupted(as_json)
        refused = _refused_by_the_system(exc)
        if refused is not None:  # a full disk or a read-only folder is the machine's state, not a bug in fxforge
            where = f": {refused.filename}" if refused.filename else ""
            said = f"{refused.strerror}{where}"
            if not isinstance(refused, NotEnoughSpace):  # fxforge's estimate, not the system's refusal
                said = f"the system refused: {said}"
            return _failed("error:", said, None, EXIT_USAGE, as_json)
        hint = "rerun with --debug for the traceback, and please report it"
        return _failed("internal error:", one_line_reason(exc), hint, EXIT_INTERNAL, as_json)
    return EXIT_OK


def _report_crashes() -> None:
    """A crash in native code (a segfault in a model's C++ extension) ends the process where no handler of Python's
    runs: without this, it left no word at all (QA). faulthandler prints "Fatal Python error: Segmentation fault"
    and the Python stack, the model's line in it; the exit status is the signal's."""
    with contextlib.suppress(AttributeError, ValueError, OSError, io.UnsupportedOperation):
        if not faulthandler.is_enabled():
            faulthandler.enable(file=sys.stderr)


def _refused_by_the_system(exc: BaseException) -> OSError | None:
    """The OSError in ``exc``'s chain (itself, its cause or context) that says the system refused a write."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in SYSTEM_REFUSALS:
            return current
        current = current.__cause__ or current.__context__
    return None


def _interrupted(as_json: bool) -> int:
    code = interrupted()
    if as_json:  # the one document a script reads: this run's answer is that it was stopped
        emit_json_error(interruption_word(), None, code)
    return code


def _failed(label: str, message: str, hint: str | None, exit_code: int, as_json: bool) -> int:
    """One error line (and its hint) on stderr; with --json, the same as stdout's JSON document too. A stream that
    cannot be written (a full device) loses the line, not the exit code (QA: a traceback, and exit 1, "mismatch")."""
    with contextlib.suppress(OSError):
        _print_line(label, "bold red", message)
        if hint:
            _print_line("hint:", "dim", hint)
    if as_json:
        with contextlib.suppress(OSError):
            emit_json_error(message, hint, exit_code)
    return exit_code


def _print_line(label: str, style: str, message: str) -> None:
    # Text, not markup: messages quote user input ("[1, 2", "[bold]") that rich would parse as markup.
    stderr.print(Text.assemble((label, style), " ", message), highlight=False, soft_wrap=True)
