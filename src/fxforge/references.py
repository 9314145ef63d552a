"""References: turning ``path/to/file.py:attr`` and ``package.module:attr`` strings into Python objects.

Model specs, pass options given on the command line or in a pipeline file (a replacement class, a
pattern function, a callable to insert) and calibration data all name user code this way; this
module is the one place that imports it. Errors are raised as the caller's error class, so a bad
model spec stays a ``ModelSpecError`` and a bad pass option a ``PassError``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from fxforge.errors import FxforgeError, first_line, user_location


def as_names(value: Any) -> Any:
    """A name where the API takes several (``"fold_bn"``, or ``"fold_bn,dead_code"`` as the CLI spells a list) as
    that list; anything else as it is. Iterating a string would make each character a name (``unknown pass 'f'``)."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


# The module name a user's file is imported under (fxforge_user_<stem>): what a pickle of its classes names.
USER_MODULE_PREFIX = "fxforge_user_"


# The modules a user file's import brought in from its own folder (``from helpers import scale``), by folder: cached
# in sys.modules under plain names, which another user file's own siblings share.
_SIBLINGS: dict[str, set[str]] = {}


def _forget_other_folders_siblings(folder: str) -> None:
    """Drop from ``sys.modules`` the sibling modules that user files of other folders imported: ``a/model.py`` and
    ``b/model.py`` each importing their ``helpers.py`` got a's twice, and ``fxforge verify a/model.py:build
    b/model.py:build`` said OK for two different models (QA). Their code keeps working (a module's functions hold
    their own globals). Only modules recorded while a user file was imported, found in its folder, and named like a
    module of this folder are dropped: never an installed package, nor what the caller imported itself."""
    here = Path(folder)
    for other, names in _SIBLINGS.items():
        if other == folder:
            continue
        for name in names:
            top = name.partition(".")[0]
            if not ((here / f"{top}.py").is_file() or (here / top).is_dir()):
                continue  # this folder has no module of that name: the cached one is the only one it can import
            module = sys.modules.get(name)
            file = getattr(module, "__file__", None) if module is not None else None
            if file and Path(file).resolve().is_relative_to(other):
                del sys.modules[name]


def _record_siblings(folder: str, before: set[str]) -> None:
    """Remember which modules the import of a user file from ``folder`` added from that folder."""
    for name in set(sys.modules) - before:
        file = getattr(sys.modules[name], "__file__", None)
        if file and not name.startswith(USER_MODULE_PREFIX) and Path(file).resolve().is_relative_to(folder):
            _SIBLINGS.setdefault(folder, set()).add(name)


def import_file(
    path: str | Path, *, error: type[FxforgeError] = FxforgeError, what: str = "", module_name: str | None = None
) -> ModuleType:
    """Import a Python file as module ``fxforge_user_<stem>`` (or ``module_name``).

    The module is registered in ``sys.modules`` so that pickling a model built from it, ``inspect.getsource``
    and tracebacks (which capture uses to name the user's line) find the user's code again; the file's own
    folder is on ``sys.path`` while it runs, so its sibling imports work.
    """
    path = Path(path)
    context = f" for {what}" if what else ""
    if path.is_dir():  # "file not found" for a folder named like a file sent the user looking for it (QA)
        raise error(f"{path} is a directory, not a Python file{context}")
    if not path.is_file():
        raise error(f"file not found{context}: {path}")
    module_name = module_name or f"{USER_MODULE_PREFIX}{path.stem}"
    loaded = sys.modules.get(module_name)
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() == path.resolve():
        # One module per file: a second import would make new classes and functions, and a --wrap naming a
        # function of the model's file would then not be the function the model calls.
        return loaded
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise error(f"cannot import {path}{context}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    folder = str(path.resolve().parent)
    _forget_other_folders_siblings(folder)
    before = set(sys.modules)
    sys.path.insert(0, folder)
    try:
        # Import-time code may draw random numbers (`example_inputs = (torch.randn(...),)`): only the first build
        # from a file imports it, so those draws must not come out of the stream the model's weights are drawn
        # from, or the first build would differ from every later one (verify file.py:A file.py:A would differ).
        with torch.random.fork_rng(devices=[]):
            spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise error(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from None
    except FxforgeError:
        raise
    except Exception as exc:
        where = user_location(exc)
        at = f" at {where}" if where else ""
        raise error(f"importing {path} failed: {type(exc).__name__}: {first_line(exc)}{at}") from None
    except SystemExit as exc:  # a script's `sys.exit()` at import time must not end fxforge with exit code 0
        raise error(
            f"importing {path} called sys.exit({exc.code!r})",
            hint="guard script code with `if __name__ == '__main__':`",
        ) from None
    finally:
        sys.path.remove(folder)
        _record_siblings(folder, before)
    return module


def import_module(name: str) -> ModuleType:
    """``importlib.import_module``, with the current folder on the path where the package is there and nowhere
    else, as ``python -m`` has it: the ``fxforge`` script's path has its own folder instead, so ``pkg.model:build``
    run from ``pkg``'s parent said "No module named 'pkg'" (QA)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        top = name.partition(".")[0]
        here = Path.cwd()
        if exc.name != top or not ((here / top).is_dir() or (here / f"{top}.py").is_file()):
            raise
    sys.path.insert(0, str(here))  # kept: unpickling what the model's classes made imports them again
    return importlib.import_module(name)


def import_reference(
    reference: str, *, what: str = "reference", error: type[FxforgeError] = FxforgeError, hint: str | None = None
) -> Any:
    """The object named by ``pkg.module:attr`` or ``path/to/file.py:attr``; ``attr`` may be dotted."""
    module_name, sep, attr = reference.rpartition(":")  # rpartition: a Windows path has a colon of its own
    if not sep or not module_name or not attr:
        raise error(f"{what} {reference!r} is not of the form module:name", hint=hint or "e.g. my_package.models:build")
    if module_name.endswith(".py"):
        module: Any = import_file(module_name, error=error, what=f"{what} {reference!r}")
    else:
        try:
            module = import_module(module_name)
        except ImportError as exc:
            raise error(f"cannot import {module_name!r} for {what} {reference!r}: {exc}", hint=hint) from None
        except Exception as exc:
            raise error(f"importing {module_name!r} failed: {type(exc).__name__}: {first_line(exc)}") from None
        except SystemExit as exc:
            raise error(f"importing {module_name!r} called sys.exit({exc.code!r})") from None
    value = module
    for part in attr.split("."):
        if not hasattr(value, part):
            raise error(f"{what} {reference!r}: {module_name} has no attribute {attr!r}", hint=hint)
        value = getattr(value, part)
    return value


def parse_value(raw: str, what: str) -> Any:
    """A YAML scalar or flow collection from the command line (``10``, ``0.5``, ``true``, ``[1, 2]``,
    ``{ReLU: ReLU6}``); a clear error naming ``what`` when it does not parse."""
    import yaml

    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise FxforgeError(
            f"{what}: the value is not valid YAML ({first_line(exc)})", hint="quote it, e.g. KEY='[1, 2]'"
        ) from None


def import_function(reference: str, *, what: str = "function", error: type[FxforgeError] = FxforgeError) -> Any:
    """A callable named ``package.module.function``, ``package.module:function`` or ``path/to/file.py:function``."""
    text = reference.strip()
    if ":" not in text:
        module_name, _, attr = text.rpartition(".")
        if not module_name or not attr:
            raise error(f"{what} {reference!r} is not of the form module.function", hint="e.g. my_package.ops.norm")
        text = f"{module_name}:{attr}"
    value = import_reference(text, what=what, error=error)
    if not callable(value):
        raise error(f"{what} {reference!r} is a {type(value).__name__}, not a function")
    return value
