"""Auto-optimize: try every way fxforge can run a model, keep the ones that are proven right, time them
side by side, and write the fastest -- ``fxforge optimize MODEL --auto -o OUTDIR``.

Steps:

1. run the exact passes (:func:`fxforge.passes.exact_passes`) one by one, each verified against the
   model within the tolerance; a pass that fails verification is dropped (and reported);
2. build every candidate backend of the :mod:`fxforge.bench` registry on the rewritten graph:
   eager (the baseline), fx, torchscript, onnxruntime, compile -- and, only when the user grants an
   accuracy budget beyond fp32 round-off, bf16 and int8;
3. verify each candidate against the original model: exact candidates on random inputs (three
   seeds) within ``tolerance`` (normwise: ``max|a - b| <= tolerance * max|ref| + tolerance / 10``);
   reduced-precision candidates against the budget on the user's data (``data``), or on random
   inputs with a warning when there is none;
4. benchmark the survivors with :func:`fxforge.bench.bench` (interleaved rounds, same inputs);
5. write the fastest survivor's artifact into the output directory (atomically) together with
   ``report.json``: every candidate with its speed, error and, for those not chosen, why.

A candidate that fails verification is never timed, let alone chosen: the choice is made only among
candidates whose verification passed.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fxforge.artifacts import (
    INPUTS_FILE,
    MODEL_FILE,
    REPORT_FILE,
    TORCHSCRIPT_FILE,
    atomic_directory,
    save_graph_module,
    write_inputs,
)
from fxforge.bench import (
    TORCHSCRIPT_BUILD_FILE,
    Backend,
    BenchReport,
    BuildSettings,
    Runner,
    bench,
    build_backend,
    get_backend,
)
from fxforge.capture import Captured, require_real_weights
from fxforge.errors import FxforgeError, one_line_reason
from fxforge.passes import exact_passes
from fxforge.pipeline import Pipeline
from fxforge.quantize import compare_batches, load_calibration, picklable_quantized_modules, run_batches
from fxforge.runtime import quiet_torch_logs, run_reference
from fxforge.verify import TOLERANCES, compare_outputs, verify

FP32_TOLERANCE = TOLERANCES[torch.float32][0]  # fp32 round-off: what the exact candidates are held to
EXACT_BACKENDS = ("eager", "fx", "torchscript", "onnxruntime", "compile")
REDUCED_BACKENDS = ("bf16", "autocast", "int8")

RANDOM_DATA_WARNING = (
    "reduced-precision candidates were measured on random inputs: their accuracy on real data is unknown; "
    "pass --data (a torch.save file or file.py:function) to measure it on yours"
)


class AutoWarning(UserWarning):
    """A reduced-precision candidate was judged on random inputs."""


@dataclass
class Budget:
    """How far a candidate may be from the original.

    ``tolerance`` holds for every candidate (normwise, see the module docstring). Reduced precision
    (bf16, int8) is tried only when the user grants more than fp32 round-off: ``tolerance`` above
    :data:`FP32_TOLERANCE` or a ``min_agreement`` (fraction of samples whose top-1 class must match
    the original's; classifiers only). With ``min_agreement`` alone, reduced-precision candidates are
    judged by agreement only.
    """

    tolerance: float = FP32_TOLERANCE
    min_agreement: float | None = None

    def __post_init__(self) -> None:
        if not self.tolerance > 0:
            raise FxforgeError("--tolerance must be positive", hint="e.g. --tolerance 1e-4")
        if self.min_agreement is not None and not 0 < self.min_agreement <= 1:
            raise FxforgeError("--min-agreement is a fraction in (0, 1]", hint="e.g. --min-agreement 0.99")

    @property
    def reduced_precision(self) -> bool:
        return self.tolerance > FP32_TOLERANCE or self.min_agreement is not None

    @property
    def rtol_atol(self) -> tuple[float, float]:
        return self.tolerance, self.tolerance / 10


@dataclass
class Candidate:
    """One backend's fate: ``status`` is chosen, accepted (verified, slower), rejected or failed."""

    name: str
    status: str = "pending"
    reason: str | None = None
    exact: bool = True
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    top1_agreement: float | None = None
    verified_on: str | None = None
    median_ms: float | None = None
    p90_ms: float | None = None
    speedup: float | None = None
    peak_mem_mib: float | None = None
    build_s: float | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class AutoResult:
    chosen: str
    candidates: list[Candidate]
    passes: list[str]
    rejected_passes: dict[str, str]
    budget: Budget
    output_dir: Path | None
    files: list[str]
    load: str  # how to load the artifact
    warnings: list[str] = field(default_factory=list)
    bench: BenchReport | None = None
    runner: Any = field(default=None, repr=False)  # the chosen callable, built and verified, in memory

    def to_dict(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen,
            "load": self.load,
            "output_dir": str(self.output_dir) if self.output_dir else None,
            "files": self.files,
            "passes": self.passes,
            "rejected_passes": self.rejected_passes,
            "budget": dataclasses.asdict(self.budget),
            "warnings": self.warnings,
            "candidates": [c.to_dict() for c in self.candidates],
            "bench": self.bench.to_dict() if self.bench else None,
        }


def auto_optimize(
    captured: Captured,
    output_dir: str | Path | None = None,
    *,
    budget: Budget | None = None,
    backends: Sequence[str | Backend] | None = None,
    data: Any = None,
    seeds: Sequence[int] = (0, 1, 2),
    warmup: int = 3,
    repeats: int = 20,
    threads: int | None = None,
    force: bool = False,
    spec: str | None = None,
) -> AutoResult:
    """Choose and write the fastest verified way to run ``captured`` (see the module docstring).

    ``backends``: candidate names or :class:`~fxforge.bench.Backend` objects (default: the exact
    backends, plus bf16 and int8 when the budget allows). ``data``: the user's inputs for judging
    reduced precision (and calibrating int8), in any form :func:`fxforge.quantize.load_calibration`
    reads. Without ``output_dir`` nothing is written.
    """
    require_real_weights(captured, "optimize --auto")
    budget = budget or Budget()
    chosen_backends = _candidate_backends(backends, budget)
    result_warnings: list[str] = []
    passes, rejected_passes, graph = _apply_exact_passes(captured, budget)
    rewritten = dataclasses.replace(captured, graph_module=graph)
    eval_data = _evaluation_data(captured, data, budget, chosen_backends, result_warnings)

    candidates = {b.name: Candidate(b.name, exact=b.name not in REDUCED_BACKENDS) for b in chosen_backends}
    with tempfile.TemporaryDirectory(prefix="fxforge-auto-") as workdir:
        runners = _build(rewritten, chosen_backends, candidates, Path(workdir), eval_data, threads)
        for name, runner in list(runners.items()):
            if not _verify_candidate(captured, candidates[name], runner, budget, seeds, eval_data):
                del runners[name]
        if not runners:
            raise FxforgeError("no candidate passed verification", hint="see the candidates' reasons with --json")
        report = _time(rewritten, runners, warmup, repeats, threads)
        _record_timings(candidates, report)
        chosen = _choose(candidates)
        files: list[str] = []
        load = _LOAD.get(chosen, "see report.json")
        result = AutoResult(
            chosen,
            list(candidates.values()),
            passes,
            rejected_passes,
            budget,
            None,
            files,
            load,
            result_warnings,
            report,
            runners[chosen],
        )
        if output_dir is not None:
            result.output_dir = Path(output_dir)
            result.files = _write(result, rewritten, runners[chosen], Path(workdir) / chosen, force, spec)
    return result


# --------------------------------------------------------------------------------------------------
# steps


def _candidate_backends(backends: Sequence[str | Backend] | None, budget: Budget) -> list[Backend]:
    if backends is None:
        names: list[str | Backend] = list(EXACT_BACKENDS)
        if budget.reduced_precision:
            names += list(REDUCED_BACKENDS)
        # never offer a path this machine cannot run fast (bf16 without AVX512-BF16/AMX: emulated, slower than fp32)
        names = [name for name in names if get_backend(str(name)).unsupported_here() is None]
    else:
        names = list(backends)
        if "eager" not in [b if isinstance(b, str) else b.name for b in names]:
            names.insert(0, "eager")  # the baseline every speedup is measured against
    chosen = [b if isinstance(b, Backend) else get_backend(b) for b in names]
    if not budget.reduced_precision:
        refused = [b.name for b in chosen if b.name in REDUCED_BACKENDS]
        if refused:
            raise FxforgeError(
                f"{', '.join(refused)} cannot meet fp32 round-off",
                hint="grant an accuracy budget: --tolerance above 1e-4 or --min-agreement (e.g. 0.99)",
            )
    return chosen


def _apply_exact_passes(captured: Captured, budget: Budget):
    """Run the exact passes as a verified pipeline; a pass that fails verification (or crashes) is rolled back
    and reported, and the others still run."""
    rtol, atol = budget.rtol_atol
    pipeline = Pipeline(exact_passes(), verify_each=True, lint_between=False, keep_going=True, rtol=rtol, atol=atol)
    result = pipeline.run(captured)
    if result.problem:
        raise FxforgeError(result.problem, hint="call model.eval() for inference, or remove the randomness")
    rejected = {step.result.name: step.rolled_back or "" for step in result.rolled_back}
    applied = [step.result.name for step in result.steps if step.result.changed and not step.rolled_back]
    return applied, rejected, result.graph_module


def _evaluation_data(
    captured: Captured, data: Any, budget: Budget, backends: Sequence[Backend], notes: list[str]
) -> Any:
    if not any(b.name in REDUCED_BACKENDS for b in backends):
        return None
    loaded = load_calibration(data, captured.example_inputs, kind="eval")
    if loaded.random:
        warnings.warn(RANDOM_DATA_WARNING, AutoWarning, stacklevel=3)
        notes.append(RANDOM_DATA_WARNING)
    return loaded


def _build(
    rewritten: Captured,
    backends: Sequence[Backend],
    candidates: dict[str, Candidate],
    workdir: Path,
    eval_data: Any,
    threads: int | None,
) -> dict[str, Runner]:
    expected = run_reference(rewritten.original, rewritten.example_inputs, {})
    runners: dict[str, Runner] = {}
    calibration = eval_data if eval_data is not None and not eval_data.random else None
    for backend in backends:
        candidate = candidates[backend.name]
        settings = BuildSettings(threads or torch.get_num_threads(), workdir / backend.name, expected)
        settings.calibration = calibration
        runner, error, candidate.build_s = build_backend(backend, rewritten, settings)
        candidate.notes = settings.notes
        if runner is None:
            candidate.status, candidate.reason = "failed", error
        else:
            runners[backend.name] = runner
    return runners


class _AsModule(nn.Module):
    """A plain callable behind nn.Module's interface, for :func:`fxforge.verify.verify`."""

    def __init__(self, function: Runner) -> None:
        super().__init__()
        self.function = function

    def forward(self, *args: Any) -> Any:
        return self.function(*args)


def _verify_candidate(
    captured: Captured,
    candidate: Candidate,
    runner: Runner,
    budget: Budget,
    seeds: Sequence[int],
    eval_data: Any,
) -> bool:
    module = runner if isinstance(runner, nn.Module) else _AsModule(runner)
    try:
        if candidate.exact:
            ok, reason = _verify_exact(captured, candidate, module, budget, seeds)
        else:
            ok, reason = _verify_reduced(captured, candidate, module, budget, eval_data)
    except Exception as exc:
        ok, reason = False, f"failed to run: {one_line_reason(exc)}"
    candidate.status = "accepted" if ok else "rejected"
    candidate.reason = None if ok else reason
    return ok


def _verify_exact(captured: Captured, candidate: Candidate, module: nn.Module, budget: Budget, seeds: Sequence[int]):
    rtol, atol = budget.rtol_atol
    # At the example's batch size only: exported and compiled candidates are built for the batch they are timed at.
    check = verify(
        captured.original,
        module,
        example=(captured.example_inputs, captured.example_kwargs),
        batch_sizes=[None],
        seed=seeds[0] if seeds else 0,
        rtol=rtol,
        atol=atol,
        bisect=False,
    )
    candidate.max_abs_err, candidate.max_rel_err = check.max_abs_err, check.max_rel_err
    candidate.verified_on = check.describe_inputs()
    reason = "verification failed: " + "; ".join(check.problems[:2]) if not check.ok else None
    return check.ok, reason


def _verify_reduced(captured: Captured, candidate: Candidate, module: nn.Module, budget: Budget, eval_data: Any):
    reference, actual = run_batches(captured.original, eval_data.batches), run_batches(module, eval_data.batches)
    accuracy = compare_batches(reference, actual, eval_data.source)
    candidate.max_abs_err, candidate.top1_agreement = accuracy.max_abs_err, accuracy.top1_agreement
    candidate.max_rel_err = accuracy.rel_err
    candidate.verified_on = eval_data.source
    if budget.min_agreement is not None:
        if accuracy.top1_agreement is None:
            return False, "top-1 agreement needs a classifier (2-D logits as the first output)"
        if accuracy.top1_agreement < budget.min_agreement:
            return False, f"top-1 agreement {accuracy.top1_agreement:.4f} < {budget.min_agreement}"
    if budget.tolerance > FP32_TOLERANCE:
        rtol, atol = budget.rtol_atol
        for ref_batch, cand_batch in zip(reference, actual):
            comparison = compare_outputs(ref_batch, cand_batch, rtol, atol)
            if not comparison.ok:
                return False, f"beyond --tolerance {budget.tolerance:g}: {comparison.problems[0]}"
    return True, None


def _time(rewritten: Captured, runners: dict[str, Runner], warmup: int, repeats: int, threads: int | None):
    """Benchmark the already-built survivors side by side (no second build)."""
    prebuilt = [Backend(name, "verified candidate", _prebuilt(runner)) for name, runner in runners.items()]
    return bench(rewritten, prebuilt, warmup=warmup, repeats=repeats, threads=threads)


def _prebuilt(runner: Runner):
    return lambda captured, settings: runner


def _record_timings(candidates: dict[str, Candidate], report: BenchReport) -> None:
    for row in report.rows:
        candidate = candidates[row.backend]
        if row.error:
            candidate.status, candidate.reason = "failed", row.error
            continue
        candidate.median_ms, candidate.p90_ms = row.median_ms, row.p90_ms
        candidate.speedup, candidate.peak_mem_mib = row.speedup, row.peak_mem_mib


def _choose(candidates: dict[str, Candidate]) -> str:
    timed = [c for c in candidates.values() if c.status == "accepted" and c.median_ms is not None]
    if not timed:
        raise FxforgeError("no verified candidate could be timed", hint="see the candidates' reasons with --json")
    best = min(timed, key=lambda c: c.median_ms)
    best.status = "chosen"
    for candidate in timed:
        if candidate is not best:
            candidate.reason = f"verified; {candidate.median_ms / best.median_ms:.2f}x slower than {best.name}"
    return best.name


# --------------------------------------------------------------------------------------------------
# the artifact

_LOAD = {
    "eager": "torch.load('model.pt', weights_only=False)",
    "fx": "torch.load('model.pt', weights_only=False)  # or torch.export.load('model.pt2').module()",
    "torchscript": "torch.jit.optimize_for_inference(torch.jit.load('model.torchscript.pt'))",
    "onnxruntime": "onnxruntime.InferenceSession('model.onnx')",
    "compile": "torch.compile(torch.load('model.pt', weights_only=False)), first call under "
    "torch._inductor.config.patch(freezing=True)  # compiled code is not saved",
    "int8": "torch.load('model.pt', weights_only=False)",
    "bf16": "torch.load('model.pt', weights_only=False)",
}


def _write(
    result: AutoResult, rewritten: Captured, runner: Runner, built_dir: Path, force: bool, spec: str | None
) -> list[str]:
    assert result.output_dir is not None
    chosen = result.chosen
    with atomic_directory(result.output_dir, force=force) as staging:
        if chosen == "torchscript":
            shutil.copy(built_dir / TORCHSCRIPT_BUILD_FILE, staging / TORCHSCRIPT_FILE)
        elif chosen == "onnxruntime":
            for file in built_dir.iterdir():  # the model and, over 2 GB, its external data
                shutil.copy(file, staging / file.name)
        elif chosen in ("fx", "compile"):
            save_graph_module(
                rewritten.graph_module,
                staging,
                rewritten.example_inputs,
                rewritten.dialect,
                rewritten.example_kwargs,
            )
        else:
            _save_module(chosen, runner if chosen != "eager" else rewritten.original, staging / MODEL_FILE, rewritten)
        if not (staging / INPUTS_FILE).exists():
            write_inputs(staging, rewritten.example_inputs)
        report = {"model": spec, "capture": rewritten.record.to_dict(), **result.to_dict()}
        report["files"] = [*sorted(p.name for p in staging.iterdir()), REPORT_FILE]
        (staging / REPORT_FILE).write_text(json.dumps(report, indent=2, default=str))
        return sorted(p.name for p in staging.iterdir())


def _save_module(name: str, module: Any, path: Path, rewritten: Captured) -> None:
    """``torch.save`` the chosen module and check that the file computes what the module computes."""
    import contextlib

    saving = contextlib.nullcontext()
    if name == "int8":
        saving = picklable_quantized_modules(module)
    with saving, quiet_torch_logs():
        torch.save(module, path)
    with quiet_torch_logs():
        loaded = torch.load(str(path), map_location="cpu", weights_only=False)
    inputs = rewritten.example_inputs
    comparison = compare_outputs(run_reference(module, inputs, {}), run_reference(loaded, inputs, {}))
    if not comparison.ok:
        raise FxforgeError(f"the saved {name} model does not reload to the same outputs: {comparison.problems[0]}")
