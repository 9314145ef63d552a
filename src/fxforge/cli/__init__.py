"""The ``fxforge`` command line: a thin layer over the Python API.

This package holds the console-script entry point and nothing heavy: importing it does not import torch,
so that ``fxforge --help`` is fast and Ctrl-C in the first seconds (while torch loads) still ends with one
line and exit code 130. The commands live in :mod:`fxforge.cli.commands` (one module per command), their
shared options in :mod:`fxforge.cli.options`, the error handling in :mod:`fxforge.cli.app` and all rich
output in :mod:`fxforge.cli.render`.

Exit codes (docs/commands/index.md): 0 success · 1 findings (lint) or mismatch (verify) · 2 bad input ·
3 capture failed · 4 internal error · 129 hung up (SIGHUP) · 130 interrupted · 143 terminated (SIGTERM).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import sysconfig
import threading
from typing import Any

from fxforge.errors import ENDING_SIGNALS, EXIT_USAGE

EXIT_INTERRUPTED = 130  # a signal that ends the command exits 128 + its number: 143 SIGTERM, 129 SIGHUP
_sigint_seen = False
_terminated = 0  # the signal that ended the command (SIGTERM, SIGHUP), 0 for none
_interruption_reported = False
_raised = False  # the handler raised its KeyboardInterrupt: the command is stopping
_command_over = False  # run()'s command has returned: a signal now changes nothing


def _note_sigint(signum: int, frame: Any) -> None:
    global _sigint_seen, _raised
    _sigint_seen = True
    if _command_over:  # between the command's end and SIG_IGN (QA: a traceback from run(), and exit -2)
        return
    if _in_a_library_import(frame):
        # A KeyboardInterrupt raised in a library's module code while it imports can cross C++ (torch's pybind11
        # init calls back into Python) and abort the process: "terminate called after throwing an instance of
        # 'pybind11::error_already_set'", exit -6 and a stack dump (QA: 1 in 6 Ctrl-C at 0.5 s into optimize).
        # The signal is sent again shortly, until the import is over, and then raises here.
        again = threading.Timer(_REDELIVERY_S, _send_again, (os.getpid(), signum))
        again.daemon = True
        again.start()
        return
    _raised = True
    raise KeyboardInterrupt


def _send_again(pid: int, signum: int) -> None:
    """The redelivery of a signal that came during a library's import, unless a KeyboardInterrupt was raised
    meanwhile (another signal's): sent then, it raised a second one in the cleanup of the first, or in run() once the
    command was over (QA: SIGTERM then Ctrl-C 2 s into quantize: "terminated", then a traceback and exit -2)."""
    if not _raised:
        os.kill(pid, signum)


_REDELIVERY_S = 0.05
_LIBRARY_DIRS: tuple[str, ...] | None = None  # site-packages and the standard library: found at the first signal


def _library_dirs() -> tuple[str, ...]:
    global _LIBRARY_DIRS
    if _LIBRARY_DIRS is None:  # only when a signal comes: nothing added to every command's start
        paths = sysconfig.get_paths()
        _LIBRARY_DIRS = tuple({paths[k] for k in ("purelib", "platlib", "stdlib", "platstdlib") if paths.get(k)})
    return _LIBRARY_DIRS


def _in_a_library_import(frame: Any) -> bool:
    """Whether ``frame`` is library code (site-packages, the standard library) run by an import: the module code
    of torch or of what it imports. A user's model file being imported is not: Ctrl-C raises there at once."""
    if frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        # the import machinery itself, e.g. the weakref callback of a module lock: raised there, the interrupt was
        # printed as "Exception ignored in: <function _get_module_lock.<locals>.cb ...>" with a traceback, and
        # dropped (QA, SIGTERM 3.5 s into quantize)
        return True
    libraries = _library_dirs() if frame is not None else ()
    if not libraries or not frame.f_code.co_filename.startswith(libraries):
        return False
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _note_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM (``timeout``, ``docker stop``, Kubernetes) and SIGHUP (the terminal closed, an SSH session dropped)
    end the command as Ctrl-C does, through the same cleanup: by default they killed the process on the spot and
    left an export's staging directory behind (QA)."""
    global _terminated
    _terminated = signum
    _note_sigint(signum, frame)


def stop_if_interrupted() -> None:
    """Raise the KeyboardInterrupt a library swallowed (see :func:`sigint_seen`): called once torch and the
    library are imported, before any work starts."""
    if _sigint_seen:
        raise KeyboardInterrupt


def sigint_seen() -> bool:
    """Whether Ctrl-C reached this process. A KeyboardInterrupt raised while a C extension was being imported
    can be swallowed by the library importing it; the next import of that module then fails with an unrelated
    error ("cannot load module more than once per process"), which must still be reported as the interruption."""
    return _sigint_seen


def main(argv: list[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``) and return the exit code; never raises."""
    global _interruption_reported
    _interruption_reported = False  # one "interrupted" line per run (callers in one process run it again)
    _closed_streams_to_devnull()
    try:
        from fxforge.cli.app import main as run_app

        return run_app(argv)
    except KeyboardInterrupt:  # while the commands (and torch) were still being imported
        return interrupted()
    except Exception:
        if sigint_seen():  # an import the interruption broke
            return interrupted()
        raise


def _closed_streams_to_devnull() -> None:
    """A stream the shell closed (``fxforge inspect demo >&-``) is None in Python: every print raised, and the CLI
    failed at import with a traceback and exit 1, which reads as "mismatch" (QA). What is written there is
    discarded; the exit code still says how the command went.

    A stream whose encoding cannot say a character (an ASCII locale, ``PYTHONIOENCODING=ascii``) writes it
    escaped: a module or file name with an "e acute" made the command exit 4 after its output was written (QA)."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))  # noqa: SIM115 -- open for the rest of the process
        stream = getattr(sys, name)
        if hasattr(stream, "reconfigure") and getattr(stream, "errors", "strict") == "strict":
            stream.reconfigure(errors="backslashreplace")


def interrupted() -> int:
    """Ctrl-C: one line, no traceback, exit code 130 (SIGTERM: "terminated", 143)."""
    global _interruption_reported
    code = 128 + _terminated if _terminated else EXIT_INTERRUPTED
    if _interruption_reported:
        return code
    _interruption_reported = True
    try:
        sys.stderr.write(f"{interruption_word()}\n")
        sys.stderr.flush()
    except Exception:  # stderr closed: the exit code still says it
        pass
    return code


def interruption_word() -> str:
    """What stopped the command, in one word: ``interrupted`` (Ctrl-C), ``terminated`` (SIGTERM), ``hung up``."""
    if not _terminated:
        return "interrupted"
    return "hung up" if _terminated == getattr(signal, "SIGHUP", None) else "terminated"


def run() -> None:
    """Console-script entry point (``fxforge``)."""
    global _command_over
    try:
        os.getcwd()
    except FileNotFoundError:  # torch then fails to load with "Intel oneMKL FATAL ERROR: Cannot load libtorch_cpu.so"
        sys.stderr.write("error: the working directory no longer exists\nhint: cd to a directory that exists\n")
        sys.exit(EXIT_USAGE)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where SIGINT is ignored (nohup, &)
        signal.signal(signal.SIGINT, _note_sigint)
    for ending in ENDING_SIGNALS:
        if signal.getsignal(ending) is signal.SIG_DFL:  # not where it is ignored (nohup)
            signal.signal(ending, _note_sigterm)
    try:
        code = main()
    except KeyboardInterrupt:  # Ctrl-C as main returned, or a second one while the first was being reported
        code = interrupted()  # the line, unless it was already written
    # The command is over: a Ctrl-C from here on would only raise in the interpreter's shutdown, with a traceback.
    _command_over = True
    for ending in (signal.SIGINT, *ENDING_SIGNALS):
        signal.signal(ending, signal.SIG_IGN)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader stopped reading (``| head -1``): the answer stands, and the exit code is still the command's
        # (it was 1, which reads as "mismatch" after a verify that said OK). Python's own advice: point stdout at
        # devnull, so that the interpreter's last flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    _later_prints_to_stderr()
    # A KeyboardInterrupt (the handlers' SIGINT, SIGTERM or SIGHUP) raised inside code run by exec or eval of a
    # string (dataclasses and namedtuple make their methods so) sets CPython's "unhandled KeyboardInterrupt" flag,
    # even though fxforge caught it; under `python -m fxforge` the interpreter then killed itself with SIGINT after
    # exiting (QA: SIGTERM mid split ended "killed by SIGINT", -2 to subprocess, rather than 143). Each exec of a
    # string clears the flag as it starts.
    exec("")
    sys.exit(code)


def _later_prints_to_stderr() -> None:
    """After a ``--json`` document, stdout holds that document and nothing else: what the user's code prints at
    exit (``atexit`` handlers, finalizers) goes to stderr, as its prints during the command did (QA: an atexit
    print after the closing brace broke ``| python -m json.tool``)."""
    from fxforge.cli.options import json_documents_emitted

    if not json_documents_emitted():
        return
    with contextlib.suppress(AttributeError, OSError, ValueError):  # a stream without a descriptor: left as it is
        sys.stdout.flush()
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
        sys.stdout = sys.stderr


def __getattr__(name: str) -> Any:
    # ``fxforge.cli.cli``, the click group, for docs and tests: loaded only when asked for.
    if name == "cli":
        from fxforge.cli.app import cli

        return cli
    raise AttributeError(f"module 'fxforge.cli' has no attribute {name!r}")
