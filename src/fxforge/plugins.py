"""Plug-ins: passes, lint rules and bench backends from installed packages and from the user's own files.

A package declares entry points in three groups (``pyproject.toml``)::

    [project.entry-points."fxforge.passes"]
    my_passes = "my_package.passes"            # a module: importing it registers its @register_pass functions
    scale_after_conv = "my_package.passes:scale_after_conv"   # or one object, adopted under the entry point name

    [project.entry-points."fxforge.rules"]      # modules with @rule functions (fxforge.lint)
    [project.entry-points."fxforge.backends"]   # modules with @fxforge.register_backend builders

Each group is loaded the first time its registry is used. Everything registered while a plug-in loads is
recorded as coming from it (``fxforge passes`` and ``fxforge lint --rules`` show where each item came from). A
plug-in that fails to import is recorded by name with its error (:func:`failures`), and the others still load.
See docs/plugins.md for the contract each kind of plug-in must keep.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from fxforge.errors import one_line_reason
from fxforge.registry import registering_from

PASSES_GROUP = "fxforge.passes"
RULES_GROUP = "fxforge.rules"
BACKENDS_GROUP = "fxforge.backends"
GROUPS = (PASSES_GROUP, RULES_GROUP, BACKENDS_GROUP)


@dataclass(frozen=True)
class PluginFailure:
    group: str
    name: str  # the entry point's name
    distribution: str
    error: str

    def describe(self) -> str:
        return f"plug-in {self.distribution} ({self.name}, {self.group}) failed to load: {self.error}"


_loaded: set[str] = set()
_failures: list[PluginFailure] = []

# Adopts an object an entry point names (not a module): registers it under the entry point's name.
Adopter = Callable[[str, Any, str], None]


def entry_points(group: str) -> list[importlib.metadata.EntryPoint]:
    """The installed entry points of ``group`` (one place, so that tests can add their own)."""
    return list(importlib.metadata.entry_points(group=group))


def origin_of(entry: importlib.metadata.EntryPoint) -> str:
    distribution = entry.dist.name if entry.dist is not None else "unknown package"
    return f"plugin {distribution} ({entry.name})"


def load_group(group: str, adopt: Adopter) -> list[PluginFailure]:
    """Load every entry point of ``group`` once; returns the failures of this group."""
    if group not in _loaded:
        _loaded.add(group)
        for entry in entry_points(group):
            origin = origin_of(entry)
            try:
                with registering_from(origin):
                    loaded = entry.load()
                    if not isinstance(loaded, ModuleType):
                        adopt(entry.name, loaded, origin)
            except (Exception, SystemExit) as exc:
                distribution = entry.dist.name if entry.dist is not None else "unknown package"
                reason = one_line_reason(exc) if isinstance(exc, Exception) else f"called sys.exit({exc.code!r})"
                _failures.append(PluginFailure(group, entry.name, distribution, reason))
    return failures(group)


def failures(group: str | None = None) -> list[PluginFailure]:
    """The plug-ins that failed to load (of ``group``, or of every group)."""
    return [f for f in _failures if group is None or f.group == group]


def forget() -> None:
    """Load the groups again on next use (for tests that install or fake plug-ins)."""
    _loaded.clear()
    _failures.clear()
