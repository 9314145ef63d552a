"""Options every command that loads a model shares, and the small helpers the commands share.

:func:`capture_options` adds ``MODEL``, ``--input``, ``--seed``, ``--device``, ``--model-arg``, ``--leaf``,
``--wrap``, ``--concrete``, ``--method``, ``--check-batch``, ``--trust-pickle`` and ``--json`` to a command and
hands it one :class:`CaptureOptions`; :meth:`CaptureOptions.prepare` turns those into a captured model through the
public API (:func:`fxforge.prepare`), exactly as a Python user would.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from fxforge.cli import stop_if_interrupted
from fxforge.display import json_text


def _piped_width() -> int:
    """Piped output gets a fixed, roomy width instead of rich's 80-column fallback; ``COLUMNS`` (a positive
    integer) sets another, so that wide tables (``inspect --nodes``) can be kept whole in a file."""
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else PIPED_WIDTH


PIPED_WIDTH = 120
PIPED_MAX_WIDTH = 200  # how far a table piped whole may widen before its text cells wrap


class _PipedConsole(Console):
    """A console that, writing to a pipe or a file, widens itself to print a wider table whole: squeezed into 120
    columns, rich cut a bench table's last column and border. A terminal keeps its own width (there, the user can
    widen the window), and so does a width the user set with ``COLUMNS``."""

    @property
    def table_room(self) -> int:
        """How wide a table printed here may be before its cells are cut (``render.print_fitted``)."""
        if self.is_terminal or os.environ.get("COLUMNS", "").isdigit():
            return self.width
        return max(self.width, PIPED_MAX_WIDTH)

    def on_broken_pipe(self) -> None:
        """The reader stopped reading (``| head -1``): print nothing more, and let the command end with its own exit
        code. rich's default raises SystemExit(1), which read as "mismatch" after a verify that said OK (QA)."""
        self.quiet = True
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.file.fileno())

    def print(self, *objects: Any, **kwargs: Any) -> None:
        tables = [o for o in objects if isinstance(o, Table)]
        if self.is_terminal or not tables or os.environ.get("COLUMNS", "").isdigit():
            return super().print(*objects, **kwargs)
        unbounded = self.options.update_width(100_000)  # rich clamps a measurement to the width it is given
        measured = [Measurement.get(self, unbounded, table) for table in tables]
        whole, unwrappable = max(m.maximum for m in measured), max(m.minimum for m in measured)
        width = self.width
        if whole <= width:
            return super().print(*objects, **kwargs)
        # whole up to PIPED_MAX_WIDTH; past it, text cells wrap (the passes table's guarantees made 2,900-column
        # lines, QA), but never narrower than the columns that cannot wrap, which rich would cut
        self.width = max(unwrappable, min(whole, PIPED_MAX_WIDTH))
        try:
            super().print(*objects, **kwargs)
        finally:
            self.width = width


stdout = _PipedConsole(highlight=False, emoji=False, width=None if sys.stdout.isatty() else _piped_width())
stderr = _PipedConsole(stderr=True, highlight=False, emoji=False, width=None if sys.stderr.isatty() else _piped_width())


# The shared options only a capture reads (see CaptureOptions.capture_only)
CAPTURE_ONLY = ("--leaf", "--wrap", "--method", "--concrete", "--check-batch")


@dataclass
class CaptureOptions:
    """What the shared options say: which model, on which inputs, captured how."""

    model: str | None
    inputs: tuple[str, ...]
    seed: int
    device: str | None
    model_args: tuple[str, ...]
    leaves: tuple[str, ...]
    method: str
    check_batch: int | None
    trust_pickle: bool
    wraps: tuple[str, ...]
    concrete: tuple[str, ...]
    as_json: bool

    def model_kwargs(self) -> dict[str, Any]:
        return parse_model_args(self.model_args)

    def capture_only(self) -> list[str]:
        """The options given that only a capture reads (``--leaf``, ``--method export``...): :meth:`load`, which does
        not capture, would ignore them, so a command that loads refuses them rather than ignore them silently."""
        given = {
            "--leaf": bool(self.leaves),
            "--wrap": bool(self.wraps),
            "--method": self.method != "auto",
            "--concrete": bool(self.concrete),
            "--check-batch": self.check_batch is not None,
        }
        return [name for name in CAPTURE_ONLY if given[name]]

    def load(self) -> tuple[Any, tuple[Any, ...]]:
        """Load the model and make its example inputs without capturing it: ``(module, inputs)``."""
        from fxforge.api import example_inputs_for
        from fxforge.models import load_model

        stop_if_interrupted()
        with status("loading model", self.as_json):
            loaded = load_model(
                self.model or "",
                seed=self.seed,
                device=self.device,
                model_kwargs=self.model_kwargs(),
                trust_pickle=self.trust_pickle or None,
            )
            return loaded.module, example_inputs_for(loaded, list(self.inputs), seed=self.seed, device=self.device)

    def prepare(self) -> Any:
        """Load and capture the model (:func:`fxforge.prepare`), with a spinner on a terminal."""
        from fxforge.api import prepare

        stop_if_interrupted()  # Ctrl-C while torch was imported, swallowed on the way: stop before any work
        with status("capturing model", self.as_json):
            return prepare(
                self.model or "",
                list(self.inputs),
                seed=self.seed,
                device=self.device,
                model_kwargs=self.model_kwargs(),
                leaf_modules=list(self.leaves),
                method=self.method,
                check_batch=self.check_batch,
                trust_pickle=self.trust_pickle or None,
                wrap=list(self.wraps),
                concrete_args=parse_assignments(self.concrete, "--concrete"),
            )


_FIELDS = (
    "model",
    "inputs",
    "seed",
    "device",
    "model_args",
    "leaves",
    "method",
    "check_batch",
    "trust_pickle",
    "wraps",
    "concrete",
)


def trust_pickle_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--trust-pickle",
        is_flag=True,
        help="Allow loading files that run code when loaded -- a pickled module (.pt), an AOTInductor package "
        "(native code) -- so only files you trust (or set FXFORGE_TRUST_PICKLE=1).",
    )(command)


def json_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout instead of tables.")(command)


def capture_options(command: Callable[..., Any] | None = None, *, model_required: bool = True):
    """Add the shared model options to a click command, which receives them as one ``opts`` argument."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def with_options(**kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in _FIELDS}
            return command(CaptureOptions(**values, as_json=kwargs.pop("as_json")), **kwargs)

        options = [
            click.argument("model", required=model_required),
            click.option(
                "--input",
                "-i",
                "inputs",
                multiple=True,
                metavar="SPEC",
                help="Example input shape, e.g. 1x3x224x224 or 1x16:int64 (1x16:int64:max=999: ids up to 999); "
                "repeat for several inputs.",
            ),
            click.option(
                "--seed",
                default=0,
                show_default=True,
                type=click.IntRange(0, 2**63 - 1),
                help="Seed for random weights and inputs.",
            ),
            click.option(
                "--device",
                type=click.Choice(["cpu", "meta"]),
                default=None,
                help="Build the model on this device; 'meta' allocates no weights (shapes and FLOPs only).",
            ),
            click.option(
                "--model-arg", "model_args", multiple=True, metavar="KEY=VALUE", help="Constructor/config argument."
            ),
            click.option("--leaf", "leaves", multiple=True, metavar="NAME", help="Keep this submodule as one node."),
            click.option(
                "--wrap",
                "wraps",
                multiple=True,
                metavar="FUNCTION",
                help="Keep this function (or a method of the model's modules) as one opaque call: module.fn, "
                "pkg.mod:fn, file.py:fn or file.py:Class.method.",
            ),
            click.option(
                "--concrete",
                multiple=True,
                metavar="NAME=VALUE",
                help="Fix a forward argument to a value (YAML), e.g. --concrete return_dict=false.",
            ),
            click.option(
                "--method",
                type=click.Choice(["auto", "symbolic_trace", "export"]),
                default="auto",
                show_default=True,
                help="Capture method; auto tries symbolic_trace (with leaves), then torch.export.",
            ),
            click.option(
                "--check-batch",
                type=click.IntRange(min=1),
                default=None,
                help="Also check the capture on this batch size.",
            ),
            trust_pickle_option,
            json_option,
        ]
        for option in reversed(options):
            with_options = option(with_options)
        return with_options

    return decorate(command) if command is not None else decorate


def parse_model_args(values: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs, each value a YAML scalar (10 -> int, 0.5 -> float, true -> bool, [1, 2] -> list)."""
    return parse_assignments(values, "--model-arg", example="num_classes=10")


def parse_assignments(values: tuple[str, ...] | list[str], option: str, example: str = "flag=false") -> dict[str, Any]:
    """``KEY=VALUE`` pairs of ``option``, each value YAML."""
    from fxforge.errors import FxforgeError
    from fxforge.references import parse_value

    parsed: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise FxforgeError(f"{option} {item!r} is not KEY=VALUE", hint=f"e.g. {option} {example}")
        parsed[key.strip()] = parse_value(raw, f"{option} {item!r}")
    return parsed


def typed_parameters() -> dict[str, click.Parameter]:
    """The current command's parameters typed on the command line (not left to their defaults), by name, in the
    command's order: what a command checks before refusing an option that another one makes useless."""
    context = click.get_current_context()
    return {
        str(param.name): param
        for param in context.command.params
        if context.get_parameter_source(str(param.name)) is ParameterSource.COMMANDLINE
    }


def parameter_label(param: click.Parameter) -> str:
    """How the command line spells a parameter: an option's first flag (``-i``), an argument's name (``MODEL``)."""
    return param.opts[0] if isinstance(param, click.Option) else param.human_readable_name


def split(text: str | None) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``."""
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def status(message: str, quiet: bool):
    """A spinner on stderr while long work runs (not when printing JSON or when stderr is not a terminal)."""
    if quiet or not stderr.is_terminal:
        return contextlib.nullcontext()
    return stderr.status(message)


# Where emit_json writes while user_prints_to_stderr is in force: the stdout the command started with.
_json_stdout: list[Any] = []


@contextlib.contextmanager
def user_prints_to_stderr(enabled: bool) -> Iterator[None]:
    """``--json`` promises one JSON document on stdout and nothing else, but the user's code runs in between (a
    ``print`` at import, in a factory or in ``forward``): while the command runs, stdout goes to stderr, and
    :func:`emit_json` alone writes to the real stdout."""
    if not enabled:
        yield
        return
    with _stdout_descriptor_to_stderr() as real_stdout:
        _json_stdout.append(real_stdout or sys.stdout)
        try:
            with contextlib.redirect_stdout(sys.stderr):
                yield
        finally:
            _json_stdout.pop()


@contextlib.contextmanager
def _stdout_descriptor_to_stderr() -> Iterator[Any]:
    """File descriptor 1 pointed at stderr for the block, and a file on the real stdout to write to; None where the
    streams have no descriptors (a test's capture). Python's redirection alone let ``os.write(1, ...)``,
    ``sys.__stdout__``, C extensions and subprocesses print into the JSON document (QA)."""
    try:
        out, err = sys.stdout.fileno(), sys.stderr.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        yield None
        return
    sys.stdout.flush()
    saved = os.dup(out)
    os.dup2(err, out)
    real = os.fdopen(os.dup(saved), "w", encoding="utf-8")
    try:
        yield real
    finally:
        real.flush()
        real.close()
        sys.stdout.flush()
        os.dup2(saved, out)
        os.close(saved)


# How many JSON documents this process has printed: a failing --json command prints its error as one, unless the
# command printed its own already (stdout holds one document either way).
_documents_emitted = [0]


def emit_json(payload: Any) -> None:
    _documents_emitted[0] += 1
    click.echo(json_text(payload, indent=2), file=_json_stdout[-1] if _json_stdout else None)


def json_documents_emitted() -> int:
    """How many JSON documents this command printed on stdout."""
    return _documents_emitted[0]


def forget_documents() -> None:
    """A new command starts (``main`` may run several in one process: tests, notebooks)."""
    _documents_emitted[0] = 0


def emit_json_error(message: str, hint: str | None, exit_code: int) -> None:
    """A --json command's failure as its JSON document (``{"ok": false, "error": ..., "hint": ..., "exit_code":
    ...}``), so that a script reading stdout gets an answer it can parse; nothing when a document went out."""
    if _documents_emitted[0] == 0:
        emit_json({"ok": False, "error": message, "hint": hint, "exit_code": exit_code})


def warn_failed_checks(captured: Any) -> None:
    for check in captured.record.checks:
        if not check.ok:
            batch = "the example inputs" if check.batch is None else f"batch {check.batch}"
            stderr.print(f"[yellow]warning:[/] captured graph differs from the model on {batch}: {check.message}")


@contextlib.contextmanager
def warnings_as_lines(enabled: bool = True) -> Iterator[None]:
    """While a command runs, a Python warning (torch's, a library's, the model's) is one ``warning:`` line, printed
    once per message: shown as Python shows them, torch's "All inputs of this cat operator must share the same
    quantization parameters" came three times with a line of generated code each (QA, a ViT's quantize)."""
    if not enabled:  # --debug: as Python shows them, with where they come from
        yield
        return
    seen: set[str] = set()

    def show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None, line: Any = None):
        # torch's C++ warnings end in "(Triggered internally at /__w/pytorch/.../X.cpp:167.)": no news to a user
        text = re.sub(r"\s*\(Triggered internally at [^()]*\)\.?$", "", " ".join(str(message).split()))
        if text and text not in seen:
            seen.add(text)
            kind = "" if issubclass(category, UserWarning) else f"{category.__name__}: "
            stderr.print(f"[yellow]warning:[/] {escape(kind + text)}", highlight=False, soft_wrap=True)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def warn(message: str) -> None:
    stderr.print(f"[yellow]warning:[/] {message}", highlight=False, soft_wrap=True)
