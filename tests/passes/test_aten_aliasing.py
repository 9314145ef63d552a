"""Property tests: the exact passes on ATen graphs full of views and in-place ops.

torch.export keeps in-place ops (``add_``, ``copy_``, ``index_put_``...) in its graphs, on fresh tensors, on
views of them and on buffers. A pass that misses that a write into a view writes its base, merges or folds
a value some in-place op later changes, or stores a folded constant that shares or overlaps memory where a
later write (in the graph, or outside it: ``load_state_dict``, fxforge's own buffer restore after a check
run) can trip on it, changes what the model computes -- sometimes only on the second call.

Hypothesis builds small programs over a pool of n x n tensors: constants (a parameter, a buffer, expanded
rows of both, ``torch.ones``, ``torch.arange``, ``ones(n).expand``), the input, views of pool values
(``t``, ``transpose``, slicing, ``reshape``, ``view`` or ``reshape`` to one dimension and back, an expanded
row), fresh values (arithmetic, ``x * 1``, ``x + 0``, ``clone``, ``contiguous``, matmul, eval-mode
dropout), repeated calls (CSE candidates) and in-place ops (``add_``, ``mul_``, ``copy_``, ``index_put_``,
``masked_fill_``, ``relu_``, ``t_``) on writable values or on views of them (a row, a column, the
transpose, all rows but the first). Each program is captured with torch.export; every exact pass
(``fxforge.passes.exact_passes()``), alone and all in sequence, must leave the captured graph and its
stored tensors untouched, verify equal to it, give the same outputs as the captured graph on two calls in
a row (state written by the graph included), and leave no stored tensor whose elements overlap in memory.

The examples are derandomised, so CI sees the same programs on every run.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import fx, nn

from fxforge.capture import Captured, capture
from fxforge.passes import apply_pass, exact_passes
from fxforge.verify import as_structure, compare_outputs, verify

EXACT = exact_passes()
SETTINGS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --------------------------------------------------------------------------------------------------
# programs: a list of steps over a pool of n x n tensors

SOURCES = ("param", "buffer", "param_row_expand", "buffer_row_expand", "ones", "ones_expand", "arange", "input")
VIEWS = ("t", "transpose", "slice", "reshape", "flat", "flat_view")
TARGET_VIEWS = ("all", "row0", "col_last", "t", "tail")
INPLACE_OPS = ("add_", "mul_", "copy_", "index_put_", "masked_fill_", "relu_", "t_")


class Slot:
    """What generation knows about a pool value: its storage (``base``), whether its elements may share
    memory (expanded), and whether the program may write into it (not a parameter, input or overlap)."""

    def __init__(self, base: object, overlapping: bool = False, writable: bool = False):
        self.base, self.overlapping, self.writable = base, overlapping, writable and not overlapping


def _source_slot(kind: str, fresh: object) -> Slot:
    if kind == "param":
        return Slot("w")
    if kind == "buffer":
        return Slot("buf", writable=True)
    if kind in ("param_row_expand", "buffer_row_expand"):
        return Slot("v" if kind.startswith("param") else "r", overlapping=True)
    if kind == "ones_expand":
        return Slot(fresh, overlapping=True)
    if kind == "input":
        return Slot("x")
    return Slot(fresh, writable=True)  # ones, arange


@st.composite
def programs(draw) -> tuple[int, list[tuple], list[int], int | None, int]:
    """(n, steps, summed pool indices, returned pool index or None, seed). The first step is a source; in-place
    steps write writable values only, so every program runs eagerly and captures."""
    n = draw(st.integers(2, 4))
    slots: list[Slot] = []
    steps: list[tuple] = []
    computed: list[tuple] = []  # steps that compute a value from the pool: "again" repeats one of them
    for index in range(draw(st.integers(2, 10))):
        fresh = ("fresh", index)
        writable = [i for i, slot in enumerate(slots) if slot.writable]
        kinds = ["source"]
        kinds += ["view", "expand_row", "compute", "compute"] if slots else []
        kinds += ["inplace"] * 3 if writable else []
        kinds += ["again"] if computed else []
        kind = draw(st.sampled_from(kinds))
        pick = st.integers(0, len(slots) - 1) if slots else None
        if kind == "inplace":
            steps.append(_inplace(draw, slots, writable))
            continue
        if kind == "source":
            source = draw(st.sampled_from(SOURCES))
            step, slot = ("source", source), _source_slot(source, fresh)
        elif kind == "view":
            i = draw(pick)
            step, slot = ("view", draw(st.sampled_from(VIEWS)), i), slots[i]
        elif kind == "expand_row":
            i = draw(pick)
            step, slot = ("expand_row", i), Slot(slots[i].base, overlapping=True)
        elif kind == "compute":
            step, slot = _compute(draw, pick, slots, fresh)
            computed.append(step)
        else:
            step = draw(st.sampled_from(computed))
            slot = _compute_slot(step, slots, fresh)
        steps.append(step)
        slots.append(slot)
    written = [step[2] for step in steps if step[0] == "inplace"]  # what the writes did must reach the output
    summed = draw(st.lists(st.integers(0, len(slots) - 1), min_size=1, max_size=3)) + written
    returnable = [i for i, slot in enumerate(slots) if slot.base != "x"]
    returned = draw(st.sampled_from(returnable)) if returnable and draw(st.booleans()) else None
    return n, steps, summed, returned, draw(st.integers(0, 2**16))


def _inplace(draw, slots: list[Slot], writable: list[int]) -> tuple:
    i = draw(st.sampled_from(writable))
    j = draw(st.integers(0, len(slots) - 1))
    op = draw(st.sampled_from(INPLACE_OPS))
    if op == "t_" and not isinstance(slots[i].base, tuple):
        op = "relu_"  # t_ on fresh values only: on a buffer it would change the module's own tensor
    if op in ("add_", "copy_") and slots[j].base == slots[i].base:
        op = "mul_"  # reading the written memory itself: eager refuses partial overlaps
    return "inplace", op, i, "all" if op == "t_" else draw(st.sampled_from(TARGET_VIEWS)), j


def _compute(draw, pick, slots: list[Slot], fresh: object) -> tuple[tuple, Slot]:
    op = draw(st.sampled_from(["add", "mul", "sub", "matmul", "scale", "shift", "relu", "neg", "clone", "contiguous"]))
    op = draw(st.sampled_from([op, op, "dropout", "dropout", "mul_one", "add_zero"]))
    if op in ("add", "mul", "sub", "matmul"):
        step = ("compute", op, draw(pick), draw(pick))
    else:
        step = ("compute", op, draw(pick))
    return step, _compute_slot(step, slots, fresh)


def _compute_slot(step: tuple, slots: list[Slot], fresh: object) -> Slot:
    op, source = step[1], slots[step[2]]
    if op == "dropout":  # eval-mode dropout returns its input itself
        return source
    if op == "contiguous":  # a copy when the input overlaps, else the input itself
        return Slot(source.base, writable=source.overlapping or source.writable)
    return Slot(fresh, writable=True)


class Program(nn.Module):
    """Runs the steps of :func:`programs`; ``forward`` returns ``2 * x + sum(summed)`` and maybe one pool value."""

    def __init__(self, n: int, steps: list[tuple], summed: list[int], returned: int | None, seed: int):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.n, self.steps, self.summed, self.returned = n, steps, summed, returned
        self.w = nn.Parameter(torch.randn(n, n, generator=generator))
        self.v = nn.Parameter(torch.randn(n, generator=generator))
        self.register_buffer("buf", torch.randn(n, n, generator=generator))
        self.register_buffer("r", torch.randn(n, generator=generator))

    def forward(self, x):
        pool: list[torch.Tensor] = []
        for step in self.steps:
            if step[0] == "inplace":
                self._write(pool, *step[1:])
            else:
                pool.append(self._value(pool, step, x))
        out = x * 2
        for i in self.summed:
            out = out + pool[i]
        return out if self.returned is None else (out, pool[self.returned])

    def _value(self, pool: list[torch.Tensor], step: tuple, x: torch.Tensor) -> torch.Tensor:
        kind, n = step[0], self.n
        if kind == "source":
            return {
                "param": lambda: self.w,
                "buffer": lambda: self.buf,
                "param_row_expand": lambda: self.v.expand(n, n),
                "buffer_row_expand": lambda: self.r.expand(n, n),
                "ones": lambda: torch.ones(n, n),
                "ones_expand": lambda: torch.ones(n).expand(n, n),
                "arange": lambda: torch.arange(n * n, dtype=torch.float32).view(n, n) / 4,
                "input": lambda: x,
            }[step[1]]()
        if kind == "view":
            a = pool[step[2]]
            return {
                "t": a.t,
                "transpose": lambda: a.transpose(0, 1),
                "slice": lambda: a[:, :],
                "reshape": lambda: a.reshape(n, n),
                "flat": lambda: a.reshape(-1).reshape(n, n),  # a view where the layout allows, else a copy
                # torch.export records a view, valid for the layout at capture: a rewrite must keep that layout
                "flat_view": lambda: a.view(-1).view(n, n) if a.is_contiguous() else a,
            }[step[1]]()
        if kind == "expand_row":
            return pool[step[1]][0].expand(n, n)
        return _computed(step[1], *(pool[i] for i in step[2:]))

    @staticmethod
    def _write(pool: list[torch.Tensor], op: str, i: int, view: str, j: int) -> None:
        target, source = _target_view(pool[i], view), _fit(pool[j], view)
        if op == "add_":
            target.add_(source)
        elif op == "mul_":
            target.mul_(0.5)
        elif op == "copy_":
            target.copy_(source)
        elif op == "index_put_":
            target.index_put_((torch.tensor([0]),), source.sum())
        elif op == "masked_fill_":
            target.masked_fill_(source > 0, -1.0)
        elif op == "relu_":
            target.relu_()
        else:
            target.t_()  # the same memory, this tensor object transposed


def _computed(op: str, a: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    binary = {"add": torch.add, "mul": torch.mul, "sub": torch.sub, "matmul": torch.matmul}
    if op in binary:
        return binary[op](a, b)
    unary = {
        "scale": lambda: a * 1.5,
        "shift": lambda: a + 0.25,
        "relu": a.relu,
        "neg": a.neg,
        "clone": a.clone,
        "contiguous": a.contiguous,
        "dropout": lambda: F.dropout(a, 0.5, training=False),
        "mul_one": lambda: a * 1,
        "add_zero": lambda: a + 0,
    }
    return unary[op]()


def _target_view(a: torch.Tensor, view: str) -> torch.Tensor:
    return {"all": lambda: a, "row0": lambda: a[0], "col_last": lambda: a[:, -1], "t": a.t, "tail": lambda: a[1:]}[
        view
    ]()


def _fit(a: torch.Tensor, view: str) -> torch.Tensor:
    """``a`` cut to the shape of ``_target_view(., view)``."""
    return {"row0": lambda: a[0], "col_last": lambda: a[0], "tail": lambda: a[1:]}.get(view, lambda: a)()


# --------------------------------------------------------------------------------------------------
# checks


def _capture(program: tuple) -> Captured:
    n, steps, summed, returned, seed = program
    model = Program(n, steps, summed, returned, seed).eval()
    inputs = (torch.randn(n, n, generator=torch.Generator().manual_seed(seed)),)
    captured = capture(model, inputs, method="export")
    assert captured.dialect == "aten" and captured.record.ok, captured.record.checks
    return captured


def _stored(gm: nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in [*gm.named_parameters(), *gm.named_buffers()]}


def _snapshot(captured: Captured) -> tuple[str, dict[str, torch.Tensor]]:
    return captured.graph_module.code, _stored(captured.graph_module)


def _assert_untouched(captured: Captured, snapshot: tuple[str, dict[str, torch.Tensor]], label: str) -> None:
    code, stored = snapshot
    assert captured.graph_module.code == code, f"{label} modified the captured graph"
    now = _stored(captured.graph_module)
    assert now.keys() == stored.keys() and all(torch.equal(now[k], stored[k]) for k in stored), (
        f"{label} changed a stored tensor of the captured graph"
    )


def _clone_tree(value: Any) -> Any:
    return torch.utils._pytree.tree_map_only(torch.Tensor, torch.clone, as_structure(value))


def _assert_same_on_two_calls(captured: Captured, gm: fx.GraphModule, label: str) -> None:
    """Both graphs, fresh copies, called twice on the same input: outputs must match call by call. A buffer
    the graph writes must evolve the same way; a folded value the graph writes would differ on call two."""
    reference, candidate = copy.deepcopy(captured.graph_module), copy.deepcopy(gm)
    with torch.no_grad():
        for call in (1, 2):
            expected = _clone_tree(reference(*_clone_tree(captured.example_inputs)))
            actual = _clone_tree(candidate(*_clone_tree(captured.example_inputs)))
            comparison = compare_outputs(expected, actual)
            assert comparison.ok, (label, f"call {call}", comparison.problems)


def _assert_no_overlapping_storage(gm: fx.GraphModule, label: str) -> None:
    """No stored tensor has elements sharing memory: writing it (load_state_dict, a buffer restore) must work."""
    for name, tensor in [*gm.named_parameters(), *gm.named_buffers()]:
        assert torch._debug_has_internal_overlap(tensor) == 0, f"{label}: {name} {tensor.stride()} overlaps"
    gm.load_state_dict(gm.state_dict())


def _check(captured: Captured, gm: fx.GraphModule, label: str) -> None:
    result = verify(captured, gm, seeds=(0, 1))
    assert result.ok, (label, result.divergence.describe() if result.divergence else result.problems)
    _assert_same_on_two_calls(captured, gm, label)
    _assert_no_overlapping_storage(gm, label)


@SETTINGS
@given(program=programs())
def test_every_exact_pass_alone_on_aten_views_and_writes(program):
    captured = _capture(program)
    snapshot = _snapshot(captured)
    for name in EXACT:
        result = apply_pass(captured.graph_module, name)
        _assert_untouched(captured, snapshot, name)
        _check(captured, result.graph_module, name)


@SETTINGS
@given(program=programs())
def test_all_exact_passes_in_sequence_on_aten_views_and_writes(program):
    captured = _capture(program)
    snapshot = _snapshot(captured)
    gm = captured.graph_module
    for name in EXACT:
        gm = apply_pass(gm, name).graph_module
    _assert_untouched(captured, snapshot, "the sequence")
    _check(captured, gm, " -> ".join(EXACT))


def test_the_exact_passes_are_listed():
    # an empty list would make every property above hold vacuously
    assert {"remove_dropout", "remove_identity", "cse", "fold_constants", "dead_code"} <= set(EXACT)


@pytest.mark.parametrize("kind", ["ones_expand", "param_row_expand"])
def test_the_programs_write_through_views(kind):
    # guards the generator: a write into a row of a fresh tensor's transpose writes a column of the tensor
    steps = [("source", "ones"), ("view", "t", 0), ("source", kind), ("inplace", "add_", 1, "row0", 2)]
    model = Program(3, steps, summed=[0], returned=1, seed=0)
    out, view = model(torch.zeros(3, 3))
    row = model._value([], ("source", kind), torch.zeros(3, 3))[0]
    assert torch.equal(view[0], 1 + row) and torch.equal(out[:, 0], view[0])
