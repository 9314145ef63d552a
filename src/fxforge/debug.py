"""Debug: forward hooks on the model itself, for models that cannot be captured (or before trying to).

* ``nan``: every module's output is checked as it is produced; the first module whose output holds NaN or Inf
  while its inputs were finite is named -- with the inputs that triggered it -- since the modules after it only
  carry the NaN along. Several input cases (the distributions of verification) are tried until one triggers it.
* ``stats``: per-module activation statistics (calls, min/max/mean/std over finite values, NaN/Inf counts,
  fraction of zeros) over every float tensor a module returns, gathered by the same recorder ``insert_after``'s
  ``stats`` insert uses, so both report alike (:class:`~fxforge.passes.insert_after.SiteStats`).

The model runs as it is, in its own mode, on copies of the inputs; its state is restored afterwards and the
hooks are removed even when it raises.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from fxforge import display
from fxforge.compare import tensors_in
from fxforge.errors import FxforgeError, one_line_reason, option
from fxforge.inputs import DISTRIBUTIONS, draw_like
from fxforge.passes.insert_after import SiteStats, StatsRecorder, read_stats
from fxforge.runtime import cloned, inputs_rejected, keeps_rng_state, preserved_state, quiet_torch_logs


@dataclass
class TensorSummary:
    """What a tensor held: enough to see why a layer went non-finite."""

    shape: list[int]
    dtype: str
    nan: int
    inf: int
    min: float | None  # over finite values
    max: float | None


@dataclass
class NonFinite:
    """The first module that turned finite inputs into a NaN/Inf output."""

    module: str
    type: str
    call: int  # the how-many-th call of that module in the run
    case: str  # which inputs: "the example inputs" or a verification case label
    output: TensorSummary
    inputs: list[TensorSummary]
    inputs_already_non_finite: bool  # the model's own input held NaN/Inf: nothing inside is to blame

    def describe(self) -> str:
        where = f"{self.module} ({self.type})" if self.module else f"the model itself ({self.type})"
        counts = f"{self.output.nan} NaN and {self.output.inf} Inf"
        if not self.inputs_already_non_finite:
            return f"{where} produced {counts} in its output from finite inputs (call {self.call}, {self.case})"
        parent = self.module.rpartition(".")[0] or "the model's own forward"
        return (
            f"{where} returned {counts}, but its input already held NaN/Inf: the code that computes that input "
            f"(in {parent}, outside any submodule) or the model's input made it (call {self.call}, {self.case})"
        )


@dataclass
class DebugReport:
    modules: int  # modules watched
    cases: list[str]  # the inputs run
    nan: NonFinite | None = None
    stats: dict[str, SiteStats] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # a case on which the model itself raised

    def __repr__(self) -> str:  # the dataclass's would print every module's statistics
        return display.debug_repr(self)

    def _repr_html_(self) -> str:  # Jupyter shows this for the last value of a cell
        return display.debug_html(self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "modules": self.modules,
            "cases": self.cases,
            "nan": asdict(self.nan) if self.nan else None,
            "stats": {name: stats.to_dict() for name, stats in self.stats.items()},
            "errors": self.errors,
        }


@keeps_rng_state
def debug_model(
    model: nn.Module,
    inputs: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
    *,
    nan: bool = True,
    stats: bool = False,
    cases: int = 1,
    seed: int = 0,
) -> DebugReport:
    """Run ``model`` with forward hooks on every submodule (see the module docstring).

    ``cases``: the example inputs, then up to ``cases - 1`` more drawn like them from the verification
    distributions, until a NaN/Inf is found (with ``stats``, every case is run and counted).
    """
    if not isinstance(model, nn.Module):  # a spec string raised a bare AttributeError (QA)
        raise FxforgeError(
            f"debug_model runs a module, not a {type(model).__name__}",
            hint="load a spec first: fxforge.load_model('torchvision:resnet18').module",
        )
    if not nan and not stats:
        raise FxforgeError(
            "debug needs something to look for", hint=f"pass {option('--nan', True)} and/or {option('--stats', True)}"
        )
    if cases < 1:
        raise FxforgeError("debug needs at least one case")
    kwargs = dict(kwargs or {})
    # a TorchScript submodule takes no hooks ("register_forward_pre_hook is not supported on ScriptModules", which
    # read as the model rejecting its inputs, QA): it is watched as a whole by its parent's hooks
    names = {module: name for name, module in model.named_modules() if not isinstance(module, torch.jit.ScriptModule)}
    if not names:  # a TorchScript model as a whole: "no NaN in any module's output (0 modules)" checked nothing (QA)
        raise FxforgeError(
            f"debug cannot watch a {type(model).__name__}: none of its modules takes forward hooks (TorchScript)",
            hint="debug the PyTorch model it was made from (an fxforge output directory's model.pt loads with "
            f"{option('--trust-pickle', True)})",
        )
    report = DebugReport(len(names), [])
    recorders = {name: StatsRecorder(name or "<root>", name) for name in names.values()} if stats else {}
    for label, (args, case_kwargs) in _cases(tuple(inputs), kwargs, cases, seed):
        report.cases.append(label)
        watcher = _Watcher(names, label, recorders)
        try:
            with preserved_state(model), torch.no_grad(), quiet_torch_logs(), watcher.hooked(model):
                model(*cloned(args), **cloned(case_kwargs))
        except Exception as exc:
            if not report.cases[:-1]:  # the example itself fails: that is the user's input, not a finding
                # the user's line and a hint, as every other command gives them (QA: debug gave neither)
                raise inputs_rejected(model, args, case_kwargs, exc) from None
            report.errors.append(f"{label}: {one_line_reason(exc)}")
        if nan and watcher.first is not None and report.nan is None:
            report.nan = watcher.first
            if not stats:
                break
    report.stats = {name: read_stats(name or "<root>", recorder) for name, recorder in recorders.items()}
    return report


def _cases(args: tuple, kwargs: dict, count: int, seed: int) -> Iterator[tuple[str, tuple[tuple, dict]]]:
    yield "the example inputs", (args, kwargs)
    for index in range(1, count):
        distribution = DISTRIBUTIONS[(index - 1) % len(DISTRIBUTIONS)]
        drawn_args, drawn_kwargs = draw_like((args, kwargs), distribution, seed + index, None)
        yield f"{distribution}, seed {seed + index}", (drawn_args, drawn_kwargs)


class _Watcher:
    """Forward hooks that check (and record) every module's output in one run."""

    def __init__(self, names: dict[nn.Module, str], label: str, recorders: dict[str, StatsRecorder]) -> None:
        self.names, self.label, self.recorders = names, label, recorders
        self.calls: dict[str, int] = {}
        self.first: NonFinite | None = None
        # each running call's inputs as they were when it started, innermost call last: a module that writes NaN
        # into its input in place (x.div_(x.norm())) had been blamed on whatever computed that input
        self._inputs_before: list[list[TensorSummary]] = []

    @contextlib.contextmanager
    def hooked(self, model: nn.Module) -> Iterator[None]:
        self._inputs_before.clear()  # a run the model raised in left calls that never finished
        handles = [module.register_forward_pre_hook(self._before) for module in self.names]
        handles += [module.register_forward_hook(self._after) for module in self.names]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _before(self, module: nn.Module, args: Any) -> None:
        found = self.first is not None  # once found, nothing more is summarised
        self._inputs_before.append([] if found else [_summary(t) for t in _float_tensors(args)])

    def _after(self, module: nn.Module, args: Any, output: Any) -> None:
        inputs_before = self._inputs_before.pop() if self._inputs_before else None
        name = self.names[module]
        self.calls[name] = self.calls.get(name, 0) + 1
        tensors = _float_tensors(output)
        if name in self.recorders and tensors:
            # every float tensor of the output (an LSTM's (out, (h, c)), a dict): one value per call, as one tensor
            whole = tensors[0] if len(tensors) == 1 else torch.cat([t.detach().reshape(-1).float() for t in tensors])
            self.recorders[name](whole)
        if self.first is not None or not any(_non_finite(t) for t in tensors):
            return
        inputs = inputs_before if inputs_before is not None else [_summary(t) for t in _float_tensors(args)]
        # Hooks fire as modules finish, innermost first: the first non-finite output seen is the module that
        # produced it -- unless its own inputs already held NaN/Inf when it started, which only the model's input
        # (or code outside any submodule) can at that point.
        self.first = NonFinite(
            module=name,
            type=type(module).__name__,
            call=self.calls[name],
            case=self.label,
            output=_summary(next(t for t in tensors if _non_finite(t))),
            inputs=inputs,
            inputs_already_non_finite=any(summary.nan or summary.inf for summary in inputs),
        )


def _float_tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tensors_in(value) if t.is_floating_point() or t.is_complex()]


def _non_finite(tensor: torch.Tensor) -> bool:
    return tensor.numel() > 0 and not bool(torch.isfinite(tensor).all())


def _summary(tensor: torch.Tensor) -> TensorSummary:
    values = tensor.detach().float()
    finite = values[torch.isfinite(values)]
    return TensorSummary(
        list(tensor.shape),
        str(tensor.dtype).removeprefix("torch."),
        int(torch.isnan(values).sum()),
        int(torch.isinf(values).sum()),
        float(finite.min()) if finite.numel() else None,
        float(finite.max()) if finite.numel() else None,
    )
