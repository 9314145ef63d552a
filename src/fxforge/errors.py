"""User-facing errors: one exception type per kind of bad input, each with a one-line message, an
optional hint, and the CLI exit code it maps to.

Library code raises these instead of letting torch's long tracebacks reach the user; the CLI prints
``error: <message>`` (and ``hint: <hint>``) and exits with :attr:`FxforgeError.exit_code`.
"""

from __future__ import annotations

# Exit codes, documented in docs/commands/index.md.
EXIT_OK = 0
EXIT_FINDINGS = 1  # lint found problems / verify found a mismatch
EXIT_USAGE = 2  # bad model spec, input spec, file, option or missing extra
EXIT_CAPTURE = 3  # the model could not be captured as a graph
EXIT_INTERNAL = 4  # a bug in fxforge (or torch); rerun with --debug for the traceback


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


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type name when it has none: torch's errors run to
    dozens of lines, and a user-facing message quotes one."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def one_line_reason(exc: BaseException, limit: int = 300) -> str:
    """Why something failed, in one line for a report row: fxforge's own message, else ``Type: first line``."""
    if isinstance(exc, FxforgeError):
        return first_line(Exception(exc.message))[:limit]
    return f"{type(exc).__name__}: {first_line(exc)}"[:limit]


def require(module_name: str, extra: str, feature: str):
    """Import an optional dependency or raise :class:`MissingExtraError` naming the extra to install."""
    import importlib

    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise MissingExtraError(module_name.split(".")[0], extra, feature) from exc
