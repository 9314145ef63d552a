"""Where a hot call sits on CPython's frame stack: :func:`call_on_fresh_chunk`.

CPython 3.11 and 3.12 keep a thread's Python frames in chunks of 16 KiB and free a chunk the moment the frame at
its base returns (python/cpython#142183; 3.14 and the 3.13 releases of 2026 keep one spare chunk). A function that calls
many Python functions in a loop -- the wrapper Inductor generates around its kernels, which calls an op overload
per ``Linear`` -- therefore runs at one of two speeds, depending only on how deep its *caller* happens to be: when
its own frame ends just short of a chunk boundary, every call it makes maps a new chunk and unmaps it on return.
Measured on this project's machine, a reloaded torch.compile'd BERT-base at batch 1 called from stack depth 148
took 173 page faults and 83 ms per call, 75-82 ms at the other depths from 140 to 159 (3-4 faults): the 0.83-0.92x that
``benchmarks/peers.py`` recorded for its ``compile+recipe`` artifacts, in some processes and not in others.

:func:`call_on_fresh_chunk` makes the outcome independent of the caller: the call goes through a frame too large
for any 16 KiB chunk, so it always opens a chunk of its own, and everything it calls fits after it. One chunk is
mapped per call (~10 us and 5 page faults on that machine) instead of one per inner Python call at an unlucky depth.
Standard library only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

# A 16 KiB chunk holds 2,048 pointer-sized slots; a frame with more local slots than that never fits in one, so
# CPython opens a chunk for it (of 32 KiB: the frame plus at least 1,000 slots, ~8 KiB, for what it calls).
FRAME_SLOTS = 2200

# 3.13 and later keep one freed chunk for reuse (python/cpython#145789, backported to 3.13): no thrashing to avoid.
AFFECTED = sys.implementation.name == "cpython" and sys.version_info < (3, 13)


def _make_trampoline() -> Callable[..., Any]:
    names = " = ".join(f"_slot{i}" for i in range(FRAME_SLOTS))
    # The assignment never runs; its names alone give the frame FRAME_SLOTS local slots.
    source = (
        "def call_on_fresh_chunk(function, /, *args, **kwargs):\n"
        "    if False:\n"
        f"        {names} = None\n"
        "    return function(*args, **kwargs)\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, "<fxforge.callstack>", "exec"), namespace)
    return namespace["call_on_fresh_chunk"]


def _direct(function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    return function(*args, **kwargs)


call_on_fresh_chunk: Callable[..., Any] = _make_trampoline() if AFFECTED else _direct
call_on_fresh_chunk.__doc__ = """``function(*args, **kwargs)``, called from a frame that starts its own stack chunk on
CPython 3.11/3.12 (a plain call elsewhere): its speed no longer depends on the caller's stack depth (module
docstring)."""
