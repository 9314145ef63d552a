"""Artifacts: the files fxforge writes and reads back, and writing them so that a failure leaves nothing.

Owns the file names of an output directory, :func:`atomic_directory` and :class:`StagedOutput` (write
under a temporary name beside the target, move into place only when complete), the provenance and
input files, saving a rewritten GraphModule (:func:`save_graph_module`), and reloading exported files
with their runtimes (:func:`load_exported`, :class:`OnnxRuntimeModule`).

Which files are safe to share (they load without unpickling Python objects) is listed in
docs/security.md: ``model.pt2`` (loaded with pickles refused), TorchScript, ONNX and the JSON/text
files. ``model.pt`` is a pickled module: loading it runs code from the file, so fxforge loads it
only when the user opts in (``--trust-pickle``).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import copy
import difflib
import errno
import functools
import importlib
import importlib.metadata
import inspect
import io
import itertools
import json
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import threading
import types
import warnings
import zipfile
from collections.abc import Container, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from fxforge import display
from fxforge.callstack import call_on_fresh_chunk
from fxforge.effects import written_args
from fxforge.errors import (
    ENDING_SIGNALS,
    FxforgeError,
    InputSpecError,
    ModelSpecError,
    NotEnoughSpace,
    first_line,
    option,
    option_of,
    require,
    user_location,
)
from fxforge.graphs import ATEN, aten_packet, index_bounds, is_var_keyword
from fxforge.inputs import InputSpec, parse_input_spec, specs_of
from fxforge.machine import cpu_info
from fxforge.references import USER_MODULE_PREFIX, import_file
from fxforge.runtime import (
    ConstantKeywords,
    at_batch_two,
    batch_range_text,
    export_program_any_batch,
    fx_wraps_kept_loadable,
    holds_tensor,
    narrowed_batch,
    preserved_state,
    quiet_quantization_notices,
    quiet_torch_logs,
    with_constant_kwargs,
)
from fxforge.vocabulary import ORIGIN, PASS

MODEL_FILE = "model.pt"  # a pickled module (GraphModule, int8 model): needs --trust-pickle to load
PROGRAM_FILE = "model.pt2"  # a torch.export program: loads without unpickling code
# Copies of the user's Python files a pickle names its classes or functions from, as the modules fxforge imported
# them as (fxforge_user_<stem>.py, see fxforge.references.import_file): with this folder on sys.path the pickle
# loads anywhere, with fxforge or plain torch (write_user_sources). A split directory keeps the model's file there
# under its own name, which its loader imports (fxforge.split).
SOURCE_DIR = "source"
PACKAGE_DIR = "optimized_model"  # not "code": that would shadow the standard library module on import
REPORT_FILE = "report.json"
PLAN_FILE = "plan.json"  # a split directory's plan (fxforge split)
# Every output directory fxforge writes holds one of these, stamped as fxforge's (report.json's "written_by",
# plan.json's "format"): --force replaces only such a directory (or an empty one)
OUTPUT_MARKERS = (REPORT_FILE, PLAN_FILE)
STAMP = "fxforge"
PROVENANCE_FILE = "provenance.json"
INPUTS_FILE = "inputs.txt"
TORCHSCRIPT_FILE = "model.torchscript.pt"
ONNX_FILE = "model.onnx"
AOTI_FILE = "model.aoti.pt2"  # an AOTInductor package: compiled code and weights, loads with torch alone
RECIPE_FILE = "recipe.json"  # how fxforge's loader runs the model (autocast, torch.compile, ONNX streams): apply_recipe
METADATA_FILE = "fxforge.json"  # inside TorchScript archives, read by load_exported

FORMATS = ("torchscript", "onnx", "pt2")
SUFFIXES = {"torchscript": ".pt", "onnx": ".onnx", "pt2": ".pt2"}


def is_pickle_stream(path: Path) -> bool:
    """A bare pickle stream, as ``pickle.dump`` writes (and ``torch.save`` did before torch 1.6, when it did not
    write a zip archive): protocol 2 and up begin with the PROTO opcode, 0x80."""
    with path.open("rb") as file:
        head = file.read(2)
    return len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def format_for(path: str | Path) -> str | None:
    """The export format a file name's suffix names (``.pt`` TorchScript, ``.onnx``, ``.pt2``), or None."""
    suffix = Path(path).suffix
    return next((form for form, known in SUFFIXES.items() if suffix == known), None)


# --------------------------------------------------------------------------------------------------
# atomic output


def _refuse_unsafe_target(target: Path) -> None:
    """Replacing ``.``, a parent of the working directory, the home directory or ``/`` would delete the user's
    files along with the old output: refuse it whatever ``--force`` says."""
    resolved = target.resolve()
    cwd = Path.cwd().resolve()
    protected = {Path(resolved.anchor), Path.home().resolve()}
    if resolved == cwd or resolved in cwd.parents or resolved in protected:
        raise FxforgeError(
            f"refusing to write the output into {target} ({resolved}): replacing it would delete files fxforge "
            "did not write",
            hint="give a new directory, e.g. -o out/model",
        )


def output_target(path: str | Path) -> Path:
    """Where an output really goes: ``~`` is the home directory (``--output=~/out``, which the shell leaves alone,
    made a folder named ``~``, QA); a symlink to a directory is followed (the link stays a link)."""
    if not os.fspath(path).strip():  # Path("") is ".": refused as "the working directory", not as empty (QA)
        raise FxforgeError("the output path is empty", hint="give one, e.g. -o out/model")
    try:
        target = Path(path).expanduser()
    except RuntimeError:  # "~nouser/out": pathlib cannot find that user's home (QA: an internal error, exit 4)
        user = Path(path).parts[0][1:]
        whose = f"there is no user {user!r} whose home ~{user} would be" if user else "the home directory is unknown"
        raise FxforgeError(
            f"cannot tell where {os.fspath(path)} is: {whose}", hint="give the path without ~, e.g. ./out"
        ) from None
    if ".." in target.parts and not _exists(target.parent):
        # "missing/../out.pt2": the folder to make is "." (QA: "cannot write to missing/..: File exists"); a
        # folder that does not exist is no symlink, so reading ".." lexically means what the system would
        target = Path(os.path.normpath(target))
    refuse_undecodable_path(target)
    _refuse_long_names(target)
    if target.is_symlink():
        if not target.exists():
            raise FxforgeError(f"{target} is a broken symbolic link", hint="remove it or give another path")
        return target.resolve()
    return target


def refuse_undecodable_path(path: str | Path) -> None:
    """A path Python holds with undecodable bytes (not UTF-8, or any non-ASCII name under an ASCII locale without
    UTF-8 mode) cannot be passed to torch's file writers and readers: they aborted the process (SIGABRT) and left
    the staging directory behind, or the error blamed the model or the file (QA)."""
    try:
        os.fspath(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fspath(path).encode("utf-8", "backslashreplace").decode("ascii", "replace")
        raise FxforgeError(
            f"the path {shown} is not valid UTF-8 (or this locale cannot read its name), which torch's file "
            "functions need",
            hint="rename it (a UTF-8 name that an ASCII locale cannot read is read with PYTHONUTF8=1)",
        ) from None


def _refuse_long_names(target: Path) -> None:
    """A name longer than the file system takes (255 bytes on most) raised OSError from the first look at the path
    (exit 4, QA), and a name a little shorter could not be staged: the staging directory's name beside it
    (:func:`_staging_prefix`) is longer, and the refusal named the folder (``cannot write to .``)."""
    folder = target.parent
    while not _exists(folder) and folder != folder.parent:
        folder = folder.parent
    try:
        limit = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    for part in target.parts:
        if len(os.fsencode(part)) > limit:
            raise FxforgeError(
                f"the name {part[:32]}... is {len(os.fsencode(part))} bytes long; the file system takes {limit}",
                hint="give a shorter name",
            )
    staged = len(os.fsencode(_staging_prefix(target))) + 8  # and mkdtemp's random suffix
    if staged > limit:
        raise FxforgeError(
            f"the output name {target.name[:32]}... is too long to stage: fxforge writes it first under a name "
            f"{staged - len(os.fsencode(target.name))} bytes longer beside it, and the file system takes {limit} bytes",
            hint=f"give a name of at most {limit - (staged - len(os.fsencode(target.name)))} bytes",
        )


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long: Path.exists raises rather than say no
        return False


def check_writable(target: Path) -> None:
    """Refuse, before any work, an output whose folder cannot be written (a read-only mount, ``/sys``, no
    permission): a file is created and removed in the nearest folder of ``target``'s that exists, where the
    output (or the folders it needs) will be made. Found at the end, such a refusal wasted the whole run."""
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        handle, probe = tempfile.mkstemp(prefix=".fxforge-probe-", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        # /proc and /sys answer a new file with ENOENT, "No such file or directory", about a folder that exists
        odd = exc.errno == errno.ENOENT and folder.is_dir()
        reason = "its file system takes no new files" if odd else exc.strerror or str(exc)
        raise FxforgeError(f"cannot write to {folder}: {reason}") from None


def refuse_unreadable(path: Path, what: str = "", error: type[FxforgeError] = FxforgeError) -> None:
    """Refuse a file this user may not read (``chmod 000``), which a loader then blamed on the file ("is the file
    corrupt?"). Opened rather than asked (os.access answers for the real user id), so that ACLs and capabilities
    count as the loader will meet them. ``what``: the file's kind in the message (``calibration file``)."""
    try:
        with path.open("rb"):
            pass
    except IsADirectoryError:  # a model.pt2 that is a folder inside an output directory: internal error (QA)
        raise error(f"cannot read {what + ' ' if what else ''}{path}: it is a directory, not a file") from None
    except PermissionError:
        raise error(
            f"cannot read {what + ' ' if what else ''}{path}: permission denied",
            hint=f"check the file's permissions: ls -l {path}",
        ) from None


def refuse_special_file(path: Path) -> None:
    """Refuse, even with ``--force``, to replace what is not a regular file: a device (``/dev/null``), a pipe or a
    socket was replaced by a regular file (QA: ``--trace /dev/full --force`` as root replaced the system's device).
    A symbolic link is followed (outputs are resolved first), as a shell's ``>`` follows one."""
    if path.exists() and not path.is_file() and not path.is_dir():
        raise FxforgeError(
            f"{path} is not a regular file (a device, a pipe or a socket)", hint="give the path of a file to write"
        )


def check_output_file(target: str | Path, *, force: bool = False, reading: str | None = None) -> Path:
    """What :class:`StagedOutput` would refuse, checked before the work: a directory, an existing file without
    ``force``, a folder that cannot be written, the model being read (``reading``, a spec)."""
    _refuse_directory_spelling(target)
    refuse_output_over_input(target, reading)
    path = output_target(target)
    _refuse_existing_file(path, force)
    check_writable(path)
    return path


def _refuse_directory_spelling(target: str | Path) -> None:
    """A file output spelt with a trailing slash (``-o graph.html/``) names a directory: Path drops the slash, and a
    file ``graph.html`` was written where the user asked for a folder (QA). Refused rather than guessed at: which
    name the file should take inside that folder is the user's to say."""
    text, separators = os.fspath(target), os.sep + (os.altsep or "")
    bare = text.rstrip(separators)
    if bare and bare != text:  # "/" alone is refused as the root directory
        raise FxforgeError(
            f"{text} ends with a slash, which names a directory, but this output is a file",
            hint=f"give a file name: {bare}, or a file inside that directory: {text}{Path(bare).name}",
        )


def _refuse_existing_file(path: Path, force: bool) -> None:
    refuse_special_file(path)
    if path.is_dir():
        example = f"out/{path.stem}{path.suffix}" if path.suffix else "out/model.onnx"  # the kind asked for
        raise FxforgeError(f"{path} is a directory", hint=f"give a file name, e.g. -o {example}")
    if path.exists() and not force:
        raise FxforgeError(f"{path} exists", hint=f"pass {option('--force', True)} to replace it")


def refuse_output_over_input(target: str | Path, spec: str | None) -> None:
    """Refuse an output that would replace the model being read: ``quantize out/model.pt -o out --force`` deleted
    the user's float model with the directory, and ``export m.pt2 -o m.pt2 --force`` the program it exported (QA).
    ``spec`` is a model spec; only one naming a file or directory (``file.py:factory`` by its file) is checked."""
    if not spec:
        return
    candidates = [spec]
    file, sep, _ = spec.rpartition(":")
    if sep and file.endswith(".py"):
        candidates.append(file)
    try:
        output = Path(target).expanduser().resolve()
        read = [Path(c).expanduser().resolve() for c in candidates if Path(c).expanduser().exists()]
    except (OSError, ValueError, RuntimeError):
        return
    for path in read:
        if path == output or output in path.parents:
            raise FxforgeError(
                f"{target} would replace the model being read ({spec}): the output is written over its input",
                hint="give another output, e.g. -o out/optimized",
            )


def check_output_directory(target: str | Path, *, force: bool = False, reading: str | None = None) -> Path:
    """Where an output directory goes (:func:`output_target`), once it is known that writing there replaces nothing
    but an earlier fxforge output: called before the work too, so that a refusal does not waste it.

    A non-empty directory is replaced only with ``force``, and only when it holds a file every fxforge output has
    (:data:`OUTPUT_MARKERS`): a project folder given as ``-o`` by mistake would be deleted with all it holds.
    ``reading``: the spec of the model the command reads, which must not lie in it (:func:`refuse_output_over_input`).
    """
    target = output_target(target)
    _refuse_unsafe_target(target)
    refuse_output_over_input(target, reading)
    if target.exists() and not target.is_dir():
        raise FxforgeError(f"{target} exists and is not a directory")
    check_writable(target)
    if target.is_dir() and not os.access(target, os.W_OK):
        # the parent's permission alone would let the rename replace it: a directory its owner made read-only is
        # refused as writing into it would be, not swapped for a writable one
        raise FxforgeError(
            f"cannot write to {target}: Permission denied",
            hint=f"make it writable (chmod u+w {target}), or give another directory",
        )
    if not target.exists() or not any(target.iterdir()):
        return target
    ours = _written_by_fxforge(target)
    if not force and ours:
        raise FxforgeError(
            f"output directory {target} is not empty", hint=f"pass {option('--force', True)} to replace it"
        )
    if not ours:  # --force would be refused too: not offered (QA: a folder made there meanwhile got that hint)
        what = f"refusing to replace {target}: it" if force else f"output directory {target} is not empty: it"
        entries = sorted(entry.name for entry in target.iterdir())  # a hidden .DS_Store alone went unnamed (QA)
        held = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
        raise FxforgeError(
            f"{what} holds files ({held}) but no {' or '.join(OUTPUT_MARKERS)} written by fxforge, "
            "so it is not an fxforge output, and replacing it would delete files fxforge did not write",
            hint="give a new or empty directory, e.g. -o out/model",
        )
    return target


def _written_by_fxforge(directory: Path) -> bool:
    """Whether ``directory`` holds a report.json or plan.json stamped by fxforge. The name alone is no proof:
    report.json is a common file name, and a project folder holding one was deleted by ``split -o DIR --force``."""
    for name, key in ((REPORT_FILE, "written_by"), (PLAN_FILE, "format")):
        try:
            data = json.loads((directory / name).read_text())
        except (OSError, ValueError):  # missing, unreadable or not JSON: not ours
            continue
        if isinstance(data, dict) and str(data.get(key, "")).startswith(STAMP):
            return True
    return False


def write_report(directory: Path, report: dict[str, Any]) -> str:
    """``report.json``, stamped as fxforge's (``written_by``), so that ``--force`` may replace its directory."""
    write_json(directory / REPORT_FILE, {"written_by": f"{STAMP} {_installed_version()}".strip(), **report})
    return REPORT_FILE


def _installed_version() -> str:
    try:
        return importlib.metadata.version("fxforge")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return ""


@contextlib.contextmanager
def atomic_directory(target: str | Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``target`` only if the block succeeds.

    The staging directory sits beside the target and is renamed into place at the end; the old directory
    (``force``) is moved aside first and deleted after. On any failure -- an exception, Ctrl-C -- the
    staging directory is removed and the old output stays as it was.
    """
    target = check_output_directory(target, force=force)
    created = _missing_parents(target)
    staging: Path | None = None
    try:
        try:
            for directory in created:
                directory.mkdir()
            _remove_abandoned_staging(target)
            staging = Path(tempfile.mkdtemp(prefix=_staging_prefix(target), dir=target.parent))
            # mkdtemp makes it private (0700); the output should get the permissions of any directory the user makes
            umask = os.umask(0)
            os.umask(umask)
            staging.chmod(0o777 & ~umask)
        except OSError as exc:
            raise FxforgeError(f"cannot write to {target.parent}: {exc.strerror or exc}") from None
        yield staging
        # checked again: an output another run wrote meanwhile (or a folder the user made there) was replaced and
        # deleted without force, and both runs said "wrote" (QA)
        with _appeared_meanwhile(target):
            check_output_directory(target, force=force)
        # Ctrl-C between the two renames left no output at all, the old one hidden as .NAME.old-PID (QA): the swap
        # runs with the signals held, and the interrupt arrives once the new output is in place
        keep_attributes(target, staging)
        with signals_held():
            if target.exists():
                backup = target.with_name(f".{target.name}.old-{os.getpid()}")
                os.rename(target, backup)
                os.rename(staging, target)
            else:
                os.rename(staging, target)
                backup = None
        if backup is not None:
            shutil.rmtree(backup, ignore_errors=True)
    except BaseException:
        # Ctrl-C right after mkdtemp, before the block (QA): the staging directory must go too, even one made by
        # a mkdtemp that the interrupt stopped from returning its name
        _remove_own_staging(target)
        _remove_empty(created)
        raise


@contextlib.contextmanager
def _appeared_meanwhile(target: Path) -> Iterator[None]:
    """A refusal of ``target`` found when the work is done says that it appeared while the work ran."""
    try:
        yield
    except FxforgeError as exc:
        raise FxforgeError(
            f"{exc.message} (it appeared while this run worked: another run, or you); nothing was replaced, and "
            "this run's output is discarded",
            hint=exc.hint,
        ) from None


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while a few renames put an output in place: an interrupt between them left a mix of
    the old and the new output, or neither (QA). A signal that comes meanwhile is raised again once the block has
    ended, to the handler it would have met. (Python-level handlers, not a signal mask: the OS hands a process's
    signal to any of its threads, torch's included, and only the main thread's mask could be set.)"""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    received: list[int] = []
    previous = {held: signal.signal(held, lambda number, frame: received.append(number)) for held in _HELD}
    try:
        yield
    finally:
        for held, handler in previous.items():
            signal.signal(held, signal.SIG_DFL if handler is None else handler)  # None: a handler set outside Python
        if received:
            signal.raise_signal(received[0])


_HELD = (signal.SIGINT, *ENDING_SIGNALS)


def _staging_prefix(target: Path) -> str:
    """``.NAME.partial-PID-``: the staging directory beside ``target`` names the process that writes it."""
    return f".{target.name}.partial-{os.getpid()}-"


def keep_attributes(old: Path, new: Path) -> None:
    """``new``, about to replace ``old`` (where there is one), takes its permissions and, where the user may give it,
    its group: a 700 output directory came back 755 and a 600 export 644, readable by everyone (QA). The owner is
    the user's, as for any file they write; set-id bits of a file are dropped, as the kernel drops them on a write."""
    try:
        old_stat = old.stat()
    except OSError:  # nothing to replace
        return
    mode = stat.S_IMODE(old_stat.st_mode)
    if not stat.S_ISDIR(old_stat.st_mode):
        mode &= ~(stat.S_ISUID | stat.S_ISGID)
    with contextlib.suppress(OSError):  # a group the user is not in: the new one keeps the user's own
        if new.stat().st_gid != old_stat.st_gid:
            os.chown(new, -1, old_stat.st_gid)
    os.chmod(new, mode)


def _remove_abandoned_staging(target: Path) -> None:
    """Remove staging directories of ``target`` (and old outputs moved aside to be deleted, ``.NAME.old-PID``) left
    by a process that no longer runs. A process killed outright (SIGKILL, the out-of-memory killer, a C++ abort in
    torch's zip writer on a full disk) runs no cleanup, and its half-written output would stay beside the target for
    good."""
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.(?:partial|old)-(\d+)")
    with contextlib.suppress(OSError):
        for entry in target.parent.iterdir():
            match = pattern.match(entry.name)
            if match and entry.is_dir() and not _process_alive(int(match.group(1))):
                shutil.rmtree(entry, ignore_errors=True)


def _remove_own_staging(target: Path) -> None:
    """Remove this process's staging directories of ``target`` (:func:`_staging_prefix`)."""
    prefix = _staging_prefix(target)
    with contextlib.suppress(OSError):
        for entry in target.parent.iterdir():
            if entry.name.startswith(prefix) and entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by another user
        return True
    return True


def _missing_parents(target: Path) -> list[Path]:
    return [p for p in [*reversed(target.parent.parents), target.parent] if not p.exists()]


def _remove_empty(directories: list[Path]) -> None:
    for directory in reversed(directories):
        with contextlib.suppress(OSError):
            directory.rmdir()


class StagedOutput:
    """A staging directory beside ``target``; :meth:`commit` moves what was written there into place.

    Leaving the ``with`` block without committing (an exception, a failed verification) removes the
    staging directory and any parent directories it had to create, so nothing is left behind.
    :func:`atomic_directory` does the same for output directories; an export is one file (plus,
    for ONNX models over 2 GB, its external-data file), placed beside other files the user keeps.
    """

    def __init__(self, target: str | Path, *, force: bool = False) -> None:
        _refuse_directory_spelling(target)
        self.target = output_target(target)
        self.force = force
        self.directory: Path | None = None
        self.files: list[str] = []
        self._created: list[Path] = []

    @property
    def path(self) -> Path:
        """Where the exporter writes the main file."""
        assert self.directory is not None
        return self.directory / self.target.name

    def __enter__(self) -> StagedOutput:
        _refuse_existing_file(self.target, self.force)
        try:
            for directory in _missing_parents(self.target):
                directory.mkdir()
                self._created.append(directory)
            _remove_abandoned_staging(self.target)
            self.directory = Path(tempfile.mkdtemp(prefix=_staging_prefix(self.target), dir=self.target.parent))
        except OSError as exc:
            self._remove_created()
            raise FxforgeError(f"cannot write to {self.target.parent}: {exc.strerror or exc}") from None
        except BaseException:  # Ctrl-C here: __exit__ does not run for a failed __enter__ (QA)
            self.__exit__()
            raise
        return self

    def commit(self) -> list[str]:
        """Move the staged files into place, the main file last (so it never appears half-complete), with the
        signals held (an interrupt between two moves left the old model.onnx beside the new model.onnx.data).

        Every file that would be replaced was checked, not only the main one: an ONNX model over 2 GB writes its
        weights to ``NAME.onnx.data`` beside it, which replaced a user's file of that name without ``force`` (QA).
        """
        assert self.directory is not None
        staged = sorted(p.name for p in self.directory.iterdir())
        main = self.target.name
        # the main file again too: one written meanwhile (another run, the user) was replaced without force (QA)
        with _appeared_meanwhile(self.target):
            for name in staged:
                _refuse_existing_file(self.target.parent / name, self.force)
        for name in staged:
            keep_attributes(self.target.parent / name, self.directory / name)
        with signals_held():
            for name in [n for n in staged if n != main] + [main]:
                os.replace(self.directory / name, self.target.parent / name)
        self.files = staged
        self._created = []
        return staged

    def __exit__(self, *exc_info: Any) -> None:
        _remove_own_staging(self.target)  # self.directory, or one an interrupted mkdtemp made without naming it
        self._remove_created()

    def _remove_created(self) -> None:
        _remove_empty(self._created)
        self._created = []


# --------------------------------------------------------------------------------------------------
# what an output directory holds


def write_json(path: Path, data: Any) -> None:
    path.write_text(display.json_text(data, indent=2))


def _batch_sizes_only(
    program: torch.export.ExportedProgram, inputs: tuple[Any, ...], kwargs: dict[str, Any]
) -> str | None:
    """``"batch 2"``, ``"batch sizes up to 2"``... where ``program`` runs only those (the range torch.export
    recorded for its batch, or a run at another batch refused), else None."""
    limits = narrowed_batch(program)
    if limits is not None and limits[0] == limits[1]:
        return batch_range_text(limits)
    # a range is what the batch symbol holds, and a guard may ask more: resnet18 exported at batch 1 recorded [1, 2]
    # and a guard ``x.size()[0] == 1`` (QA: "batch sizes up to 2" for a file that refuses batch 2)
    fixed = _fixed_batch(program, inputs, kwargs)
    if fixed is not None:
        return batch_range_text((fixed, fixed))
    return batch_range_text(limits) if limits is not None else None


def _fixed_batch(program: torch.export.ExportedProgram, inputs: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """The example's batch size where ``program`` runs that batch only (it refuses the example at another batch:
    its guards, or shapes written into its ops), else None -- also where the inputs have no one batch size."""
    batched = [t for t in pytree.tree_leaves((inputs, kwargs)) if isinstance(t, torch.Tensor) and t.dim() > 0]
    if not batched or len({t.shape[0] for t in batched}) != 1:
        return None
    batch = batched[0].shape[0]
    values = (inputs, kwargs)
    other = at_batch_two(values) if batch == 1 else pytree.tree_map_only(torch.Tensor, _first_row, values)
    try:
        module = program.module()
        # preserved: the program's buffers are the model's own tensors, and a forward updating them in place changed
        # the caller's model (QA: a call counter at 1 after optimize -o)
        quiet = contextlib.redirect_stderr(io.StringIO())
        with torch.no_grad(), quiet_torch_logs(), quiet, preserved_state(module, runs=False):
            module(*other[0], **other[1])
    except Exception:
        return batch
    return None


def _first_row(tensor: torch.Tensor) -> torch.Tensor:
    return tensor[:1] if tensor.dim() > 0 else tensor


def write_inputs(directory: Path, example_inputs: Sequence[Any]) -> str:
    """``inputs.txt``: the example input specs, so ``verify`` and ``bench`` can reuse them."""
    specs = specs_of([t for t in example_inputs if isinstance(t, torch.Tensor)])
    # with their integer ranges: an Embedding(4)'s ids drawn from the default [0, 10) would fail every later command
    (directory / INPUTS_FILE).write_text("\n".join(s.text(with_range=True) for s in specs) + "\n")
    return INPUTS_FILE


def read_inputs(directory: Path) -> list[InputSpec] | None:
    """``inputs.txt`` read back (None where the directory has none).

    Raises:
        InputSpecError, OSError, UnicodeDecodeError: a damaged file.
    """
    path = directory / INPUTS_FILE
    if not path.exists():
        return None
    return [parse_input_spec(line) for line in path.read_text().split()]


# Room left beyond the weights' bytes for what else is written (code, JSON, archive headers).
FREE_SPACE_MARGIN = 16 * 2**20


def check_free_space(directory: Path, module: nn.Module, copies: int = 1) -> None:
    """Refuse, before writing, a disk without room for ``copies`` of the module's weights.

    Out of space, torch's archive writer (torch.save, torch.jit.save, torch.export.save) throws from a C++
    destructor and the process aborts: no Python error, a half-written file, the staging directory left behind.
    Raises :class:`NotEnoughSpace` (an ``OSError(ENOSPC)``) naming the directory the user gave, not a staging
    directory beside it (QA: the message named a hidden folder that no longer existed, and said the system refused).
    """
    tensors = itertools.chain(module.parameters(), module.buffers())
    weights = sum(t.numel() * t.element_size() for t in tensors if t.device.type != "meta")
    needed = copies * weights
    free = shutil.disk_usage(directory).free
    if needed + FREE_SPACE_MARGIN > free:
        visible = directory
        while visible.name.startswith(".") and ".partial-" in visible.name:
            visible = visible.parent
        copies_said = "" if copies == 1 else f" ({copies} copies of its {display.byte_size(weights)}: the files, "
        copies_said += "and the copy verification loads)" if copies > 1 else ""
        raise NotEnoughSpace(
            errno.ENOSPC,
            # the margin named too: "no room for 0.0 MiB of weights (0.1 MiB free)" read as a contradiction (QA)
            f"not enough free space: writing this model takes up to {display.byte_size(needed)} of weights"
            f"{copies_said} and {display.byte_size(FREE_SPACE_MARGIN)} for the rest, and "
            f"{display.byte_size(free)} is free",
            str(visible),
        )


@contextlib.contextmanager
def disk_full_said(directory: Path) -> Iterator[None]:
    """Say a full disk as the system's refusal (``OSError(ENOSPC)``, exit 2) where torch's archive writer fails
    with its own words: ``quantize -o`` on a full disk ended in "internal error: RuntimeError: [enforce fail at
    inline_container.cc:672] . unexpected pos 11298368 vs 11298320" (QA)."""
    try:
        yield
    except RuntimeError:
        try:
            full = shutil.disk_usage(directory).free < FREE_SPACE_MARGIN
        except OSError:
            full = False
        if full:
            raise OSError(errno.ENOSPC, "the disk filled up while writing", str(directory)) from None
        raise


def save_graph_module(
    gm: fx.GraphModule,
    directory: Path,
    example_inputs: Sequence[Any],
    dialect: str,
    example_kwargs: dict[str, Any] | None = None,
    notes: list[str] | None = None,
) -> list[str]:
    """Write ``gm`` into ``directory``; returns the names written. ``notes`` receives what could not be written.

    * ``model.pt2`` -- a ``torch.export`` program of the graph: loads without unpickling code, so it is the form
      to share and the one fxforge loads by default. Always for ATen graphs (their unlifted module cannot be
      pickled); for torch-dialect graphs when the graph exports (a leaf module with data-dependent code may not);
    * ``model.pt`` and ``optimized_model/`` (torch dialect) -- the GraphModule pickled, and as Python source plus
      weights (``GraphModule.to_folder``) when every submodule can be written that way.

    Raises :class:`FxforgeError` when no form can be written.
    """
    notes = notes if notes is not None else []
    files: list[str] = []
    problems: list[str] = []
    check_free_space(directory, gm, copies=2 if dialect == ATEN else 4)  # model.pt, its package, model.pt2
    baked = reload_bakes(gm) if dialect != ATEN else []
    if baked:
        shown = ", ".join(baked[:3]) + (f" and {len(baked) - 3} more" if len(baked) > 3 else "")
        problems.append(
            f"{MODEL_FILE}: torch.load rebuilds a pickled GraphModule by tracing its code with buffers as plain "
            f"tensors, so {shown} (computed from buffers alone) would run once while loading, not on every call; "
            f"{PROGRAM_FILE} and {PACKAGE_DIR}/ hold the graph as it is"
        )
    elif dialect != ATEN and (unloadable := _rebuild_problem(gm)) is not None:
        problems.append(f"{MODEL_FILE}: torch.load could not rebuild it from its code ({unloadable})")
    elif dialect != ATEN:
        try:
            with quiet_torch_logs(), rebuilt_with_opaque_calls(gm):
                torch.save(gm, directory / MODEL_FILE)
            files.append(MODEL_FILE)
            if write_user_sources(directory / MODEL_FILE, directory):
                files.append(f"{SOURCE_DIR}/")
        except Exception as exc:  # e.g. a TorchScript submodule, which pickle cannot save
            (directory / MODEL_FILE).unlink(missing_ok=True)
            problems.append(f"{MODEL_FILE}: {first_line(exc)}")
    if (MODEL_FILE in files or baked) and _write_package(gm, directory / PACKAGE_DIR):
        files.append(f"{PACKAGE_DIR}/")
    try:
        # a dynamic batch where the graph allows one, so that the program runs at every batch size the model does
        kwargs = dict(example_kwargs or {})
        # keyword args fixed at capture are constants of the program: model(x) then runs it, as for model.pt
        exported = gm if holds_tensor(kwargs) else with_constant_kwargs(gm, kwargs)
        kwargs = kwargs if exported is gm else {}
        if exported is gm and any(is_var_keyword(n.target) for n in gm.graph.find_nodes(op="placeholder")):
            # torch.export runs a GraphModule node by node, giving its **kwargs placeholder a list (see
            # GraphRunner); called as a module, the generated forward gives it the dict
            exported = ConstantKeywords(gm, {})
        program = export_program_any_batch(exported, tuple(example_inputs), kwargs)
        save_program(program, directory / PROGRAM_FILE, exported)
        files.append(PROGRAM_FILE)
        # read from the file users load: a program whose batch the model's code narrowed (a branch on the batch
        # size) ran batches 1 and 2 in memory and batch 2 only once saved and loaded (QA: verified at batch 1 by
        # --check-batch 1, no note)
        try:
            saved = load_program(directory / PROGRAM_FILE)
        except Exception:  # the check's own reload: the file stays, judged by the program in memory
            saved = program
        sizes = _batch_sizes_only(saved, tuple(example_inputs), kwargs)
        if sizes is not None:  # a transformers model's ATen graph holds its example's batch in its ops
            why = (
                f"the ATen graph holds the example's batch (capture with {option('--check-batch', 2)} for one that "
                "runs any batch, unless the model's code branches on the batch size)"
                if dialect == ATEN
                else "the graph fixes the batch size"
            )
            notes.append(f"{PROGRAM_FILE} runs {sizes} only: {why}")
    except Exception as exc:  # an untraceable leaf module, say: model.pt still holds everything
        (directory / PROGRAM_FILE).unlink(missing_ok=True)
        location = user_location(exc)  # the user's line torch.export stopped at, as export and capture name it
        problems.append(f"{PROGRAM_FILE}: {_program_failure(exc)}" + (f" at {location}" if location else ""))
    if not files:
        scripted = any("__torch__" in problem for problem in problems)  # pickle refusing a TorchScript submodule
        raise FxforgeError(
            "cannot save the rewritten model in any form: " + "; ".join(problems),
            hint="a TorchScript submodule cannot be pickled: keep the PyTorch module it came from in the model"
            if scripted
            else "the rewritten graph is still returned in memory (optimize's result in Python); or export the model "
            "to another format (fxforge export --to torchscript or onnx)",
        )
    notes.extend(f"not written: {problem}" for problem in problems)
    provenance = {
        node.name: {"origin": node.meta.get(ORIGIN), "pass": node.meta.get(PASS), "op": node_stem(node)}
        for node in gm.graph.nodes
    }
    (directory / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=1))
    files += [PROVENANCE_FILE, write_inputs(directory, example_inputs)]
    keyword_tensors = [name for name, value in (example_kwargs or {}).items() if holds_tensor(value)]
    if keyword_tensors:
        # inputs.txt holds positional specs, as --input does: a command given this directory alone would run it
        # without them (QA: verify of the directory failed on `out + None`)
        notes.append(
            f"{INPUTS_FILE} records the positional inputs only; the keyword tensor inputs "
            f"{', '.join(keyword_tensors)} are not: check the written model in Python, e.g. "
            "fxforge.verify(captured, output_dir), which passes them"
        )
    return files


class GraphRebuildTracer(fx.Tracer):
    """The tracer ``torch.load`` rebuilds a pickled GraphModule with, where its code calls a Python function
    capture kept as one call (a helper wrapped because it branches on values): torch's default tracer traced into
    it and failed on its control flow, so optimize wrote a model.pt that no one could load (QA). The code being
    rebuilt is the graph's own, one call per node, so every plain function it calls is kept as one call.
    Pickled by reference: such a model.pt needs fxforge importable to load."""

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        forward = type(root).forward if isinstance(root, nn.Module) else root
        for value in getattr(forward, "__globals__", {}).values():
            if _opaque_function(value):
                self._autowrap_function_ids.add(id(value))
        return super().trace(root, concrete_args)


def _opaque_function(value: Any) -> bool:
    """A plain Python function from outside torch (a user's helper), which fx would trace into."""
    return isinstance(value, types.FunctionType) and not (value.__module__ or "").startswith("torch")


@contextlib.contextmanager
def rebuilt_with_opaque_calls(gm: fx.GraphModule) -> Iterator[None]:
    """While pickling ``gm``: name :class:`GraphRebuildTracer` as its tracer where its code calls such a function
    (only there, so other model.pt files load with torch alone); ``gm`` is given back as it was."""
    needed = any(n.op == "call_function" and _opaque_function(n.target) for n in gm.graph.nodes)
    saved = gm.__dict__.get("_tracer_cls", None)
    if needed:
        gm._tracer_cls = GraphRebuildTracer
    try:
        yield
    finally:
        if needed:
            gm._tracer_cls = saved


def _rebuild_problem(gm: fx.GraphModule) -> str | None:
    """Why ``torch.load`` could not rebuild ``gm`` from its code (it traces the code again), else None: checked in
    memory through the same rebuild, with no weights written or read."""
    try:
        with quiet_torch_logs(), rebuilt_with_opaque_calls(gm), fx_wraps_kept_loadable():
            rebuild, arguments = gm.__reduce__()
            rebuild(*arguments)
    except Exception as exc:
        return f"{type(exc).__name__}: {first_line(exc)}"
    return None


def reload_bakes(gm: fx.GraphModule) -> list[str]:
    """The nodes of ``gm`` that ``torch.load`` of it pickled would run once instead of recording: torch rebuilds a
    pickled GraphModule by tracing its generated code, where parameters are proxies but buffers and constants are
    plain tensors, so an op whose inputs are only those runs while loading. ``self.calls.add_(1)`` then ran once at
    load and left the graph, ``self.ema * self.calls`` became a constant (QA: the loaded model.pt was wrong from its
    first call while model.pt2 was right)."""
    parameters = {name for name, _ in gm.named_parameters()}
    plain: set[fx.Node] = set()
    baked: list[fx.Node] = []
    for node in gm.graph.nodes:
        if node.op == "get_attr" and str(node.target) not in parameters:
            plain.add(node)
        elif node.op in ("call_function", "call_method") and set(node.all_input_nodes or [None]) <= plain:
            plain.add(node)
            baked.append(node)
    # Baked values equal the buffers' values at load unless a buffer changes in forward: only then is the file wrong
    # (a view of a constant index buffer, as in Swin, loads the same; refusing it would drop a model.pt for nothing)
    # (a first argument that is a list, as for torch._foreach_add_, is no node: not hashable, and not a buffer)
    # (effects.written_args knows the writes a name does not show: out=, inplace=True, setitem, a user's helper)
    writes_a_plain_value = any(
        any(written in plain for written in written_args(gm, node))
        for node in gm.graph.nodes
        if node.op.startswith("call")
    )
    return [node.name for node in baked] if writes_a_plain_value else []


def write_user_sources(pickled: Path, directory: Path) -> list[str]:
    """Copy into ``directory/source/`` each user file whose module ``pickled`` names (a class of ``model.py``
    pickles as ``fxforge_user_model.Net``: no such module exists in a new process). Returns the files written.

    Without them, an optimize output of a model with a leaf module or a namedtuple output from the user's file
    loaded nowhere but in the process that wrote it, neither with plain torch nor with ``fxforge.load_model``.
    """
    try:
        with zipfile.ZipFile(pickled) as archive:  # torch.save's format: the pickle is stored uncompressed
            pickles = [archive.read(name) for name in archive.namelist() if name.endswith(".pkl")]
    except zipfile.BadZipFile:
        pickles = [pickled.read_bytes()]
    named = _pickled_module_names(pickles)
    written = []
    folders = set()
    for name, module in sorted(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if name.startswith(USER_MODULE_PREFIX) and origin and Path(origin).is_file():
            folders.add(Path(origin).resolve().parent)
            if name in named:
                (directory / SOURCE_DIR).mkdir(exist_ok=True)
                shutil.copy2(origin, directory / SOURCE_DIR / f"{name}.py")
                written.append(f"{SOURCE_DIR}/{name}.py")
    # the modules beside the user's files that the pickle names too (a factory file importing its model class from
    # models.py): without them the printed load line failed, "No module named 'models'" (QA)
    for name, module in sorted(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if (
            folders
            and name.isidentifier()
            and not name.startswith(USER_MODULE_PREFIX)
            and origin
            and origin.endswith(".py")
            and Path(origin).resolve().parent in folders
            and Path(origin).name != "__init__.py"
            and name in named
            and Path(origin).is_file()  # a module imported earlier from a folder since deleted (a test's tmp_path)
        ):
            (directory / SOURCE_DIR).mkdir(exist_ok=True)
            shutil.copy2(origin, directory / SOURCE_DIR / f"{name}.py")
            written.append(f"{SOURCE_DIR}/{name}.py")
    return written


def _pickled_module_names(pickles: Sequence[bytes]) -> Container[str]:
    """The modules whose classes and functions the pickles name (their GLOBAL and STACK_GLOBAL opcodes, and the
    imports in a pickled GraphModule's code), and the packages above them. A substring search of the bytes matched
    a module called ``helpers`` inside the name of a torch module, and copied a file of another folder (QA); it is
    what is left where a pickle does not parse."""
    import pickletools

    names: set[str] = set()
    for data in pickles:
        strings: list[str] = []
        try:
            for opcode, arg, _ in pickletools.genops(data):
                if opcode.name == "GLOBAL":
                    names.add(str(arg).split(" ", 1)[0])
                elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                    names.add(strings[-2])
                elif isinstance(arg, str):
                    strings.append(arg)
                    # a GraphModule pickles its code's import block as a string: a namedtuple output or a wrapped
                    # function of the user's file is named only there (QA: no source/ written, and the
                    # directory loaded in no other process)
                    if "import " in arg:
                        names.update(_IMPORTED.findall(arg))
        except Exception:
            return _Substrings(b"".join(pickles))
    return names | {name.rsplit(".", i)[0] for name in names for i in range(1, name.count(".") + 1)}


_IMPORTED = re.compile(r"^\s*(?:from|import)\s+([A-Za-z_][\w.]*)", re.MULTILINE)


class _Substrings:
    """``name in it``: whether the bytes hold the name anywhere (a copy too many is harmless, one too few is not)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.encode() in self.data


@contextlib.contextmanager
def user_sources(directory: Path) -> Iterator[None]:
    """While unpickling in the block, the copies :func:`write_user_sources` made are the modules the pickle names.

    A module this process imported from the same code (it wrote the directory) stays as it is, so its classes are
    the ones the objects it made have. One imported from *other* code under that name -- the user's file, edited
    since the directory was written (``fxforge verify file.py:make out``), or another project's file of the same
    name -- is replaced for the block only: unpickled with the edited class, the directory computed the new code,
    and verify said OK against the model it was to be compared with."""
    replaced: dict[str, Any] = {}
    # the modules copied beside the user's files (models.py) are imported by name: on the path for the block
    sources = str(directory / SOURCE_DIR)
    on_path = (directory / SOURCE_DIR).is_dir() and sources not in sys.path
    if on_path:
        sys.path.append(sources)
    copies = {file: file.stem for file in (directory / SOURCE_DIR).glob(f"{USER_MODULE_PREFIX}*.py")}
    if (directory / PLAN_FILE).is_file():
        # a split directory keeps the model's file under its own name (source/net.py), which its pickled stages
        # name as fxforge_user_net (QA: inspect of a stage file alone could not load it)
        for file in (directory / SOURCE_DIR).glob("*.py"):
            copies.setdefault(file, USER_MODULE_PREFIX + file.stem)
    try:
        for file, module_name in sorted(copies.items()):
            present = sys.modules.get(module_name)
            if present is not None and _same_code(present, file):
                continue
            if present is not None:
                replaced[module_name] = sys.modules.pop(module_name)
            try:  # under the name the pickle refers to
                import_file(file, error=ModelSpecError, what="the pickled model's classes", module_name=module_name)
            except ModelSpecError as exc:
                sys.modules.pop(module_name, None)  # a half-run module would stand in for the file on the next load
                exc.hint = exc.hint or "a file that imports modules of its own needs them importable (on PYTHONPATH)"
                raise
        yield
    finally:
        sys.modules.update(replaced)  # the unpickled objects keep the copy's classes; the process, its modules
        if on_path:
            sys.path.remove(sources)


def _same_code(module: Any, copy: Path) -> bool:
    """Whether ``module`` was imported from a file that reads as ``copy`` does."""
    origin = getattr(module, "__file__", None)
    try:
        return origin is not None and Path(origin).read_bytes() == copy.read_bytes()
    except OSError:
        return False


def with_sources_on_path(load_line: str, directory: Path) -> str:
    """A plain-torch load line, preceded by what puts ``source/`` on ``sys.path`` when the directory has one."""
    if not any((directory / SOURCE_DIR).glob("*.py")):
        return load_line
    return f"import sys; sys.path.insert(0, '{SOURCE_DIR}'); {load_line}"


def load_line_from_anywhere(load_line: str, directory: str | os.PathLike[str]) -> str:
    """``load_line`` (naming the output's files as they are named inside ``directory``, as report.json keeps it) as a
    line that runs pasted anywhere: each file name (and ``source/``) as an absolute path under ``directory``, after
    the imports it calls (``import torch``). A printed line that assumed ``import torch`` and the output directory as
    the working directory failed pasted into a fresh interpreter elsewhere."""
    root = Path(directory).resolve()
    names = "|".join(re.escape(name) for name in _LOADED_FILES)
    line = re.sub(rf"'({names})'", lambda match: repr(str(root / match.group(1))), load_line)
    code = line.split("  # ")[0]  # a comment may name a module it does not call ("fxforge.load_model runs it...")
    needed = [
        module
        for module in ("torch", "onnxruntime", "fxforge")
        if re.search(rf"(?<![\w.]){module}\.", code) and not re.search(rf"\bimport {module}(?![\w.])", code)
    ]
    return f"import {', '.join(needed)}; {line}" if needed else line


# the names a load line quotes (deploy.PLAIN_TORCH_LOAD, with_sources_on_path)
_LOADED_FILES = (MODEL_FILE, PROGRAM_FILE, TORCHSCRIPT_FILE, ONNX_FILE, AOTI_FILE, SOURCE_DIR)


def _write_package(gm: fx.GraphModule, folder: Path) -> bool:
    """``GraphModule.to_folder``, importable from wherever the output directory is moved; False if it cannot."""
    try:
        with warnings.catch_warnings():
            # to_folder warns for every child it pickles instead of printing as source: expected here
            warnings.simplefilter("ignore")
            gm.to_folder(folder, "OptimizedModel")
        _make_folder_relocatable(folder, _user_globals(gm))
        _restore_modes_on_init(folder, gm)
        return True
    except Exception:  # modules to_folder cannot write as source: model.pt still holds everything
        shutil.rmtree(folder, ignore_errors=True)
        return False


def _user_globals(gm: fx.GraphModule) -> list[str]:
    """Imports of what the generated code names from the user's files (a namedtuple output type, a wrapped
    function): ``to_folder`` writes no import for them, so the package raised NameError when called."""
    imports = []
    for name, value in gm.graph.python_code("self").globals.items():
        module = getattr(value, "__module__", "") or ""
        qualname = getattr(value, "__qualname__", "")
        # the user's file (fxforge_user_*), a sibling module it imports them from, a package's helper: any module
        # but torch's and the builtins, which to_folder's code has (QA: NameError for nets.py's helper)
        ours = module.startswith(USER_MODULE_PREFIX) or (
            module and module != "builtins" and module.split(".")[0] not in ("torch", "math", "operator", "_operator")
        )
        if ours and qualname and "." not in qualname and "<" not in qualname and module.replace(".", "").isidentifier():
            imports.append(f"from {module} import {qualname} as {name}")
    # the modules a graph's own code generator names (capture's OrderedDict output: ``collections``), which
    # to_folder does not import either (QA: the package raised NameError: name 'collections' is not defined)
    for name, value in gm.graph._codegen.additional_globals():
        if isinstance(value, types.ModuleType):
            alias = "" if value.__name__ == name else f" as {name}"
            imports.append(f"import {value.__name__}{alias}")
    return imports


def _restore_modes_on_init(folder: Path, gm: fx.GraphModule) -> None:
    """Make the package's ``__init__`` leave every module in ``gm``'s mode (training or eval). ``to_folder``
    builds them anew, in training mode: a batch norm left unfolded normalised by the batch's statistics and
    overwrote its running ones (QA: 0.14 off the model, and still 0.05 after ``.eval()``)."""
    module = folder / "module.py"
    source = module.read_text()
    anchor = re.search(r"^( +)self\.load_state_dict\(.*$", source, re.MULTILINE)
    if anchor is None:
        raise ValueError("to_folder's code has no load_state_dict line to follow")
    training = [name for name, sub in gm.named_modules() if sub.training]
    indent = anchor.group(1)
    lines = [f"self.train({bool(training)})"]
    if training and len(training) < len(list(gm.modules())):
        lines = ["self.train(False)", f"for _name in {training!r}:", "    self.get_submodule(_name).training = True"]
    insert = "".join(f"\n{indent}{line}" for line in lines)
    module.write_text(source[: anchor.end()] + insert + source[anchor.end() :])


def _make_folder_relocatable(folder: Path, imports: Sequence[str] = ()) -> None:
    """Point ``to_folder``'s weight loads at the package's own directory, and import ``imports`` first.

    ``to_folder`` writes ``torch.load(r'<folder>/x.pt')`` with the path it was given -- here the staging
    directory, renamed away once the output is complete -- so the package would only import from there.
    """
    module = folder / "module.py"
    source = module.read_text()
    source = source.replace(f"r'{folder}/", "_HERE / r'")
    header = "import pathlib\n_HERE = pathlib.Path(__file__).resolve().parent\n"
    # the copies of the user's files its pickled submodules name (write_user_sources), beside the package
    header += (
        "import sys\n"
        f"if (_HERE.parent / {SOURCE_DIR!r}).is_dir() and str(_HERE.parent / {SOURCE_DIR!r}) not in sys.path:\n"
        f"    sys.path.insert(0, str(_HERE.parent / {SOURCE_DIR!r}))\n"
    )
    header += "".join(f"{line}\n" for line in imports)
    module.write_text(header + source)


def load_provenance(gm: fx.GraphModule, directory: Path) -> None:
    """Restore the node names and origins saved by :func:`save_graph_module` (pickling drops ``node.meta``).

    ``model.pt2`` is a re-export, and torch.export numbers nodes afresh: once fold_constants has removed
    ``arange``, the graph's ``arange_3`` comes back as ``arange_1`` -- the name of a different node of the
    captured graph, so provenance restored by name landed on the wrong nodes (verify then compared a node with
    the wrong reference node, a diff called it changed). ``provenance.json`` lists the written graph's nodes in
    graph order under their names: where the loaded graph's names differ, its nodes are matched to them (weights
    by name, the rest in graph order by what each node is, see :func:`_align`) and renamed. Nodes the re-export
    added (symbolic sizes, guards) keep a name no saved node has.
    """
    path = Path(directory) / PROVENANCE_FILE
    if not path.exists():
        return
    try:
        saved = json.loads(path.read_text())
        if not isinstance(saved, dict) or not all(isinstance(v, dict) for v in saved.values()):
            raise ValueError("expected an object of node entries")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelSpecError(
            f"{path} is corrupt: {first_line(exc)}", hint="delete it to load the model without provenance"
        ) from None
    nodes = list(gm.graph.nodes)
    if [node.name for node in nodes] != list(saved):
        # files written before "op" was recorded: what a node computes is read from its name
        stems = {name: str(entry.get("op") or _stem(name)) for name, entry in saved.items()}
        _rename_nodes(gm, _saved_names_of(nodes, stems))
    for node in gm.graph.nodes:
        node.meta.pop(ORIGIN, None)
        node.meta.pop(PASS, None)
        entry = saved.get(node.name)
        if entry:
            if entry.get("origin"):
                node.meta[ORIGIN] = entry["origin"]
            if entry.get("pass"):
                node.meta[PASS] = entry["pass"]


def _saved_names_of(nodes: list[fx.Node], saved_stems: dict[str, str]) -> dict[fx.Node, str]:
    """The name each reloaded node had when it was saved (``saved_stems``: saved name -> what the node computed,
    in graph order); a node with no saved counterpart gets a new name that no saved node has, so that it cannot
    pose as one."""
    saved_names = list(saved_stems)
    saved = set(saved_names)
    renames = {node: node.name for node in nodes if node.op == "get_attr" and node.name in saved}
    weights = set(renames.values())
    computing = [node for node in nodes if node not in renames]
    rest = [name for name in saved_names if name not in weights]
    renames.update(_align(computing, rest, saved_stems))
    taken = saved | {node.name for node in nodes}
    for node in nodes:
        if node not in renames:
            if node.name in saved:
                name = next(f"{node.name}_new{k}" for k in itertools.count() if f"{node.name}_new{k}" not in taken)
                taken.add(name)
                renames[node] = name
            else:
                renames[node] = node.name
    return renames


def _rename_nodes(gm: fx.GraphModule, names: dict[fx.Node, str]) -> None:
    """Give ``gm``'s nodes ``names`` (all distinct) by copying them into a new graph under those names: fx's
    namespace never frees a name, so renaming in place would turn a swap of two names into ``name_1``s, and a
    node renamed behind the namespace's back could later be given a name that is taken."""
    old = gm.graph
    graph = fx.Graph(tracer_cls=old._tracer_cls, tracer_extras=old._tracer_extras)
    graph._codegen = copy.deepcopy(old._codegen)
    copies: dict[fx.Node, fx.Node] = {}
    for node in old.nodes:
        args = fx.map_arg(node.args, copies.__getitem__)
        kwargs = fx.map_arg(node.kwargs, copies.__getitem__)
        copy_ = graph.create_node(node.op, node.target, args, kwargs, names[node], node.type)
        copy_.meta = copy.copy(node.meta)
        copies[node] = copy_
    gm.graph = graph  # recompiles forward from the renamed graph


def _stem(name: str) -> str:
    """``layer_norm_3`` -> ``layer_norm``, ``_assert_tensor_metadata_default_1`` -> ``_assert_tensor_metadata``:
    what a node is, without the number that makes its name unique or the overload some exports spell out."""
    return re.sub(r"_default$", "", re.sub(r"_\d+$", "", name))


def node_stem(node: fx.Node) -> str:
    """What ``node`` computes, for matching a reloaded node to its saved self: an ATen op's name without overload
    (a pass's ``aten.mul.Tensor`` node is named ``mul_tensor``, its re-export ``mul``), else :func:`_stem` of its
    name."""
    return aten_packet(node) or _stem(node.name)


def _align(nodes: list[fx.Node], names: list[str], stems: dict[str, str]) -> list[tuple[fx.Node, str]]:
    """Pairs of (reloaded node, saved name) that are the same node: in graph order within each stem.

    The re-export keeps the order of the nodes it re-traces, so where a stem has as many nodes as saved names
    the k-th node is the k-th name. Stems whose counts differ (the re-export added or dropped some: guards,
    symbolic sizes) are aligned together by difflib -- on those nodes only, as a SequenceMatcher over a
    10k-node graph of a few dozen repeating stems takes seconds.
    """
    by_stem: dict[str, tuple[list[fx.Node], list[str]]] = {}
    for node in nodes:
        by_stem.setdefault(node_stem(node), ([], []))[0].append(node)
    for name in names:
        by_stem.setdefault(stems[name], ([], []))[1].append(name)
    pairs: list[tuple[fx.Node, str]] = []
    odd_nodes: set[fx.Node] = set()
    odd_names: set[str] = set()
    for stem_nodes, stem_names in by_stem.values():
        if len(stem_nodes) == len(stem_names):
            pairs += zip(stem_nodes, stem_names)
        else:
            odd_nodes.update(stem_nodes)
            odd_names.update(stem_names)
    if odd_nodes and odd_names:
        left = [node for node in nodes if node in odd_nodes]
        right = [name for name in names if name in odd_names]
        matcher = difflib.SequenceMatcher(
            None, [node_stem(node) for node in left], [stems[name] for name in right], autojunk=False
        )
        for block in matcher.get_matching_blocks():
            pairs += [(left[block.a + k], right[block.b + k]) for k in range(block.size)]
    return pairs


# --------------------------------------------------------------------------------------------------
# exported files and their runtimes


def load_exported(
    path: str | Path,
    format: str | None = None,
    *,
    output_like: Any = None,
    threads: int | None = None,
    device: str | torch.device = "cpu",
) -> nn.Module:
    """Load a file written by :func:`export_model` as a callable module.

    ``format`` defaults to the one the suffix names (.pt TorchScript, .onnx, .pt2). TorchScript files
    flagged at export get ``optimize_for_inference`` re-applied (see the module docstring) and are loaded onto
    ``device``; ONNX files run in ONNX Runtime on the CPU (:class:`OnnxRuntimeModule`, which gives its outputs back
    on its inputs' device); ``.pt2`` programs as ``.module()``, on the device they were exported on.
    """
    path = Path(path)
    if format is not None and format not in FORMATS:  # it read "cannot tell the format" (QA)
        raise FxforgeError(f"unknown format {format!r}", hint=f"one of {', '.join(FORMATS)}")
    format = format or next((f for f, suffix in SUFFIXES.items() if path.suffix == suffix), None)
    if format not in FORMATS:
        raise FxforgeError(f"cannot tell the format of {path}", hint="name it .pt, .onnx or .pt2, or pass the format")
    if not path.is_file():
        raise ModelSpecError(f"file not found: {path}")
    try:
        return _load_exported(path, format, output_like, threads, torch.device(device))
    except FxforgeError:
        raise
    except Exception as exc:  # each runtime raises its own error types for a damaged file
        if "NOT_IMPLEMENTED" in str(exc) or "Could not find an implementation" in str(exc):
            # a well-formed file whose op ONNX Runtime has no CPU kernel for (a bf16 Gemm): no corruption (QA)
            raise ModelSpecError(
                f"ONNX Runtime cannot run {path}: {first_line(exc)}",
                hint="it has no kernel for an op in the file in that dtype: export the model in float32, or to "
                "another format",
            ) from None
        raise ModelSpecError(f"cannot read {path}: {first_line(exc)}", hint="is the file corrupt?") from None


def _load_exported(path: Path, format: str, output_like: Any, threads: int | None, device: torch.device) -> nn.Module:
    with quiet_torch_logs():
        if format == "torchscript":
            extra = {METADATA_FILE: ""}
            with quiet_quantization_notices():  # an int8 file's tensors are made while loading
                module = torch.jit.load(str(path), map_location=device, _extra_files=extra)
            metadata = json.loads(extra[METADATA_FILE] or "{}")
            if metadata.get("optimize_at_load"):
                module = torch.jit.optimize_for_inference(module)
            if metadata.get("onednn_fusion"):
                module = OnednnFusion(module)
            structure = metadata.get("output_structure")
            return StructuredOutputs(module, structure) if structure is not None else module
        if format == "onnx":
            return OnnxRuntimeModule(path, output_like, threads)
        return program_module(load_program(path))


# Libraries whose output classes (transformers' ModelOutput dataclasses...) register themselves as pytree types
# when their module is imported, which transformers does lazily. torch.export.load needs every type a program's
# signature names registered, so fxforge imports the modules of these packages itself (another package's type
# is an error that names the module to import: fxforge does not import arbitrary modules a file names).
PYTREE_TYPE_PACKAGES = ("transformers", "diffusers", "timm", "torchvision")


# Where fxforge records the model's names of a program's positional inputs (a JSON list): the name of an extra
# file inside a model.pt2 archive, where the program's own names are not them (a program exported through a
# wrapper that takes ``*args`` -- channels-last layout, --concrete values fixed -- names its inputs ``args_0``,
# ``args_1``...), and the metadata key of an AOTInductor package, which takes its inputs by position only while a
# transformers user calls ``model(**tokenizer(text))``.
ARGUMENTS_KEY = "fxforge.arguments"
# ... which :func:`load_program` keeps on the program it returns, for :func:`program_module`
_RECORDED_NAMES = "_fxforge_argument_names"


def _program_failure(exc: Exception) -> str:
    """Why torch.export made no program, in a line: torch's message for an output type it does not know runs four
    lines about a pytree registration and a GitHub issue (QA: a dataclass output, in optimize's notes)."""
    if "data-dependent" in str(exc):
        return "data-dependent control flow"
    unknown = re.search(r"Found <class '([^']+)'> in output, which is not a known type", str(exc))
    if unknown:
        kind = unknown.group(1).rpartition(".")[2]
        return (
            f"the model returns {kind}, a type torch.export cannot take apart (return a dict or tuple, or register "
            f"it: torch.export.register_dataclass({kind}) for a dataclass)"
        )
    return first_line(exc)


def save_program(program: torch.export.ExportedProgram, path: str | Path, source: nn.Module | None = None) -> None:
    """``torch.export.save``, recording the names ``source`` (what was exported) gives its positional inputs --
    its wrapped model's, through fxforge's wrappers that take ``*args`` -- where the program's own differ, so
    that the program's module takes inputs by the model's names."""
    own = positional_names(program.module()) if source is not None else None
    names = argument_names(unwrapped(source), len(own)) if source is not None and own else None
    extra = {ARGUMENTS_KEY: json.dumps(names)} if names and own != names else None
    try:
        with quiet_torch_logs():
            torch.export.save(program, str(path), extra_files=extra)
    except NotImplementedError as exc:
        if "namedtuple" not in str(exc):
            raise
        # torch's message points at a private registration; what a user can do is another format or output (QA)
        kind = re.search(r"namedtuple class <class '([^']+)'>", str(exc))
        raise FxforgeError(
            f"a .pt2 file cannot hold the model's namedtuple output type{f' {kind.group(1)}' if kind else ''}: "
            "torch.export saves only the output types registered with it by name",
            # not TorchScript: its trace refuses a namedtuple inside a dict of other values, and sent the user back
            hint=f"export with {option_of('export', '--to', 'onnx')}, whose file records it (fxforge.load_model "
            "returns it), or return a tuple or dict of tensors",
        ) from None


def unwrapped(module: nn.Module) -> nn.Module:
    """The model inside fxforge's input-passing wrappers (layout, fixed keywords), which take ``*args``."""
    while isinstance(module, (ChannelsLastModule, ConstantKeywords)):
        module = module.model if isinstance(module, ChannelsLastModule) else module.module
    return module


def load_program(path: str | Path) -> torch.export.ExportedProgram:
    """``torch.export.load(path)``, after importing the modules that define the pytree types its signature
    names (see :data:`PYTREE_TYPE_PACKAGES`): a transformers model's program returns e.g.
    ``BaseModelOutputWithPooling``, and in a process that has not imported ``transformers.modeling_outputs``,
    plain ``torch.export.load`` refuses the file. The input names :func:`save_program` recorded come with it.

    Raises:
        FxforgeError: the program names a type from another package that is not imported yet.
    """
    import_pytree_types(_pytree_types(Path(path)), Path(path).name)
    extra = {ARGUMENTS_KEY: ""}
    program = torch.export.load(str(path), extra_files=extra)
    with contextlib.suppress(ValueError, TypeError):
        names = json.loads(extra[ARGUMENTS_KEY] or "null")
        if isinstance(names, list) and all(isinstance(n, str) for n in names):
            setattr(program, _RECORDED_NAMES, names)
    return program


def program_module(program: torch.export.ExportedProgram) -> nn.Module:
    """``program.module()``, called as the model is: inputs by name too (torch's module takes a program exported
    from positional inputs by position only: ``model(**tokenizer(text))`` raised "kwarg keyword mismatch"), and
    dicts returned as plain dicts (fx returns its immutable_dict, whose ``pop`` raised)."""
    module = program.module()
    names = positional_names(module)
    recorded = getattr(program, _RECORDED_NAMES, None)
    if names and recorded and len(recorded) == len(names):  # the model's names, not a wrapper's args_0
        names = recorded
    in_spec = program.call_spec.in_spec
    keywords = in_spec is not None and in_spec.num_children == 2 and _child(in_spec, 1).num_leaves > 0
    if names and not keywords:  # a program exported with keywords takes those itself
        required = sum(1 for p in inspect.signature(module.forward).parameters.values() if p.default is p.empty)
        module.register_forward_pre_hook(_ByPosition(names, required), prepend=True, with_kwargs=True)
    module.register_forward_hook(_plain_output)
    return module


class _ByPosition:
    """A forward pre-hook (an object, not a closure: the module stays picklable) that passes keyword inputs by
    position, and names a wrong number of inputs in one line (torch's message spans ten lines of tree specs)."""

    def __init__(self, names: list[str], required: int) -> None:
        self.names, self.required = names, required

    def __call__(self, _module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        bound = bind_keywords(self.names, args, kwargs, "the exported program")
        if not self.required <= len(bound) <= len(self.names):
            takes = f"{display.counted(len(self.names), 'input')} ({', '.join(self.names)})"
            raise TypeError(f"the exported program takes {takes}, got {len(bound)}")
        return (bound, {}) if kwargs else None


def _plain_output(_module: nn.Module, _args: Any, output: Any) -> Any:
    return plain_containers(output)


def _child(spec: Any, index: int) -> Any:
    # TreeSpec.child is torch 2.14's; children_specs, older torch's, warns there that it is deprecated
    return spec.child(index) if hasattr(spec, "child") else spec.children_specs[index]


def positional_names(module: nn.Module) -> list[str] | None:
    """The names of ``module.forward``'s positional parameters (None where it takes ``*args``)."""
    try:
        parameters = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_POSITIONAL for p in parameters):
        return None
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)] or None


def plain_containers(value: Any) -> Any:
    """``value`` with torch.fx's immutable dicts and lists (what a GraphModule returns) as plain ones."""
    if isinstance(value, dict):
        items = {k: plain_containers(v) for k, v in value.items()}
        return dict(items) if isinstance(value, fx.immutable_collections.immutable_dict) else type(value)(items)
    if isinstance(value, list):
        return [plain_containers(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields") and type(value) is tuple:
        return tuple(plain_containers(v) for v in value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple: its fields too (QA)
        return type(value)(*(plain_containers(v) for v in value))
    return value


def import_pytree_types(types: set[str], what: str) -> None:
    """Import the modules that register ``types`` (serialized pytree type names) as torch needs them to read a
    saved call signature, for the packages of :data:`PYTREE_TYPE_PACKAGES`.

    Raises:
        FxforgeError: a type of another package is not registered yet (``what`` names the file).
    """
    for module in _modules_of(types):
        if module.partition(".")[0] in PYTREE_TYPE_PACKAGES:
            with contextlib.suppress(ImportError):  # the check below then names what is missing
                importlib.import_module(module)
    missing = sorted(name for name in types if name not in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE)
    if missing:
        module = missing[0].rpartition(".")[0]
        raise FxforgeError(
            f"{what} passes values of type {missing[0]}, which torch can read only once {module} is imported",
            hint=f"import {module} before loading it (fxforge imports only {', '.join(PYTREE_TYPE_PACKAGES)} "
            "modules by itself)",
        )


def spec_types(serialized: Sequence[str]) -> set[str]:
    """The pytree type names in serialized tree specs (``treespec_dumps``), torch's and Python's own left out."""
    names: set[str] = set()

    def collect(spec: Any) -> None:
        if isinstance(spec, dict):
            if isinstance(spec.get("type"), str):
                names.add(spec["type"])
            for child in spec.get("children_spec") or ():
                collect(child)
        elif isinstance(spec, list):
            for item in spec:
                collect(item)

    for text in serialized:
        with contextlib.suppress(ValueError, TypeError):
            collect(json.loads(text))
    return {name for name in names if not name.startswith(("builtins.", "collections.", "torch."))}


def signature_imports(serialized: Sequence[str]) -> list[str]:
    """The modules to import before torch can read a call signature of these serialized tree specs."""
    return _modules_of(spec_types(serialized))


def program_imports(path: str | Path) -> list[str]:
    """The modules to import before plain ``torch.export.load(path)`` can read it: those that define the pytree
    types (output classes) its signature names, torch's own left out. Empty for a damaged file (torch reports
    it when loading)."""
    return _modules_of(_pytree_types(Path(path)))


def _modules_of(types: set[str]) -> list[str]:
    return sorted({name.rpartition(".")[0] for name in types if "." in name})


def _saved_programs(path: Path) -> list[dict[str, Any]]:
    """The serialized programs (``models/*.json``) of a ``.pt2`` archive, read without torch: empty for a file that
    is no such archive."""
    try:
        with zipfile.ZipFile(path) as archive:
            programs = [json.loads(archive.read(m)) for m in archive.namelist() if m.endswith("models/model.json")]
    except (OSError, zipfile.BadZipFile, ValueError):
        return []
    return [program for program in programs if isinstance(program, dict)]


def _pytree_types(path: Path) -> set[str]:
    """The serialized type names in the input and output specs of a saved program's module call graph."""
    serialized = []
    try:
        for program in _saved_programs(path):
            for entry in program.get("graph_module", {}).get("module_call_graph", []):
                signature = entry.get("signature") or {}
                texts = (signature.get("in_spec"), signature.get("out_spec"))
                serialized += [text for text in texts if isinstance(text, str)]
    except (AttributeError, TypeError):
        return set()
    return spec_types(serialized)


def pt2_torch_version(path: str | Path) -> str | None:
    """The torch version a ``.pt2`` archive records as the one that wrote it, or None."""
    versions = [p.get("torch_version") for p in _saved_programs(Path(path))]
    return next((v for v in versions if isinstance(v, str)), None)


# The metadata key under which fxforge's ONNX export records the model's output structure (dicts, namedtuples,
# transformers outputs, constants): an ONNX graph returns a flat list of tensors.
OUTPUT_STRUCTURE_KEY = "fxforge.output_structure"


class _NotDescribable(Exception):
    pass


def describe_structure(value: Any) -> Any | None:
    """A JSON-able description of an output's structure, its tensors as ``"tensor"``; None for a container or
    constant that JSON cannot carry (an ONNX file then returns its flat list)."""
    try:
        return _describe(value)
    except _NotDescribable:
        return None


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return "tensor"
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    if isinstance(value, tuple) and hasattr(type(value), "_fields"):
        return {"namedtuple": type(value).__name__, "fields": list(value._fields), "items": _described(value)}
    # keys kept as [key, item] pairs: JSON objects would turn int keys into strings
    if isinstance(value, dict) and all(isinstance(key, (str, int)) and not isinstance(key, bool) for key in value):
        items = [[key, _describe(item)] for key, item in value.items()]
        if type(value) is dict:
            return {"dict": items}
        if type(value) is collections.OrderedDict:
            return {"ordered_dict": items}
        if hasattr(value, "to_tuple"):  # a transformers ModelOutput: rebuilt as its class where it can be imported
            return {"class": f"{type(value).__module__}.{type(value).__qualname__}", "items": items}
    if type(value) in (list, tuple):
        return {type(value).__name__: _described(value)}
    raise _NotDescribable(type(value).__name__)


def _described(values: Sequence[Any]) -> list[Any]:
    return [_describe(value) for value in values]


def scripted_output_structure(output: Any) -> Any | None:
    """The description of ``output`` (:func:`describe_structure`) where TorchScript would return another structure:
    it keeps tensors, tuples, lists and plain dicts, and returns a namedtuple as a tuple, a transformers output as a
    dict. None where TorchScript's own structure is the model's (or the output cannot be described)."""
    described = describe_structure(output)
    return described if _holds_kind(described, ("namedtuple", "class", "ordered_dict")) else None


def _holds_kind(description: Any, kinds: tuple[str, ...]) -> bool:
    """Does a :func:`describe_structure` description hold a container of one of ``kinds`` at any depth?"""
    if isinstance(description, dict):
        return any(kind in description for kind in kinds) or any(
            _holds_kind(item, kinds) for item in description.values()
        )
    if isinstance(description, list):
        return any(_holds_kind(item, kinds) for item in description)
    return False


def _tensors_in(description: Any) -> int:
    """How many tensors a description holds: rebuilt with counted numbers in the tensors' places."""
    placeholders = itertools.count()
    rebuild_structure(description, placeholders)  # type: ignore[arg-type]
    return next(placeholders)


@functools.cache
def _look_alike_namedtuple(name: str, fields: tuple[str, ...]) -> type:
    """A namedtuple class of the user's name and fields (theirs is in their code, which an ONNX file does not
    carry): the same attributes and positions; one class per name and fields, so outputs compare by type."""
    return collections.namedtuple(name, fields)  # type: ignore[misc]


def _output_class(path: str) -> type | None:
    module, _, name = path.rpartition(".")
    if module.partition(".")[0] not in PYTREE_TYPE_PACKAGES:
        return None  # fxforge imports no other module a file names
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def structure_tensor_count(description: Any) -> int:
    """How many tensors the structure :func:`describe_structure` described holds; ValueError where ``description``
    is none it writes (a hand-edited file: QA, a plan.json's ``{"bogus": 1}`` read as a mismatch, not a damaged
    file)."""
    if description == "tensor":
        return 1
    if not isinstance(description, dict):
        raise ValueError(f"not an output structure: {description!r}")
    if "value" in description:
        return 0
    if "namedtuple" in description:
        fields = description.get("fields")
        if (
            not isinstance(fields, list)
            or not all(isinstance(f, str) and f.isidentifier() for f in fields)
            or len(set(fields)) != len(fields)
            or not isinstance(description.get("items"), list)
            or len(description["items"]) != len(fields)
        ):
            raise ValueError("a namedtuple's fields do not match its items")
    for kind in ("dict", "ordered_dict"):
        pairs = description.get(kind)
        if isinstance(pairs, list):
            keys = {json.dumps(pair[0]) for pair in pairs if isinstance(pair, list) and pair}
            if len(keys) != len(pairs):
                raise ValueError(f"a {kind} with a key twice")
    for kind in ("list", "tuple", "items" if "namedtuple" in description else ""):
        if kind and isinstance(description.get(kind), list):
            return sum(structure_tensor_count(item) for item in description[kind])
    for kind in ("dict", "ordered_dict", "items" if "class" in description else ""):
        pairs = description.get(kind) if kind else None
        if isinstance(pairs, list) and all(isinstance(pair, list) and len(pair) == 2 for pair in pairs):
            return sum(structure_tensor_count(item) for _, item in pairs)
    raise ValueError(f"not an output structure: {json.dumps(description)[:80]}")


def rebuild_structure(description: Any, tensors: Iterator[torch.Tensor]) -> Any:
    """The output :func:`describe_structure` described, with ``tensors`` in its tensors' places (pytree order)."""
    if description == "tensor":
        return next(tensors)
    if "value" in description:
        return description["value"]
    if "namedtuple" in description:
        cls = _look_alike_namedtuple(description["namedtuple"], tuple(description["fields"]))
        return cls(*(rebuild_structure(item, tensors) for item in description["items"]))
    if "list" in description or "tuple" in description:
        kind = "list" if "list" in description else "tuple"
        items = [rebuild_structure(item, tensors) for item in description[kind]]
        return items if kind == "list" else tuple(items)
    if "ordered_dict" in description:
        pairs = description["ordered_dict"]
        return collections.OrderedDict((key, rebuild_structure(item, tensors)) for key, item in pairs)
    items = {key: rebuild_structure(item, tensors) for key, item in description.get("dict", description.get("items"))}
    cls = _output_class(description["class"]) if "class" in description else None
    return cls(**items) if cls is not None else items


# An AOTInductor package written by fxforge records its inputs' names under ARGUMENTS_KEY, and its input specs (the
# text of inputs.txt, one line per input) here, which it runs and does not check itself: a package copied without its
# directory's inputs.txt still refuses other shapes
INPUTS_KEY = "fxforge.inputs"
# ... and the index bounds of its inputs that embeddings look up (:func:`~fxforge.graphs.index_bounds`, a JSON
# object from input position to rows): compiled code aborts the process on an out-of-range index
BOUNDS_KEY = "fxforge.index_bounds"


def check_index_bounds(bounds: dict[int, int], args: Any, names: Sequence[str] | None = None) -> None:
    """Raise ``IndexError`` (one line, as eager's embedding does) where a flat input of ``args`` at a position of
    ``bounds`` holds an index outside ``[0, rows)``: compiled code checks the bound inside a parallel loop, where the
    failure aborts the process instead of raising (C++ ``terminate``), and ONNX's Gather reads -1 as the last row."""
    if not bounds:
        return
    flat = pytree.tree_leaves(args)
    for position, rows in bounds.items():
        value = flat[position] if position < len(flat) else None
        if not isinstance(value, torch.Tensor) or value.is_floating_point() or not value.numel():
            continue
        low, high = int(value.min()), int(value.max())
        if low < 0 or high >= rows:
            name = names[position] if names and position < len(names) else f"#{position}"
            raise IndexError(
                f"input {name} holds index {low if low < 0 else high}, out of range for the embedding it is looked "
                f"up in ({rows} rows: 0 to {rows - 1}), as the model's embedding would say"
            )


def argument_names(module: nn.Module, count: int) -> list[str] | None:
    """The names of the first ``count`` parameters of ``module.forward`` (the inputs an artifact built from it takes by
    position), or None where they have no names (``*args``)."""
    names = positional_names(module)
    return names[:count] if names and len(names) >= count else None


def bind_keywords(names: Sequence[str] | None, args: tuple[Any, ...], kwargs: dict[str, Any], what: str) -> tuple:
    """``args`` and ``kwargs`` as the positional inputs of an artifact whose inputs are named ``names`` (in order):
    compiled files take inputs by position only, a model's users call it by name too. Raises TypeError, as Python
    does for a function, naming the input that is unknown, given twice or missing."""
    if not kwargs:
        return args
    if not names:
        raise TypeError(f"{what} takes its inputs by position only, got {', '.join(map(repr, kwargs))} by name")
    listed = ", ".join(names)
    for name in kwargs:
        if name not in names:
            raise TypeError(f"{what} has no input named {name!r} (its inputs: {listed})")
        if names.index(name) < len(args):
            raise TypeError(f"{what} got input {name!r} both by position and by name")
    bound = list(args)
    for name in names[len(args) :]:
        if name not in kwargs:
            raise TypeError(f"{what} is missing input {name!r} (its inputs: {listed})")
        bound.append(kwargs[name])
    return tuple(bound)


class RestructuredOutputs(nn.Module):
    """A loaded artifact whose flat outputs (an ONNX file without fxforge's structure record returns a tuple) are put
    back into the model's output structure, ``output_like``, so that they can be compared with the model's; a
    pytree rebuild per call, microseconds. Where the tensor counts differ, the outputs are returned as they are."""

    def __init__(self, module: Any, output_like: Any) -> None:
        super().__init__()
        self.module, self.output_like = module, output_like

    def forward(self, *args: Any) -> Any:
        output = self.module(*args)
        flat = [v for v in pytree.tree_leaves(output) if isinstance(v, torch.Tensor)]
        leaves, spec = pytree.tree_flatten(self.output_like)
        if len(flat) != sum(isinstance(v, torch.Tensor) for v in leaves):
            return output
        tensors = iter(flat)
        return pytree.tree_unflatten([next(tensors) if isinstance(v, torch.Tensor) else v for v in leaves], spec)


class StructuredOutputs(nn.Module):
    """A loaded module whose outputs are put back into the structure recorded when it was written: a TorchScript
    file's (:func:`scripted_output_structure`: a transformers output class, a namedtuple), as ONNX and ``.pt2`` files
    give them back, or a split directory's flat ``model.pt2`` (plan.json's ``output_structure``). ``scripted`` is the
    loaded module itself. Outputs of another tensor count are returned as they are."""

    def __init__(self, scripted: Any, structure: Any) -> None:
        super().__init__()
        self.scripted, self.structure = scripted, structure
        self.tensor_count = _tensors_in(structure)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        output = self.scripted(*args, **kwargs)
        flat = [v for v in pytree.tree_leaves(output) if isinstance(v, torch.Tensor)]
        if len(flat) != self.tensor_count:
            return output
        return rebuild_structure(self.structure, iter(flat))


class OnnxRuntimeModule(nn.Module):
    """An ONNX Runtime session behind ``nn.Module``'s call interface (tensors in, tensors out).

    ``output_like`` (an output of the original model) restores the output's structure (tuples,
    dicts, model outputs) from ONNX's flat list; its non-tensor leaves are constants in an ONNX graph
    and are taken from it. Without it, the structure fxforge's export recorded in the file's metadata
    (:data:`OUTPUT_STRUCTURE_KEY`: a dict stays a dict, a namedtuple a namedtuple of the same fields, a transformers
    output its class); without either, one output is returned as a tensor and several as a tuple.
    ``threads`` defaults to torch's intra-op thread count, so that both run on the same cores. Pool threads
    spin during a run and stop when it returns (``session.force_spinning_stop``), so that they leave the cores
    to the next thing that runs.

    ``streams`` above 1 runs a batch as that many concurrent streams of one thread each (:meth:`in_streams`).
    """

    def __init__(
        self,
        path: str | Path,
        output_like: Any = None,
        threads: int | None = None,
        streams: int = 1,
        micro_batch: int = 1,
    ) -> None:
        super().__init__()
        self.path = str(path)
        self.threads = threads or torch.get_num_threads()
        self.streams, self.micro_batch = streams, micro_batch
        # with streams, each stream's calls run on the calling thread alone: a session of one thread, shared (ONNX
        # Runtime's run is thread-safe). Two runs at once on a session of two threads fought over its pool: 0.64x.
        self.session = self._new_session(1 if streams > 1 else self.threads)
        self._whole_session: Any = None  # streams: for a batch that does not split, made on its first use
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pool_pid = 0
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.batched: list[str] = []  # streams: the inputs split along their first dimension (in_streams)
        # per input, each dimension's fixed size (None: symbolic), to name a wrong shape in one line
        self.input_dims = [[d if isinstance(d, int) else None for d in i.shape] for i in self.session.get_inputs()]
        self.output_like = output_like
        self.output_structure: Any = None
        metadata = self.session.get_modelmeta().custom_metadata_map
        try:  # the embeddings' row counts, by input position, as fxforge's export recorded them
            self.index_bounds = {int(k): int(v) for k, v in json.loads(metadata.get(BOUNDS_KEY, "{}")).items()}
        except (ValueError, TypeError, AttributeError):
            raise ModelSpecError(f"{path}: its {BOUNDS_KEY} metadata is damaged", hint="is the file corrupt?") from None
        recorded = metadata.get(OUTPUT_STRUCTURE_KEY)
        if recorded:
            outputs = len(self.session.get_outputs())
            # damaged metadata gave the flat list with no word, and verify said OK of a file returning a bare
            # tensor where the model returns a dict (QA): refused as a damaged TorchScript fxforge.json is
            try:
                structure = json.loads(recorded)
            except ValueError:
                raise ModelSpecError(
                    f"{path}: its {OUTPUT_STRUCTURE_KEY} metadata is not JSON", hint="is the file corrupt?"
                ) from None
            try:
                described: int | None = _tensors_in(structure)
            except (ValueError, TypeError, KeyError, AttributeError, StopIteration):
                described = None  # a description this version cannot read (another one wrote it): the flat list
            if described is not None and described != outputs:
                raise ModelSpecError(
                    f"{path}: its {OUTPUT_STRUCTURE_KEY} metadata describes {described} outputs, and the graph has "
                    f"{outputs}",
                    hint="is the file corrupt?",
                )
            if described is not None:
                self.output_structure = structure

    def _new_session(self, threads: int) -> Any:
        ort = require("onnxruntime", "onnx", "running an ONNX model")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # fatal only: an error comes back as an exception, which fxforge reports in one line; logged, it printed
        # its own multi-line copy too, once per stream (QA)
        options.log_severity_level = 4
        # By default ONNX Runtime's pool threads keep spinning after each run, taking the cores from whatever
        # runs next (on 2 cores eager resnet18 ran 2.2x slower right after an ONNX run). Not spinning at all
        # is no cure: waking sleeping threads between ops made mobilenet_v2 at batch 1 1.9x slower
        # (5.1 vs 2.7 ms, Xeon, 2 threads). Spinning only while a run lasts has neither cost.
        options.add_session_config_entry("session.force_spinning_stop", "1")
        return ort.InferenceSession(self.path, options, providers=["CPUExecutionProvider"])

    def in_streams(self, streams: int, micro_batch: int, batched: Sequence[str]) -> OnnxRuntimeModule:
        """This model run as ``streams`` concurrent streams of one thread each, the batch shared out evenly between
        them, each stream through its share in calls of at most ``micro_batch`` samples, and the outputs joined along
        the batch dimension (an ``--auto`` recipe: :func:`apply_recipe`). ``batched``: the inputs that carry the
        batch (their first dimension), which are split; the others (a mask or a bias every sample shares) go whole
        to every call, whatever their size. Why it can pay: on 2 cores of an AMD EPYC, a depthwise net at batch 8
        ran 1.1-1.2x faster this way than as one call on two threads (the two threads of one call wait for each
        other after every layer; a micro-batch's activations stay in the cache). Where the batch does not split
        (one sample, batched inputs of different sizes) or an output is not per-sample, it runs in one call on all
        the threads, as without streams."""
        self.check_batched(batched)
        streamed = OnnxRuntimeModule(self.path, self.output_like, self.threads, streams, micro_batch)
        streamed.batched = list(batched)
        return streamed

    def check_batched(self, batched: Sequence[str]) -> None:
        """Refuse a list of batched inputs that names no input, or one the model does not have."""
        unknown = [name for name in batched if name not in self.input_names]
        if unknown or not batched:
            named = f"it has no input named {unknown[0]!r}" if unknown else "the list of batched inputs is empty"
            raise FxforgeError(f"streams of {self.path}: {named}", hint=f"its inputs: {', '.join(self.input_names)}")

    def _run(self, feeds: dict[str, Any]) -> list[Any]:
        sizes = {feeds[name].shape[0] if feeds[name].ndim else None for name in self.batched}
        batch = sizes.pop() if len(sizes) == 1 else None
        if self.streams < 2 or batch is None or batch < 2:
            return self._run_whole(feeds)
        # an even share per stream (no stream idles while another runs two micro-batches more), in order, so that
        # joining the streams' outputs keeps the samples' order; each share in calls of at most micro_batch
        streams = min(self.streams, batch)
        bounds = [batch * i // streams for i in range(streams + 1)]
        shares = [
            [(start, min(start + self.micro_batch, stop)) for start in range(begin, stop, self.micro_batch)]
            for begin, stop in itertools.pairwise(bounds)
        ]

        def run_share(share: list[tuple[int, int]]) -> list[list[Any]] | None:
            outputs = []
            for start, stop in share:
                piece = {name: array[start:stop] if name in self.batched else array for name, array in feeds.items()}
                result = self.session.run(None, piece)
                if any(not out.ndim or out.shape[0] != stop - start for out in result):
                    return None  # an output that is not per-sample: the batch cannot be run in pieces
                outputs.append(result)
            return outputs

        pool = self._stream_pool()
        others = [pool.submit(run_share, share) for share in shares[1:]]
        results = [run_share(shares[0]), *(future.result() for future in others)]
        if any(result is None for result in results):
            return self._run_whole(feeds)
        pieces = [piece for result in results for piece in result]  # type: ignore[union-attr]
        return [torch.cat([torch.from_numpy(piece[i]) for piece in pieces]).numpy() for i in range(len(pieces[0]))]

    def _stream_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        # a pool made before a fork has no threads in the child, which waited forever on its work (QA): a new one
        if self._pool is None or self._pool_pid != os.getpid():
            self._pool = concurrent.futures.ThreadPoolExecutor(self.streams - 1, thread_name_prefix="fxforge-ort")
            self._pool_pid = os.getpid()
        return self._pool

    def _run_whole(self, feeds: dict[str, Any]) -> list[Any]:
        if self.streams < 2:
            return self.session.run(None, feeds)
        if self._whole_session is None:  # made on first use: a second copy of the weights in memory
            self._whole_session = self._new_session(self.threads)
        return self._whole_session.run(None, feeds)

    def input_specs(self) -> list[InputSpec]:
        """Example inputs from the file's own input shapes and types (a symbolic first dimension, the batch, as
        1); empty when another dimension is symbolic or a type has no torch counterpart: then the user says."""
        specs = []
        for fixed, argument in zip(self.input_dims, self.session.get_inputs()):
            dims = [d if d is not None and d > 0 else (1 if i == 0 else None) for i, d in enumerate(fixed)]
            if None in dims:
                return []
            dtype = argument.type.removeprefix("tensor(").removesuffix(")")
            try:
                specs.append(parse_input_spec(f"{'x'.join(map(str, dims)) or 'scalar'}:{dtype}"))
            except InputSpecError:
                return []
        return specs

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        args = bind_keywords(self.input_names, args, kwargs, "the ONNX model")
        leaves = pytree.tree_leaves(args)
        fixed = next((v for v in leaves if v is not None and not isinstance(v, torch.Tensor)), None)
        if fixed is not None:
            # an ONNX graph has tensor inputs only: a number the model takes was fixed at export (its default, or
            # --concrete), and ignoring the one given computed the fixed value's result (QA: scale=2.0 ran as 1.0)
            raise TypeError(
                f"the ONNX model takes tensors only ({', '.join(self.input_names)}), got {fixed!r}: values other "
                "than tensors were fixed when the file was exported"
            )
        flat = [t for t in leaves if isinstance(t, torch.Tensor)]
        if len(flat) != len(self.input_names):
            raise ValueError(f"the ONNX model takes {display.counted(len(self.input_names), 'input')}, got {len(flat)}")
        for name, fixed, tensor in zip(self.input_names, self.input_dims, flat):
            # ONNX Runtime's own message for a wrong shape spans lines ("... for the following indices\n index: 2
            # Got: 200 Expected: 224"), and reports keep its first line only
            if len(fixed) != tensor.dim() or any(d is not None and d != n for d, n in zip(fixed, tensor.shape)):
                expected = "x".join("?" if d is None else str(d) for d in fixed) or "a scalar"
                got = "x".join(map(str, tensor.shape)) or "a scalar"
                any_size = " (? any size)" if "?" in expected else ""  # a legend only where a dimension is free
                raise ValueError(f"the ONNX model's input {name} has shape {expected}{any_size}, got {got}")
        check_index_bounds(self.index_bounds, flat, self.input_names)  # Gather reads -1 as the last row
        feeds = {name: t.detach().cpu().contiguous().numpy() for name, t in zip(self.input_names, flat)}
        # ONNX Runtime runs on the CPU here; the outputs go back where the inputs came from, like a module's
        device = flat[0].device if flat else torch.device("cpu")
        results = [torch.from_numpy(array).to(device) for array in self._run(feeds)]
        if self.output_like is None and self.output_structure is not None:
            return rebuild_structure(self.output_structure, iter(results))
        leaves, spec = pytree.tree_flatten(self.output_like)
        if self.output_like is None or sum(isinstance(v, torch.Tensor) for v in leaves) != len(results):
            return results[0] if len(results) == 1 else tuple(results)  # not this structure: flat, as the file says
        tensors = iter(results)
        return pytree.tree_unflatten([next(tensors) if isinstance(v, torch.Tensor) else v for v in leaves], spec)


class OnednnFusion(nn.Module):
    """A TorchScript module run with oneDNN graph fusion on (``torch.jit.enable_onednn_fusion``): a process-wide
    switch, so it is turned on for each call and restored after it, leaving other TorchScript code as it was."""

    def __init__(self, scripted: Any) -> None:
        super().__init__()
        self.scripted = scripted

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        before = torch._C._jit_llga_enabled()
        torch.jit.enable_onednn_fusion(True)
        try:
            return self.scripted(*args, **kwargs)
        finally:
            torch.jit.enable_onednn_fusion(before)


def is_aoti_package(path: Path) -> bool:
    """Whether the .pt2 archive at ``path`` is an AOTInductor package (compiled code) rather than a torch.export
    program: both are zip archives named .pt2, and a package renamed from model.aoti.pt2 is still one."""
    with contextlib.suppress(OSError, zipfile.BadZipFile), zipfile.ZipFile(path) as archive:
        return any("/data/aotinductor/" in name for name in archive.namelist())
    return False


class AotiModule(nn.Module):
    """An AOTInductor package (``torch._inductor.aoti_compile_and_package``: compiled code and weights) behind
    ``nn.Module``'s call interface.

    The package runs only the input shapes it was compiled for, and does not check them: another batch came back
    with the compiled batch's shape and wrong values, a shorter sequence aborted the process. So inputs are checked
    against ``input_specs`` (default: those the package records, :data:`INPUTS_KEY`, else the ``inputs.txt``
    beside an output directory's package) and refused in one line; they are made contiguous, as compiled. Output
    types of other libraries (transformers' ``ModelOutput``) are registered when loaded. Inputs may be given by
    name where the package records its inputs' names (:data:`ARGUMENTS_KEY`, written by fxforge).

    The package's code was compiled for the vector instructions of the CPU that built it (its ``AOTI_CPU_ISA``):
    run on a CPU without them, it dies of an illegal instruction, taking the process with it. A package is refused
    when this CPU lacks an instruction set the package names.
    """

    def __init__(self, path: str | Path, input_specs: Sequence[InputSpec] | None = None) -> None:
        super().__init__()
        self.path = str(path)
        # before any of its code is loaded: the package's loader may already run compiled code (its constants'
        # constructor), which on a CPU without the package's instruction set dies of an illegal instruction
        metadata = package_metadata(self.path)
        refuse_foreign_isa(metadata.get("AOTI_CPU_ISA", ""), self.path)
        with quiet_torch_logs():
            self.runner = torch._inductor.aoti_load_package(self.path)
        import_pytree_types(spec_types(self.runner.loader.get_call_spec()), Path(path).name)
        if not metadata:  # a package laid out otherwise: its loader's copy
            with contextlib.suppress(AttributeError, RuntimeError):  # a torch without package metadata
                metadata = dict(self.runner.loader.get_metadata())
        self.argument_names: list[str] | None = None
        with contextlib.suppress(ValueError, TypeError):
            names = json.loads(metadata.get(ARGUMENTS_KEY, "null"))
            if isinstance(names, list) and all(isinstance(n, str) for n in names):
                self.argument_names = names
        self.index_bounds: dict[int, int] = {}
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            self.index_bounds = {int(k): int(v) for k, v in json.loads(metadata.get(BOUNDS_KEY, "{}")).items()}
        if input_specs is None and metadata.get(INPUTS_KEY):
            with contextlib.suppress(FxforgeError):
                input_specs = [parse_input_spec(line) for line in metadata[INPUTS_KEY].split()]
        if input_specs is None and Path(path).name == AOTI_FILE:  # a package written before INPUTS_KEY
            with contextlib.suppress(FxforgeError, OSError, UnicodeDecodeError):  # then unchecked, as torch runs it
                input_specs = read_inputs(Path(path).parent)
        self.input_specs = list(input_specs or [])

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        args = bind_keywords(self.argument_names, args, kwargs, "the AOTInductor package")
        flat = [t for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor)]
        if self.input_specs:
            got = [InputSpec(tuple(t.shape), t.dtype) for t in flat]
            if got != self.input_specs:
                compiled = " ".join(map(str, self.input_specs))
                raise ValueError(
                    f"the AOTInductor package was compiled for inputs {compiled}, got {' '.join(map(str, got))}: "
                    "it runs those shapes only"
                )
        check_index_bounds(self.index_bounds, args, self.argument_names)
        # the compiled code assumes the example's strides (contiguous): a channels-last image, a transposed or
        # cropped view gave wrong numbers (max error 0.45 on resnet18), silently
        output = self.runner(*pytree.tree_map_only(torch.Tensor, lambda t: t.contiguous(), args))
        return plain_containers(output)  # a torch-dialect graph's package returned fx's immutable dict


# AOTInductor's names for the vector instruction sets a package was compiled for (``AOTI_CPU_ISA``), as the CPU flags
# of /proc/cpuinfo spell them (:data:`fxforge.machine.RELEVANT_FLAGS`)
_ISA_FLAGS = {"avx2": "avx2", "avx512": "avx512f", "avx512_vnni": "avx512_vnni", "amx_tile": "amx_tile"}


def package_metadata(path: str | Path) -> dict[str, str]:
    """An AOTInductor package's metadata (``AOTI_CPU_ISA``, fxforge's :data:`INPUTS_KEY`...), read from the
    archive's ``*wrapper_metadata.json`` without loading its code; empty where the archive has none."""
    with (
        contextlib.suppress(OSError, zipfile.BadZipFile, ValueError, UnicodeDecodeError),
        zipfile.ZipFile(path) as archive,
    ):
        for name in archive.namelist():
            if name.endswith("wrapper_metadata.json"):
                metadata = json.loads(archive.read(name))
                if isinstance(metadata, dict):
                    return {str(k): str(v) for k, v in metadata.items()}
    return {}


def refuse_foreign_isa(package_isa: str, path: str) -> None:
    """Raise :class:`ModelSpecError` when the AOTInductor package at ``path``, compiled for ``package_isa`` (its
    ``AOTI_CPU_ISA``, e.g. "AVX512 AVX512_VNNI AMX_TILE"), needs an instruction set this CPU lacks; a name fxforge
    does not know, or a CPU whose flags cannot be read, is let through."""
    cpu = cpu_info()
    if not cpu.features:
        return
    missing = [
        word for word in package_isa.lower().split() if word in _ISA_FLAGS and _ISA_FLAGS[word] not in cpu.features
    ]
    if missing:
        raise ModelSpecError(
            f"{path} was compiled for a CPU with {', '.join(w.upper() for w in missing)}, which this one ({cpu.model}) "
            "lacks: its code would die of an illegal instruction",
            hint="run fxforge optimize --auto again on this machine: a package runs on CPUs like the one that built it",
        )


class ChannelsLastModule(nn.Module):
    """``model`` with its 4-D weights and inputs in channels-last (NHWC) memory layout, oneDNN's native one for
    convolutions. Traced or exported, the input conversion becomes part of the graph, so the artifact needs no
    wrapper at load time. ``model`` is copied: the caller's keeps its layout. In ``model``'s mode, as
    :class:`~fxforge.runtime.ConstantKeywords` is."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = copy.deepcopy(model).to(memory_format=torch.channels_last)
        self.training = model.training

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*map(to_channels_last, args), **{k: to_channels_last(v) for k, v in kwargs.items()})


def to_channels_last(value: Any) -> Any:
    """A 4-D floating tensor in channels-last layout; anything else as it is."""
    if isinstance(value, torch.Tensor) and value.dim() == 4 and value.is_floating_point():
        return value.contiguous(memory_format=torch.channels_last)
    return value


class AutocastModule(nn.Module):
    """``model`` run under ``torch.autocast`` (bf16 on the CPU; fp16 on CUDA where asked), its floating outputs
    cast back to the dtypes of ``output_like``: a drop-in replacement for the float32 model."""

    def __init__(self, model: nn.Module, output_like: Any, device: str = "cpu", dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.model, self.output_like, self.device, self.dtype = model, output_like, device, dtype

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.device, dtype=self.dtype):
            output = self.model(*args, **kwargs)
        return _cast_floating_like(output, self.output_like)


def _cast_floating_like(output: Any, output_like: Any) -> Any:
    leaves, spec = pytree.tree_flatten(output)
    wanted = pytree.tree_leaves(output_like)
    if output_like is None or len(wanted) != len(leaves):
        # without a float reference (a reloaded recipe): floating outputs back to float32, the model's own dtype
        wanted = [torch.empty(0) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in leaves]
    cast = [
        value.to(like.dtype) if isinstance(value, torch.Tensor) and isinstance(like, torch.Tensor) else value
        for value, like in zip(leaves, wanted)
    ]
    return pytree.tree_unflatten(cast, spec)


class CompiledModule(nn.Module):
    """``torch.compile(model)`` with Inductor ``config`` (e.g. ``freezing``) in force whenever it may compile: the
    first call, and any later one that recompiles (a new batch size, grad mode). What a compile recipe asks for
    when no AOTInductor package could be written, and bench's ``compile`` backend."""

    def __init__(self, model: nn.Module, config: dict[str, Any] | None = None, mode: str | None = None) -> None:
        super().__init__()
        self.model, self.config, self.mode = model, dict(config or {}), mode
        self.argument_names = positional_names(model)
        self.index_bounds = index_bounds(model) if isinstance(model, fx.GraphModule) else {}
        self.compiled = torch.compile(model, dynamic=False, mode=mode)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs and set(kwargs) <= set(self.argument_names or ()):  # by position, as compiled
            args, kwargs = bind_keywords(self.argument_names, args, kwargs, "the compiled model"), {}
        if not kwargs:
            check_index_bounds(self.index_bounds, args, self.argument_names)
        # Inductor's wrapper and the config patch make Python calls in loops: keep them off a stack-chunk boundary
        # of the caller's (fxforge.callstack; up to 8% on a reloaded BERT-base)
        return call_on_fresh_chunk(self._run, *args, **kwargs)

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        import torch._inductor.config as inductor_config  # Inductor is slow to import: only when compiled code runs

        with inductor_config.patch(self.config):
            try:
                return self.compiled(*args, **kwargs)
            except Exception as exc:
                raise _without_dynamo_trailer(exc) from exc


def _without_dynamo_trailer(exc: Exception) -> Exception:
    """``exc`` with Dynamo's trailer cut (the "from user code:" stack of torch's own frames and the advice to set
    TORCHDYNAMO_VERBOSE): the model's own error, e.g. "Guard failed: input.size()[0] == 1" for another batch
    size, then reads as it does uncompiled. ``exc`` itself where there is no trailer or its type cannot be rebuilt
    from a message."""
    message = str(exc)
    head = message.split("\n\nfrom user code:", 1)[0].split("\n\nSet TORCHDYNAMO_VERBOSE", 1)[0].strip()
    if head == message.strip():
        return exc
    try:
        return type(exc)(head)
    except Exception:
        return RuntimeError(head)


def apply_recipe(module: nn.Module, recipe: dict[str, Any]) -> nn.Module:
    """``module`` (model.pt2's) run the way ``recipe.json`` says: ``{"run": "autocast", "dtype": "bfloat16"}`` or
    ``{"run": "compile", "inductor": {...}, "mode": ...}``; model.onnx's as ``{"run": "onnxruntime", "streams": 2,
    "micro_batch": 2, "batched": ["x"]}`` (:meth:`OnnxRuntimeModule.in_streams`). Plain torch does the same in one
    line (docs/commands/optimize.md); an unknown recipe is an error rather than a silently slower model."""
    if not isinstance(recipe, dict):  # a list or a string raised an AttributeError, an internal error (QA)
        raise FxforgeError(f"{RECIPE_FILE} is not a JSON object", hint="is the file corrupt?")
    how = recipe.get("run")
    if how == "onnxruntime":
        counts = [recipe.get("streams"), recipe.get("micro_batch")]
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in counts):
            raise FxforgeError(f"{RECIPE_FILE}: streams and micro_batch must be whole numbers of at least 1")
        batched = recipe.get("batched")
        if not isinstance(batched, list) or not all(isinstance(name, str) for name in batched):
            raise FxforgeError(f"{RECIPE_FILE}: batched must be a list of input names")
        if not isinstance(module, OnnxRuntimeModule):
            raise FxforgeError(f"{RECIPE_FILE} runs an ONNX model, and the directory's model is not one")
        module.check_batched(batched)  # with one thread too: the same directory fails or loads on every machine (QA)
        # no more streams than the threads this process gives torch (torch.set_num_threads(1) in a server that
        # runs one model per core): each stream takes a core. Not more than recorded either: the micro-batch size
        # was timed with that many
        streams = min(counts[0], module.threads)
        return module.in_streams(streams, counts[1], batched) if streams > 1 else module
    if how in ("autocast", "compile") and isinstance(module, OnnxRuntimeModule):
        raise FxforgeError(f"{RECIPE_FILE} runs a torch program ({how}), and the directory's model is an ONNX file")
    if how == "autocast":
        dtype = getattr(torch, str(recipe.get("dtype", "bfloat16")), None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:  # an internal error (QA)
            raise FxforgeError(f"{RECIPE_FILE}: dtype must name a torch floating-point type, e.g. bfloat16")
        return AutocastModule(module, None, dtype=dtype)
    if how == "compile":
        inductor, mode = recipe.get("inductor"), recipe.get("mode")
        if not isinstance(inductor, dict | None) or not isinstance(mode, str | None):  # an internal error (QA)
            raise FxforgeError(f"{RECIPE_FILE}: inductor must be an object of settings and mode a name")
        return CompiledModule(module, inductor, mode)
    raise FxforgeError(f"unknown recipe {how!r} in {RECIPE_FILE}", hint="written by a newer fxforge?")
