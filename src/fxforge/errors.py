"""User-facing errors: one exception type per kind of bad input, each with a one-line message, an
optional hint, and the CLI exit code it maps to.

Library code raises these instead of letting torch's long tracebacks reach the user; the CLI prints
``error: <message>`` (and ``hint: <hint>``) and exits with :attr:`FxforgeError.exit_code`.
"""

from __future__ import annotations

import ast
import contextlib
import contextvars
import errno
import functools
import importlib
import importlib.util
import linecache
import os
import re
import signal
import sys
import sysconfig
import traceback
import types
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

# Exit codes, documented in docs/commands/index.md.
EXIT_OK = 0
EXIT_FINDINGS = 1  # lint found problems / verify found a mismatch
EXIT_USAGE = 2  # bad model spec, input spec, file, option or missing extra
EXIT_CAPTURE = 3  # the model could not be captured as a graph
EXIT_INTERNAL = 4  # a bug in fxforge (or torch); rerun with --debug for the traceback
# Signals that end a command as Ctrl-C does, through the same cleanup (exit 128 + the signal's number); no SIGHUP on
# Windows
ENDING_SIGNALS = tuple(s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)
# What an environment variable of fxforge's (FXFORGE_TRUST_PICKLE, FXFORGE_DEBUG) says yes and no with
YES_WORDS = ("1", "true", "yes", "on")
NO_WORDS = ("0", "false", "no", "off")

# Why the system refused a write: the disk or quota is full, the file system is read-only, no permission. The
# machine's state, not a bug and not a failed capture or export: the CLI says "the system refused" (exit 2).
SYSTEM_REFUSALS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


class NotEnoughSpace(OSError):
    """fxforge's own estimate says an output will not fit (``ENOSPC`` before anything is written): exit code 2 like
    the system's refusals, but said as the estimate it is, not as the system's refusal."""


# Whether the user is on the command line (fxforge.cli's main sets it around every command): a message names what
# the user typed, ``--check-batch 2`` there and ``check_batch=2`` in Python (see option and said).
_COMMAND_LINE = contextvars.ContextVar("fxforge_command_line", default=False)
_NO_VALUE = object()


@contextlib.contextmanager
def command_line_wording() -> Iterator[None]:
    """Messages raised inside name the CLI's options; outside, the Python API's parameters."""
    token = _COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def option(flag: str, value: Any = _NO_VALUE, *, python: str | None = None) -> str:
    """An option as the user spells it: ``--check-batch`` / ``--check-batch 2`` on the command line,
    ``check_batch`` / ``check_batch=2`` in Python (``python``: the parameter's name when it is not the flag's).
    ``value=True`` is an on/off flag: ``--force`` there, ``force=True`` here."""
    if _COMMAND_LINE.get():
        return flag if value is _NO_VALUE or value is True else f"{flag} {value}"  # a flag is on when given
    name = python or flag.lstrip("-").replace("-", "_")
    return name if value is _NO_VALUE else f"{name}={value!r}"


def said(command_line: str, python: str) -> str:
    """``command_line`` when the user is on the command line, else ``python``: advice in the user's own terms."""
    return command_line if _COMMAND_LINE.get() else python


def _running_command() -> Any:
    """The click context of the command running now, or None (the Python API; a thread click's stack is not on).
    click is looked up, not imported: where nothing imported it, no command runs."""
    click = sys.modules.get("click")
    if click is None or not _COMMAND_LINE.get():
        return None
    context = click.get_current_context(silent=True)
    return context if context is not None and context.command is not None else None


_OTHER_MODE = "fxforge.options_in_another_mode"


def options_need(flags: Iterable[str], mode: str) -> None:
    """The running command takes ``flags`` only in ``mode`` (``--concrete`` only with ``--backend fx``): a hint
    raised from here on offers them with that mode, not as though the mode running took them."""
    context = _running_command()
    if context is not None:
        context.meta.setdefault(_OTHER_MODE, {}).update(dict.fromkeys(flags, mode))


def offered(text: str, flag: str) -> str | None:
    """``text`` (advice that names ``flag``, e.g. ``--concrete scale=VALUE``) as a hint may offer it: as it is
    where the running command takes ``flag``, with the mode it needs (``... (with --backend fx)``) where it takes
    it in another mode only, None where the command has no such option -- a hint that offers an option the command
    refuses sends the user round in a circle (QA: debug and profile --backend eager offered --concrete). Outside a
    command, ``text`` itself."""
    context = _running_command()
    if context is None:
        return text
    mode = context.meta.get(_OTHER_MODE, {}).get(flag)
    if mode is not None:
        return f"{text} (with {mode})"
    taken = {name for param in context.command.params for name in (*param.opts, *param.secondary_opts)}
    return text if flag in taken else None


def option_of(command: str, flag: str, value: Any = _NO_VALUE, *, python: str | None = None) -> str:
    """``command``'s option ``flag`` (with ``value``) in advice: as :func:`option` spells it where the running command
    takes ``flag`` too (and in Python), else as ``fxforge <command> --flag value``, the command that does -- a hint
    reached from another command sent the user to an option it refuses (QA: optimize --auto's TorchScript candidate
    and bench's row were told to export with --script)."""
    spelled = option(flag, value, python=python)
    return offered(spelled, flag) or f"fxforge {command} {spelled}"


def command_name() -> str | None:
    """The name of the fxforge command running now (``debug``), or None outside the CLI."""
    context = _running_command()
    return context.command.name if context is not None else None


def refuse_without_verification(verifying: bool, switch: str, given: dict[str, bool]) -> None:
    """Refuse the options of ``given`` (flag -> whether it was given) when nothing is verified (``switch``: how
    Python spells the verification turned off, e.g. ``verify_export=False``): they only tune that verification, and
    were silently ignored (``split --no-verify --cases 64``). In the API functions, not the CLI alone, so that a
    Python caller is told too."""
    if verifying:
        return
    names = ", ".join(option(flag) for flag, is_given in given.items() if is_given)
    if names:
        verb = "has" if "," not in names else "have"
        off = option("--no-verify", python=switch)
        raise FxforgeError(f"{names} {verb} no effect with {off}: nothing is verified", hint=f"drop {names}, or {off}")


def pass_inputs_hint() -> str:
    """What to do when a step needs example inputs the capture did not get."""
    return said(
        "pass --input, e.g. --input 1x3x224x224",
        "capture it with example inputs, e.g. fxforge.prepare(model, '1x3x224x224')",
    )


class FxforgeError(Exception):
    """Base class for every error fxforge reports to a user."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} (hint: {self.hint})"


class ModelSpecError(FxforgeError):
    """The model spec names nothing loadable (unknown name, missing file, corrupt file)."""


class InputSpecError(FxforgeError):
    """An ``--input`` spec cannot be parsed, or the inputs do not fit the model."""


class MissingExtraError(FxforgeError):
    """A feature needs an optional dependency that is not installed."""

    def __init__(self, package: str, extra: str, feature: str) -> None:
        super().__init__(
            f"{feature} needs the '{package}' package, which is not installed",
            hint=f"pip install 'fxforge[{extra}]'",
        )
        self.package = package
        self.extra = extra


class CaptureError(FxforgeError):
    """Neither symbolic tracing (with leaves) nor torch.export could capture the model."""

    exit_code = EXIT_CAPTURE

    def __init__(
        self,
        message: str,
        hint: str | None = None,
        location: str | None = None,
        attempts: list | None = None,
    ) -> None:
        super().__init__(message, hint)
        self.location = location  # "path/to/file.py:42" of the user's line that blocked capture
        self.attempts = attempts or []


class DialectError(FxforgeError):
    """A feature was asked of a graph dialect it does not support."""


_ANSI = re.compile(r"\x1b\[[0-9;]*m|\[\d+m")


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour codes (torch colours some of its error messages)."""
    return _ANSI.sub("", text)


def first_line(exc: BaseException | Warning | str) -> str:
    """The first non-blank line of an exception's (or warning's) message, without terminal colour codes, or the
    type name when it has none: torch's errors run to dozens of lines, and a user-facing message quotes one."""
    lines = [line.strip() for line in strip_ansi(str(exc)).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    # torch's advice to rerun with its debug logging is for torch developers, not a step for fxforge's user
    first = _TORCH_LOGS_ADVICE.sub("", lines[0]).strip() or lines[0]
    if first.endswith(" raised:") and len(lines) > 1:
        # "backend='inductor' raised:" says who, the next line what (QA: a bench row ended at the colon)
        return f"{first} {_TORCH_LOGS_ADVICE.sub('', lines[1]).strip()}"
    return first


_TORCH_LOGS_ADVICE = re.compile(
    r"\s*(For more information, )?(re)?run with TORCH_LOGS=\S+( for more info(rmation)?)?\.?", re.IGNORECASE
)


def one_line_reason(exc: BaseException, limit: int = 300) -> str:
    """Why something failed, in one line for a report row: fxforge's own message, else ``Type: first line``."""
    if isinstance(exc, FxforgeError):
        return clipped(first_line(Exception(exc.message)), limit)
    return clipped(f"{type(exc).__name__}: {first_line(exc)}", limit)


def clipped(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters at a word's end, with "..." where it was cut (a reason that
    stopped at "; the f" read as if that were all there was)."""
    if len(text) <= limit:
        return text
    cut = text[: max(limit - 3, 1)]
    if " " in cut[limit // 2 :]:
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip(" ,;:") + "..."


# --------------------------------------------------------------------------------------------------
# the user's line: where in their code something failed


def _package_dir(name: str) -> str | None:
    spec = importlib.util.find_spec(name)
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else None


# Not the user's code: torch, fxforge itself and the standard library. A library the model comes from
# (timm, transformers) counts as the user's: its line is the model's code.
# Each ends with a separator: ".../site-packages/torch" must not claim ".../site-packages/torchvision".
_NOT_USER_PACKAGES = tuple(d.rstrip(os.sep) + os.sep for d in (_package_dir("torch"), os.path.dirname(__file__)) if d)
_STDLIB = sysconfig.get_paths()["stdlib"].rstrip(os.sep) + os.sep
# Installed packages may live below the standard library's folder (a system Python): they are not the stdlib.
_SITE_PACKAGES = tuple({sysconfig.get_paths()[key].rstrip(os.sep) + os.sep for key in ("purelib", "platlib")})


def is_user_file(filename: str) -> bool:
    """Whether ``filename`` holds the user's (model's) code rather than torch's, fxforge's or Python's."""
    if filename.startswith("<") or filename.startswith(_NOT_USER_PACKAGES):
        return False
    return not (filename.startswith(_STDLIB) and not filename.startswith(_SITE_PACKAGES))


def with_article(noun: str) -> str:
    """``"an ExportedProgram"``, ``"an int"``, ``"a GraphModule"``: a type's name in a message."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def installed_package(filename: str) -> str | None:
    """The name of the installed package ``filename`` belongs to (``transformers`` for ``.../site-packages/
    transformers/utils/generic.py``), or None for a file of the user's own: code a user cannot be told to rewrite."""
    parts = Path(os.path.abspath(filename)).parts
    # the venv's, the user's (pip --user) and Debian's (dist-packages) folders alike
    for index, part in enumerate(parts[:-1]):
        if part in ("site-packages", "dist-packages"):
            return parts[index + 1].removesuffix(".py") or None
    path = os.path.abspath(filename)
    for root in _SITE_PACKAGES:  # an installation folder of another name
        if path.startswith(root):
            return path[len(root) :].split(os.sep, 1)[0].removesuffix(".py") or None
    return None


def format_location(filename: str, lineno: int) -> str:
    """``path:line `source``` with the path relative to the working directory when it is below it. A line inside a
    statement written over several lines names the statement: its first line, and its source (an ``if``'s header)
    joined into one line (QA: ``if (`` / ``y.mean()`` / ``> 0`` named ```y.mean()```, read as no branch at all)."""
    with contextlib.suppress(ValueError):
        relative = os.path.relpath(filename)
        if not relative.startswith(".."):
            filename = relative
    lines = linecache.getlines(filename) or linecache.getlines(os.path.abspath(filename))
    first, last = _statement_span(tuple(lines), lineno)
    source = " ".join(line.strip() for line in lines[first - 1 : last]).strip()
    if len(source) > _LONGEST_SOURCE:
        source = source[: _LONGEST_SOURCE - 3].rstrip() + "..."
    return f"{filename}:{first} `{source}`" if source else f"{filename}:{lineno}"


_LONGEST_SOURCE = 160


@functools.lru_cache(maxsize=64)
def _statement_spans(lines: tuple[str, ...]) -> list[tuple[int, int]]:
    """(first, last) line of every statement of a file written over more than one line: a simple statement whole;
    of ``if``, ``while``, ``for`` and ``with``, the header only (to the line before the body); a ``def``, ``class``,
    ``try`` or ``match`` is no statement of its own here (a line in it belongs to a statement of its body)."""
    try:
        tree = ast.parse("".join(lines))
    except (SyntaxError, ValueError):
        return []
    spans = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt) or node.end_lineno is None:
            continue
        if isinstance(node, _HEADED):
            header = node.items[-1].context_expr if isinstance(node, (ast.With, ast.AsyncWith)) else None
            header = header or getattr(node, "test", None) or getattr(node, "iter", None)
            first_in_body = min([node.body[0].lineno, *(d.lineno for d in getattr(node.body[0], "decorator_list", []))])
            last = max(header.end_lineno or node.lineno, first_in_body - 1) if header is not None else node.lineno
        elif any(isinstance(getattr(node, name, None), list) for name in _NESTED):
            continue
        else:
            last = node.end_lineno
        if last > node.lineno:
            spans.append((node.lineno, last))
    return spans


_HEADED = (ast.If, ast.While, ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)
_NESTED = ("body", "cases", "handlers")  # statements holding statements: def, class, try, match


def _statement_span(lines: tuple[str, ...], lineno: int) -> tuple[int, int]:
    """The span of the innermost multi-line statement (or header) holding ``lineno``; ``(lineno, lineno)`` else."""
    holding = [(first, last) for first, last in _statement_spans(lines) if first <= lineno <= last]
    return min(holding, key=lambda span: span[1] - span[0]) if holding else (lineno, lineno)


# The file name torch.fx gives a GraphModule's generated code ("<eval_with_key>.3 from model.py:12 in forward")
_GENERATED_CODE = "<eval_with_key>"
_RECORDED_FRAME = re.compile(r'File "([^"]+)", line (\d+), in \S+\n\s*(.*)')


def recorded_user_frame(stack_trace: str) -> tuple[str, int] | None:
    """(file, line) of the innermost frame of the user's code in a stack trace recorded on a node
    (``node.meta["stack_trace"]``: torch.export records one, and fxforge's symbolic tracing does)."""
    # the user's frames inside the model's call only: those after the last of torch's or fxforge's (the CLI's own
    # callers, click's, came before them: split named click's line for a model defined in fxforge, QA)
    frames = [(file, int(line)) for file, line, _ in _RECORDED_FRAME.findall(stack_trace)]
    inner = frames[max((i + 1 for i, (file, _) in enumerate(frames) if not is_user_file(file)), default=0) :]
    return inner[-1] if inner else None


def graph_frame_source(frame: types.FrameType, lineno: int) -> tuple[str, int] | None:
    """For a frame running a GraphModule's generated code at ``lineno``: the user's line that made the node that
    line computes, from the node's recorded stack trace (None for other frames, or where none was recorded).

    A captured graph's code is generated, so a warning or an error raised while it runs names a line of
    ``<eval_with_key>``, or torch's line below it; the node it computes knows which line of the model it came from.
    """
    if not frame.f_code.co_filename.startswith(_GENERATED_CODE):
        return None
    module = frame.f_locals.get("self")
    lineno_map, graph = getattr(module, "_lineno_map", None), getattr(module, "graph", None)
    if not lineno_map or graph is None:
        return None
    index = lineno_map.get(lineno - frame.f_code.co_firstlineno)  # as torch._dynamo maps a graph's lines
    node = next(iter(list(graph.nodes)[index : index + 1]), None) if index is not None else None
    return recorded_user_frame(node.meta.get("stack_trace") or "") if node is not None else None


def user_location(exc: BaseException) -> str | None:
    """``file:line `source``` of the innermost frame of the user's code in ``exc``'s traceback (or in the
    errors it was raised from: torch.export re-raises with the original error chained)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    chain = []
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or current.__context__
    for error in chain:
        location = None
        for frame, lineno in traceback.walk_tb(error.__traceback__):
            if is_user_file(frame.f_code.co_filename):
                location = format_location(frame.f_code.co_filename, lineno)
            elif (recorded := graph_frame_source(frame, lineno)) is not None:
                location = format_location(*recorded)
        if location:
            return location
    return None


# torch's decorator wrappers (torch.no_grad() on a function): frames between a call and the function, not callers
DECORATOR_FILES = (os.path.join("torch", "utils", "_contextlib.py"),)


def says_data_dependent(text: str) -> bool:
    """Whether an exporter's or compiler's error ``text`` is about data-dependent control flow (torch.export's
    ``GuardOnDataDependentSymNode``, "data-dependent expression"), which fxforge reports with the user's line."""
    lowered = text.lower()
    return "data-dependent" in lowered or "data dependent" in lowered or "guardondatadependent" in lowered


def own_call_site(exc: BaseException) -> str | None:
    """Where ``exc`` was raised inside an installed package's model code (torchvision's ``nms``, a timm layer):
    ``file:line `source``` of the innermost frame of the user's *own* code that called into it (a file outside
    the installed packages), which :func:`user_location` passes over for the package's line; else None."""
    frames = [(frame.f_code.co_filename, lineno) for frame, lineno in traceback.walk_tb(exc.__traceback__)]
    innermost = next((i for i in range(len(frames) - 1, -1, -1) if is_user_file(frames[i][0])), None)
    if innermost is None or not frames[innermost][0].startswith(_SITE_PACKAGES):
        return None
    # outwards through the model's own call only: torch's or fxforge's frame ends it (a script calling
    # fxforge.capture is no caller of the model's code)
    for filename, lineno in reversed(frames[:innermost]):
        if filename.endswith(DECORATOR_FILES):  # torch.no_grad() around the package's function (QA)
            continue
        if not is_user_file(filename):
            return None
        if not filename.startswith(_SITE_PACKAGES):
            return format_location(filename, lineno)
    return None


def raised_in_user_code(exc: BaseException) -> str | None:
    """``file:line `source``` where ``exc`` was raised, when that is the user's own code (a ``raise`` or
    ``sys.exit`` in their forward, a recursion), not a library it called; else None."""
    frames = list(traceback.walk_tb(exc.__traceback__))
    if not frames or not is_user_file(frames[-1][0].f_code.co_filename):
        return None
    frame, lineno = frames[-1]
    return format_location(frame.f_code.co_filename, lineno)


def user_code(exc: BaseException) -> types.CodeType | None:
    """The code object of the innermost frame of the user's code in ``exc``'s traceback (see
    :func:`user_location`): which function of theirs stopped."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        codes = [f.f_code for f, _ in traceback.walk_tb(current.__traceback__) if is_user_file(f.f_code.co_filename)]
        if codes:
            return codes[-1]
        current = current.__cause__ or current.__context__
    return None


def caller_location() -> str | None:
    """``file:line `source``` of the innermost user frame on the current stack."""
    for frame in reversed(traceback.extract_stack()):
        if is_user_file(frame.filename):
            return format_location(frame.filename, frame.lineno or 0)
    return None


def outside_stacklevel() -> int:
    """``warnings.warn``'s ``stacklevel`` that points at the caller's line: the first frame above the function
    calling this that is neither fxforge's nor a decorator's (contextlib, functools). A fixed ``stacklevel=2``
    pointed at contextlib's ``return func(*args, **kwds)`` for a decorated API function (QA)."""
    frame = sys._getframe(1)
    level = 1
    ours, decorators = os.path.dirname(__file__) + os.sep, ("contextlib.py", "functools.py")
    while frame is not None and (
        frame.f_code.co_filename.startswith(ours) or frame.f_code.co_filename.endswith(decorators)
    ):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


def require(module_name: str, extra: str, feature: str):
    """Import an optional dependency or raise :class:`MissingExtraError` naming the extra to install."""
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise MissingExtraError(module_name.split(".")[0], extra, feature) from exc
