"""Registries: the one way passes, lint rules and bench backends are registered by name and looked up.

A :class:`Registry` is a dict from name to item that also remembers where each item came from (fxforge
itself, a plug-in, the user's file), refuses a second, different item under a taken name -- naming both
origins -- and answers an unknown name with the closest known one.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from fxforge.errors import FxforgeError

T = TypeVar("T")

BUILTIN = "fxforge"

# Where items registered right now come from, when a plug-in loader says (None: nobody said).
_CURRENT_ORIGIN: contextvars.ContextVar[str | None] = contextvars.ContextVar("fxforge_registry_origin", default=None)
# What the block of registering_from has registered so far, in every registry: taken back if the block fails.
_ADDED: contextvars.ContextVar[list[tuple[Registry, str]] | None] = contextvars.ContextVar(
    "fxforge_registry_added", default=None
)


@contextlib.contextmanager
def registering_from(origin: str) -> Iterator[None]:
    """Items registered inside the block are recorded as coming from ``origin`` (a plug-in, a user's file). If the
    block raises, what it registered is taken back: a plug-in that failed to load is all gone, not half there
    (QA: its passes registered before the failure ran with no warning)."""
    added: list[tuple[Registry, str]] = []
    token, added_token = _CURRENT_ORIGIN.set(origin), _ADDED.set(added)
    try:
        yield
    except BaseException:
        for registry, name in added:
            registry.pop(name, None)
            registry.origins.pop(name, None)
        raise
    finally:
        _CURRENT_ORIGIN.reset(token)
        _ADDED.reset(added_token)


class Registry(dict[str, T], Generic[T]):
    """Items by name, with their origins. ``kind`` names them in errors ("pass", "lint rule", "backend")."""

    def __init__(self, kind: str, error: type[FxforgeError] = FxforgeError, listing: str = "") -> None:
        super().__init__()
        self.kind = kind
        self.error = error
        self.listing = listing  # the command that lists them, for hints
        self.origins: dict[str, str] = {}

    def register(
        self,
        name: str,
        item: T,
        origin: str | None = None,
        *,
        same: Callable[[T, T], bool] | None = None,
        module: str | None = None,
    ) -> T:
        """Add ``item`` under ``name``; registering the same item again is a no-op (a module imported twice).

        ``origin``: where it comes from; by default the one :func:`registering_from` set, else ``module`` (the
        Python module defining it) unless that is fxforge's own, else fxforge. ``same`` decides whether an
        existing item is "the same" (default: identity).
        """
        origin = origin or _CURRENT_ORIGIN.get() or _module_origin(module)
        if name in self:
            existing = self[name]
            if (same or (lambda a, b: a is b))(existing, item):
                return existing
            raise self.error(
                f"a {self.kind} named {name!r} is already registered (from {self.origins.get(name, BUILTIN)}); "
                f"{origin} registers another one",
                hint="; ".join(filter(None, ["give it another name", self._listing_hint()])),
            )
        self[name] = item
        self.origins[name] = origin
        added = _ADDED.get()
        if added is not None:
            added.append((self, name))
        return item

    def lookup(self, name: str) -> T:
        """The item called ``name``; an error suggesting the closest name when there is none."""
        if name not in self:
            close = difflib.get_close_matches(name, list(self), n=1)
            guess = f"did you mean {close[0]!r}? " if close else ""
            known = "" if self.listing else f"one of {', '.join(sorted(self))}"
            raise self.error(f"unknown {self.kind} {name!r}", hint=(guess + known + self._listing_hint()).strip("; "))
        return self[name]

    def origin(self, name: str) -> str:
        return self.origins.get(name, BUILTIN)

    def _listing_hint(self) -> str:
        return f"list them with: {self.listing}" if self.listing else ""


def _module_origin(module: str | None) -> str:
    if not module or module == "fxforge" or module.startswith("fxforge."):
        return BUILTIN
    if module.startswith("fxforge_user_"):  # a file fxforge imported for the user (fxforge.references)
        return f"file {module.removeprefix('fxforge_user_')}.py"
    return f"module {module}"
