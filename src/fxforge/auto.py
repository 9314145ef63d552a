"""Auto-optimize: try every way fxforge can run a model, keep the ones that are proven right, time them
side by side, and write the fastest -- ``fxforge optimize MODEL --auto -o OUTDIR``.

Steps:

1. run the exact passes (:func:`fxforge.passes.exact_passes`) one by one, each verified against the
   model within the tolerance; a pass that fails verification is dropped (and reported);
2. write every candidate's artifact (:mod:`fxforge.deploy`: an AOTInductor package for ``compile``, a
   TorchScript or ONNX file, a ``.pt2`` program...) from the rewritten graph, and **load it back** the way a
   user will: everything after this step runs the reloaded artifact, so the speed reported is the speed the
   output directory delivers. The candidates: eager (the baseline), fx, torchscript (also with oneDNN graph
   fusion), onnxruntime and compile, plus channels-last variants for convolutional models -- and, only
   when the user grants an accuracy budget beyond fp32 round-off, bf16/autocast (where the CPU runs bf16
   natively), fxforge's int8 and ONNX Runtime's (``ort_int8``: static QDQ, per-channel weights, calibrated on
   the same data). ``quick`` tries the few that usually win for this kind of model on this hardware;
3. verify each candidate against the original model: exact candidates on 16 varied inputs within
   each output dtype's round-off (verify's tolerances: float32 ``rtol 1e-4, atol 1e-5``, float64 ``1e-7, 1e-9``,
   float16 ``1e-2, 1e-3``...), or a ``tolerance`` the user gives (normwise: ``max|a - b| <= tolerance * max|ref| +
   tolerance / 10``, for every dtype); reduced-precision
   candidates against the budget on the user's data (``data``), or on random inputs with a warning;
4. time the survivors with :func:`fxforge.bench.bench` (interleaved rounds, same inputs);
5. choose: the fastest (by median, then by the median of its per-round ratios against any that beat it round by
   round), unless a simpler artifact is not measurably slower -- each candidate's
   time is compared with the fastest's round by round, with a 95% bootstrap confidence interval of the
   median ratio; a candidate whose ratio is within 2%, or within 10% with an interval that reaches 1, ties
   with it, and the simplest tie wins (:data:`SIMPLICITY`), so two runs on the same model agree on the choice
   (a wide interval alone is no tie: on a noisy machine a candidate 3x slower by median could not be told
   apart from the fastest at 95%, and choosing it would throw the speed away); a choice that ties only by its
   interval is timed against the fastest for more rounds and the choice made again on all of them;
6. copy the chosen artifact into the output directory (atomically) with ``report.json``: every candidate
   with its speed, confidence interval, fraction of the machine's peak, error and, for those not chosen, why.

A candidate that fails verification is never timed, let alone chosen.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fxforge.artifacts import (
    AOTI_FILE,
    INPUTS_FILE,
    MODEL_FILE,
    ONNX_FILE,
    PROGRAM_FILE,
    REPORT_FILE,
    TORCHSCRIPT_FILE,
    atomic_directory,
    check_free_space,
    check_output_directory,
    load_line_from_anywhere,
    write_inputs,
    write_report,
)
from fxforge.bench import (
    Backend,
    BenchReport,
    BuildSettings,
    Runner,
    bench,
    build_backend,
    build_failure,
    get_backend,
    model_device,
    paired_ratios,
    ratio_interval,
    set_speedups,
)
from fxforge.capture import Captured, require_captured, require_real_weights
from fxforge.deploy import (
    PLAIN_TORCH_LOAD,
    Artifact,
    deployable,
    reload_artifact,
    write_artifact,
    write_model_itself,
)
from fxforge.errors import FxforgeError, InputSpecError, one_line_reason, option, outside_stacklevel, said
from fxforge.machine import native_bf16
from fxforge.passes import exact_passes, onednn_linear
from fxforge.pipeline import Pipeline
from fxforge.quantize import Target, compare_batches, load_calibration, run_batches
from fxforge.runtime import (
    batch_of,
    describe_inputs,
    keeps_rng_state,
    quiet_torch_logs,
    run_reference,
    with_constant_kwargs,
)
from fxforge.verify import TOLERANCES, compare_outputs, verify

FP32_TOLERANCE = TOLERANCES[torch.float32][0]  # fp32 round-off: what the exact candidates are held to
# compile+recipe: the same compiled model shipped as model.pt2 + recipe (compiled when loaded), which can run
# faster than compile's AOTInductor package (docs/commands/optimize.md)
# onnxruntime+streams: the batch split over one-thread streams (batch 2 or more, 2 threads or more), which beat one
# call on both threads on the depthwise nets at batch 8 (docs/benchmarks.md)
EXACT_BACKENDS = (
    *("eager", "fx", "fx+onednn_linear", "torchscript", "torchscript+onednn", "onnxruntime", "onnxruntime+streams"),
    *("compile", "compile+recipe"),
)
# Layout variants tried for models with 2-D convolutions, where oneDNN's own layout can pay.
CONV_VARIANTS = ("compile+channels_last", "torchscript+channels_last")
# ort_int8+streams: ONNX Runtime's int8 in streams (mobilenet_v2 at batch 8 on an AMD EPYC: 1.25x one call)
REDUCED_BACKENDS = ("bf16", "autocast", "int8", "ort_int8", "ort_int8+streams")
# --quick: the candidates that usually win, per kind of model (what was measured: docs/benchmarks.md)
# fx+onednn_linear where the model has float32 Linear layers: on an AMD EPYC with AVX-512 MKL's fp32 matmul runs at
# half oneDNN's rate, and neither eager nor Inductor leaves MKL (BERT-base: 1.9x over eager, alone of the torch paths)
QUICK_EXACT = ("fx", "fx+onednn_linear", "onnxruntime", "onnxruntime+streams", "compile", "compile+recipe")
# compile and compile+channels_last both: which layout Inductor runs faster depends on the CPU (mobilenet_v2, batch
# 1: channels-last 1.3x faster on the AMX Xeon, 1.1x slower on an AMD EPYC with AVX-512)
QUICK_CONV = ("fx", "onnxruntime", "onnxruntime+streams", "compile", "compile+channels_last")
QUICK_REPEATS = 10

# Artifacts from simplest to most demanding to ship and load: the choice among candidates that tie within
# noise (plain torch needs nothing else; TorchScript is deprecated upstream; AOTInductor code is compiled for
# this CPU; ONNX Runtime is another runtime; reduced precision changes the numbers).
SIMPLICITY = ("eager", "fx", "torchscript", "compile", "onnxruntime", "autocast", "bf16", "int8", "ort_int8")
# A candidate this close to the fastest (median of the per-round ratios) ties with it whatever the interval says.
PRACTICALLY_EQUAL = 0.02
# ... and one this close ties when its 95% interval reaches 1 (not measurably slower). Further away, noise is
# no reason to give the speed up: the fastest by median is the better bet.
WITHIN_NOISE = 0.10
# A choice that ties with the fastest only by its interval is timed against it this many times the rounds more
# (see _settle_close_call).
RUNOFF_FACTOR = 2


def random_data_warning() -> str:
    return (
        "reduced-precision candidates were measured on random inputs: their accuracy on real data is unknown; "
        f"pass {option('--data', python='data')} (a torch.save file or file.py:function) to measure it on yours"
    )


class AutoWarning(UserWarning):
    """A reduced-precision candidate was judged on random inputs, or int8 on the data it was calibrated on."""


@dataclass
class Budget:
    """How far a candidate may be from the original.

    ``tolerance`` holds for every candidate (normwise, see the module docstring); the default,
    :data:`FP32_TOLERANCE`, means each output dtype's own round-off (:data:`fxforge.compare.TOLERANCES`).
    Reduced precision (bf16, int8) is tried only when the user grants more than fp32 round-off: ``tolerance`` above
    :data:`FP32_TOLERANCE` or a ``min_agreement`` (fraction of samples whose top-1 class must match
    the original's; classifiers only) or a ``max_drop`` (how much top-1 accuracy may fall, as a fraction:
    measured on the labels of the evaluation data when it has them, else bounded by ``1 - agreement``, never
    optimistic). With ``min_agreement`` or ``max_drop`` alone, reduced-precision candidates are judged by those
    only.
    """

    tolerance: float = FP32_TOLERANCE
    min_agreement: float | None = None
    max_drop: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.tolerance < math.inf:  # infinity admits any candidate: nothing would be verified
            raise FxforgeError(
                f"{option('--tolerance')} must be a finite positive number", hint=f"e.g. {option('--tolerance', 1e-4)}"
            )
        if self.min_agreement is not None and not 0 < self.min_agreement <= 1:
            raise FxforgeError(
                f"{option('--min-agreement')} is a fraction in (0, 1]", hint=f"e.g. {option('--min-agreement', 0.99)}"
            )
        if self.max_drop is not None and not 0 <= self.max_drop < 1:
            hint = f"e.g. {option('--max-drop', 0.01)} for one point"
            raise FxforgeError(f"{option('--max-drop')} is a fraction in [0, 1)", hint=hint)

    @property
    def reduced_precision(self) -> bool:
        return self.tolerance > FP32_TOLERANCE or self.min_agreement is not None or self.max_drop is not None

    @property
    def per_dtype(self) -> bool:
        """The default tolerance: each output dtype's round-off (verify's table), not one number for all."""
        return self.tolerance == FP32_TOLERANCE

    @property
    def rtol_atol(self) -> tuple[float | None, float | None]:
        # None, None: verify's per-dtype tolerances. One number for every dtype held a float64 model to float32's
        # round-off (a candidate computing it in float32 was verified) and rejected float16 folds one ulp off (QA)
        return (None, None) if self.per_dtype else (self.tolerance, self.tolerance / 10)


@dataclass
class Candidate:
    """One candidate's fate: ``status`` is chosen, accepted (verified, slower), rejected or failed."""

    name: str
    status: str = "pending"
    reason: str | None = None
    exact: bool = True
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    top1_agreement: float | None = None
    top1_drop: float | None = None  # float's top-1 accuracy minus this candidate's, on labelled --data
    verified_on: str | None = None
    median_ms: float | None = None
    p90_ms: float | None = None
    speedup: float | None = None  # eager's median / this median
    # this median over the fastest's, per round: median and 95% bootstrap interval
    vs_fastest: tuple[float, float, float] | None = None
    gflops: float | None = None
    peak_fraction: float | None = None
    peak_mem_mib: float | None = None
    build_s: float | None = None  # writing the artifact (export, compilation) and loading it back
    artifact: str | None = None  # what was timed: "reloaded from model.aoti.pt2", or "in memory"
    load: str | None = None  # how plain torch loads the artifact
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
    load: str  # how plain torch loads the chosen artifact; fxforge.load_model(output_dir) runs it as timed
    warnings: list[str] = field(default_factory=list)
    bench: BenchReport | None = None
    runner: Any = field(default=None, repr=False)  # the chosen artifact, reloaded and verified
    seconds: dict[str, float] = field(default_factory=dict)  # where --auto's own time went
    load_with_fxforge: str = ""  # the fxforge.load_model line that runs the written artifact as timed

    @property
    def load_anywhere(self) -> str:
        """``load`` as a line that runs pasted anywhere (its imports, absolute paths); "" when nothing was written."""
        return load_line_from_anywhere(self.load, self.output_dir) if self.output_dir else ""

    def __repr__(self) -> str:  # the dataclass's would print every candidate and the bench report
        where = f", written to {self.output_dir}" if self.output_dir else ""
        return f"<AutoResult chose {self.chosen} of {len(self.candidates)} candidates{where}>"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": True,  # a run that cannot choose raises (an error document under --json)
            "chosen": self.chosen,
            "load": self.load,
            "load_with_fxforge": self.load_with_fxforge or None,
            "output_dir": str(self.output_dir) if self.output_dir else None,
            "files": self.files,
            "passes": self.passes,
            "rejected_passes": self.rejected_passes,
            "budget": dataclasses.asdict(self.budget),
            "warnings": self.warnings,
            "seconds": {k: round(v, 2) for k, v in self.seconds.items()},
            "candidates": [c.to_dict() for c in self.candidates],
            "bench": self.bench.to_dict() if self.bench else None,
        }


@keeps_rng_state
def auto_optimize(
    captured: Captured,
    output_dir: str | Path | None = None,
    *,
    budget: Budget | None = None,
    backends: Sequence[str | Backend] | None = None,
    data: Any = None,
    calibration_data: Any = None,
    seeds: Sequence[int] = (0, 1, 2),
    warmup: int = 3,
    repeats: int | None = None,
    threads: int | None = None,
    force: bool = False,
    spec: str | None = None,
    quick: bool = False,
) -> AutoResult:
    """Choose and write the fastest verified way to run ``captured`` (see the module docstring).

    ``backends``: candidate names (``compile+channels_last``) or :class:`~fxforge.bench.Backend` objects
    (default: see the module docstring; ``quick``: fewer). ``data``: the user's inputs for judging reduced
    precision (and calibrating int8), in any form :func:`fxforge.quantize.load_calibration` reads;
    ``calibration_data``: other samples to calibrate int8 on, so that ``data`` judges it on samples it was not fitted
    to (without it, int8 is calibrated on ``data`` and the result warns that its accuracy is in-sample).
    ``repeats``: timed rounds (default 30, ``quick`` 10). Without ``output_dir`` nothing is written.
    """
    started = time.perf_counter()
    seconds: dict[str, float] = {}
    require_captured(captured, "auto_optimize")
    if budget is not None and not isinstance(budget, Budget):  # a bare number raised an AttributeError (QA)
        raise FxforgeError(
            f"budget must be a fxforge.Budget, not a {type(budget).__name__}",
            hint="e.g. fxforge.Budget(max_drop=0.01), Budget(min_agreement=0.99) or Budget(tolerance=0.05)",
        )
    require_real_weights(captured, "optimize --auto")
    budget = budget or Budget()
    if output_dir is not None:
        check_output_directory(output_dir, force=force)  # before minutes of candidates, not after them
    if calibration_data is not None and data is None:
        raise FxforgeError(
            f"{option('--calibration-data', python='calibration_data')} calibrates int8 that "
            f"{option('--data', python='data')} then judges: it needs {option('--data', python='data')} too",
            hint=f"add {option('--data', python='data')} (held-out samples), or pass the samples as "
            f"{option('--data', python='data')} alone",
        )
    if data is not None and not budget.reduced_precision:
        # the data judges reduced-precision candidates, which only a budget lets in: unread, it would be ignored
        raise FxforgeError(
            f"{option('--data')} judges bf16/int8 candidates, which need an accuracy budget",
            hint=f"add {option('--max-drop', 0.01)} or {option('--min-agreement', 0.99)}, or leave "
            f"{option('--data')} out",
        )
    repeats = repeats or (QUICK_REPEATS if quick else 30)
    chosen_backends = candidate_backends(captured, backends, budget, quick, threads)
    if not any(b.base in REDUCED_BACKENDS for b in chosen_backends):
        # a budget of top-1 accuracy and the data it is judged on apply to bf16/int8 only: unused, they were ignored
        given = (("--max-drop", budget.max_drop), ("--min-agreement", budget.min_agreement), ("--data", data))
        unused = [option(flag) for flag, value in given if value is not None]
        if unused:
            raise FxforgeError(
                f"{', '.join(unused)} {'judges' if len(unused) == 1 else 'judge'} bf16/int8 candidates, and none is "
                "tried here",
                hint=f"add bf16 or int8 to {option('--backends')}, or leave {', '.join(unused)} out",
            )
    result_warnings: list[str] = []
    passes, rejected_passes, graph = _apply_exact_passes(captured, budget)
    rewritten = dataclasses.replace(captured, graph_module=graph)
    seconds["passes"] = time.perf_counter() - started
    eval_data = _evaluation_data(captured, data, budget, chosen_backends, result_warnings)
    calibration = _calibration_data(captured, calibration_data, eval_data, chosen_backends, result_warnings)

    candidates = {b.name: Candidate(b.name, exact=b.base not in REDUCED_BACKENDS) for b in chosen_backends}
    with tempfile.TemporaryDirectory(prefix="fxforge-auto-") as workdir:
        mark = time.perf_counter()
        built = _build(rewritten, chosen_backends, candidates, Path(workdir), calibration, threads)
        seconds["build"] = time.perf_counter() - mark
        mark = time.perf_counter()
        for name, (runner, _) in list(built.items()):
            if not _verify_candidate(captured, candidates[name], runner, budget, seeds, eval_data):
                del built[name]
        _say_if_in_sample(calibration, eval_data, candidates, result_warnings)
        seconds["verify"] = time.perf_counter() - mark
        fallback = _int8_fallback(candidates, budget, backends, quick)
        if fallback is not None:
            mark = time.perf_counter()
            candidates[fallback.name] = Candidate(fallback.name, exact=False)
            target = int8_target(budget)
            more = _build(
                rewritten,
                [fallback],
                candidates,
                Path(workdir),
                calibration,
                threads,
                keep_float_until=target,
                fallback_data=eval_data,  # judged where the candidate is verified (--data), not where calibrated
            )
            for name, (runner, artifact) in more.items():
                if _verify_candidate(captured, candidates[name], runner, budget, seeds, eval_data):
                    built[name] = (runner, artifact)
            _say_if_in_sample(calibration, eval_data, candidates, result_warnings)
            seconds["int8 fallback"] = time.perf_counter() - mark
        if not built:
            raise FxforgeError("no candidate passed verification", hint="see the candidates' reasons with --json")
        mark = time.perf_counter()
        report = _time(rewritten, {name: runner for name, (runner, _) in built.items()}, warmup, repeats, threads)
        _record_timings(candidates, report)
        writable = {n for n, (_, a) in built.items() if a is not None}
        chosen = choose(candidates, report, writable)
        chosen = _settle_close_call(rewritten, built, candidates, report, chosen, writable, warmup, repeats, threads)
        seconds["timing"] = time.perf_counter() - mark
        reduced = [c for c in candidates.values() if not c.exact]
        if reduced and all(c.status in ("rejected", "failed") for c in reduced):
            # the user asked for a budget: say that it bought nothing, not only in each candidate's reason
            result_warnings.append(
                f"no reduced-precision candidate ({', '.join(c.name for c in reduced)}) met the budget: the choice "
                "is exact (see their reasons)"
            )
        artifact = built[chosen][1]
        load = (artifact.load if artifact is not None else "") or PLAIN_TORCH_LOAD["eager"]
        result = AutoResult(
            chosen,
            list(candidates.values()),
            passes,
            rejected_passes,
            budget,
            None,
            [],
            load,
            result_warnings,
            report,
            built[chosen][0],
            seconds,
        )
        if output_dir is not None:
            mark = time.perf_counter()
            result.output_dir = Path(output_dir)
            result.files = _write(result, rewritten, artifact, force, spec, (started, mark))
            return result  # its write and total seconds are those report.json holds
    seconds["total"] = time.perf_counter() - started
    return result


# --------------------------------------------------------------------------------------------------
# steps


def mostly_convolutional(model: nn.Module) -> bool:
    """Whether 2-D convolutions hold most of the weights of ``model``'s convolutions and linear layers: a conv net,
    where channels-last layouts can pay. One Conv2d is not enough: a ViT's patch embedding is a conv holding 1.4%
    of those weights, and taking the ViT for a conv net left plain ``compile`` out of ``--quick`` (ViT-small at
    batch 1 then ran at 0.94x the compile peer)."""
    conv = dense = 0
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            conv += module.weight.numel()
        elif isinstance(module, nn.Linear):
            dense += module.weight.numel()
    return conv > 0 and conv >= dense


def candidate_backends(
    captured: Captured,
    backends: Sequence[str | Backend] | None,
    budget: Budget,
    quick: bool = False,
    threads: int | None = None,
) -> list[Backend]:
    """The candidates ``--auto`` tries: the user's, else those this model and machine make worth trying
    (``threads``: the run's thread count, torch's by default)."""
    if backends is None:
        convolutional = mostly_convolutional(captured.original)
        if quick:
            names: list[str | Backend] = ["eager", *(QUICK_CONV if convolutional else QUICK_EXACT)]
        else:
            names = [*EXACT_BACKENDS, *(CONV_VARIANTS if convolutional else ())]
        if budget.reduced_precision:
            # bf16 only where the CPU runs it natively (see below); int8 everywhere (fbgemm/oneDNN on AVX2 too)
            names += ["int8", "ort_int8", "ort_int8+streams"] if quick and not native_bf16() else list(REDUCED_BACKENDS)
        # never offer a path this machine cannot run fast (bf16 without AVX512-BF16/AMX: emulated, slower than fp32)
        names = [name for name in names if _runs_fast(get_backend(str(name)), model_device(captured))]
        if not _has_float32_cpu_linear(captured):  # the candidate would be fx again
            names = [name for name in names if name != "fx+onednn_linear"]
        batch = batch_of(captured.example_inputs)
        if (threads or torch.get_num_threads()) < 2 or batch is None or batch < 2:  # nothing to split
            names = [name for name in names if "streams" not in str(name).split("+")]
    else:
        names = list(backends)
        if "eager" not in [b if isinstance(b, str) else b.name for b in names]:
            names.insert(0, "eager")  # the baseline every speedup is measured against
    chosen = [b if isinstance(b, Backend) else get_backend(b) for b in names]
    if not budget.reduced_precision:
        refused = [b.name for b in chosen if b.base in REDUCED_BACKENDS]
        if refused:
            raise FxforgeError(
                f"{', '.join(refused)} cannot meet fp32 round-off",
                hint=f"grant an accuracy budget: {option('--tolerance')} above 1e-4, {option('--min-agreement')} (e.g. "
                f"0.99) or {option('--max-drop')} (e.g. 0.01)",
            )
    return chosen


def _has_float32_cpu_linear(captured: Captured) -> bool:
    """Whether the onednn_linear pass would rewrite a layer of the graph (QA: a Linear on a 1-D input, or a bf16 one
    beside float32 weights, made a candidate that was fx again)."""
    if model_device(captured).type != "cpu" or not onednn_linear.available():
        return False
    gm = captured.graph_module
    return any(onednn_linear.why_not(gm, node) is None for node in gm.graph.nodes)


def _runs_fast(backend: Backend, device: torch.device) -> bool:
    """Whether ``backend`` runs a model on ``device`` fast: on the CPU, what the CPU runs natively; on a GPU, what
    runs on the GPU (not ONNX Runtime's CPU provider or x86 int8), bf16 where the GPU computes it natively."""
    if device.type == "cpu":
        return backend.unsupported_here() is None
    if backend.cpu_only:
        return False
    return backend.precision != "bf16" or (device.type == "cuda" and torch.cuda.is_bf16_supported())


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


INT8_BACKENDS = ("int8", "ort_int8")


def in_sample_warning() -> str:
    # static int8 fits its value ranges to the data it is calibrated on: judged on that same data, its accuracy is
    # in-sample (as quantize says where it has no --eval data)
    return (
        f"int8 candidates were calibrated on the data that judged them ({option('--data', python='data')}): their "
        "accuracy is in-sample and can be lower on new samples; pass other samples as "
        f"{option('--calibration-data', python='calibration_data')} to judge int8 on data it was not fitted to"
    )


def _calibration_data(
    captured: Captured, calibration_data: Any, eval_data: Any, backends: Sequence[Backend], notes: list[str]
) -> Any:
    """What int8 candidates are calibrated on: ``calibration_data`` where given, else the judging data (with a
    warning that int8's accuracy is then in-sample), else None (random batches)."""
    if not any(b.base in INT8_BACKENDS for b in backends):
        if calibration_data is not None:  # unread, it would be ignored
            raise FxforgeError(
                f"{option('--calibration-data', python='calibration_data')} calibrates int8, and no int8 candidate "
                "is tried here",
                hint=f"add int8 or ort_int8 to {option('--backends', python='backends')}, or leave "
                f"{option('--calibration-data', python='calibration_data')} out",
            )
        return None
    if calibration_data is not None:
        return load_calibration(calibration_data, captured.example_inputs, kind="calibration (--calibration-data)")
    if eval_data is None or eval_data.random:
        return None
    return eval_data  # in-sample: said once an int8 candidate was judged on it (:func:`_say_if_in_sample`)


def _say_if_in_sample(calibration: Any, eval_data: Any, candidates: Mapping[str, Candidate], notes: list[str]) -> None:
    """Warn that int8's accuracy is in-sample where an int8 candidate was calibrated on the judging data and judged
    (built: QA got the warning when the only int8 candidate had failed to build)."""
    if calibration is None or calibration is not eval_data:
        return
    judged = [c for c in candidates.values() if c.name.split("+")[0] in INT8_BACKENDS and c.status != "failed"]
    if judged and in_sample_warning() not in notes:
        warnings.warn(in_sample_warning(), AutoWarning, stacklevel=outside_stacklevel())
        notes.append(in_sample_warning())


def _evaluation_data(
    captured: Captured, data: Any, budget: Budget, backends: Sequence[Backend], notes: list[str]
) -> Any:
    if not any(b.base in REDUCED_BACKENDS for b in backends):
        return None
    loaded = load_calibration(data, captured.example_inputs, kind="evaluation (--data)")
    if not loaded.random and loaded.batches:
        # data the model itself cannot run is the user's input error, not a candidate's failure (int8 was reported
        # "build failed" and eager written, exit 0)
        try:
            with quiet_torch_logs():
                run_batches(captured.original, loaded.batches[:1])
        except Exception as exc:
            raise InputSpecError(
                f"the model cannot run on batch 0 of {loaded.source} (inputs {describe_inputs(loaded.batches[0])}; "
                f"the example inputs are {describe_inputs(captured.example_inputs)}): {one_line_reason(exc)}",
                hint=said("give --data shaped like the model's inputs", "give data shaped like the model's inputs")
                + ", with samples along dim 0",
            ) from None
    if loaded.random:
        warnings.warn(random_data_warning(), AutoWarning, stacklevel=outside_stacklevel())
        notes.append(random_data_warning())
    return loaded


def _build(
    rewritten: Captured,
    backends: Sequence[Backend],
    candidates: dict[str, Candidate],
    workdir: Path,
    calibration: Any,
    threads: int | None,
    keep_float_until: Any = None,
    fallback_data: Any = None,
) -> dict[str, tuple[Runner, Artifact | None]]:
    """Each candidate's runner: its artifact written and reloaded (eager: the model itself; a backend fxforge
    cannot write, such as a plug-in's: built in memory, timed, but never chosen). ``calibration``: the batches int8
    is calibrated on (None: random ones); ``fallback_data``: the batches the int8 fallback's target is judged on."""
    expected = run_reference(rewritten.original, rewritten.example_inputs, {})
    built: dict[str, tuple[Runner, Artifact | None]] = {}
    for backend in backends:
        candidate = candidates[backend.name]
        settings = BuildSettings(threads or torch.get_num_threads(), workdir / backend.name, expected)
        settings.calibration = calibration
        settings.variants = backend.selected
        settings.keep_float_until = keep_float_until
        settings.fallback_data = fallback_data
        if backend.base == "eager":
            built[backend.name] = (rewritten.original, None)
            candidate.artifact = "the model itself"
            continue
        if not deployable(backend):
            runner, error, candidate.build_s = build_backend(backend, rewritten, settings)
            candidate.notes = settings.notes
            if runner is None:
                candidate.status, candidate.reason = "failed", error
            else:
                built[backend.name] = (runner, None)
                candidate.artifact = "in memory (fxforge cannot write this backend's artifact)"
            continue
        try:
            artifact = write_artifact(backend, rewritten, settings.workdir, settings)
        except FxforgeError as exc:
            candidate.status, candidate.reason = "failed", f"build failed: {build_failure(exc)}"
            continue
        candidate.build_s = artifact.write_s + artifact.load_s
        candidate.notes, candidate.load = artifact.notes, artifact.load
        candidate.artifact = f"reloaded from {', '.join(artifact.files)}"
        built[backend.name] = (artifact.runner, artifact)
    return built


def int8_target(budget: Budget) -> Target:
    """The accuracy target int8's sensitivity fallback searches toward: the budget's top-1 agreement, else its
    top-1 drop, else its tolerance as a mean relative error (a proxy: the candidate is then verified against the
    budget itself)."""
    if budget.min_agreement is not None:
        return Target("agreement", budget.min_agreement)
    if budget.max_drop is not None:
        return Target("drop", budget.max_drop)
    return Target("rel_err", budget.tolerance)


def _int8_fallback(
    candidates: dict[str, Candidate], budget: Budget, asked: Sequence[str | Backend] | None, quick: bool = False
) -> Backend | None:
    """``int8+fallback`` when int8 ran but missed the budget: the same int8 with the units that cost most
    accuracy kept in float, one more at a time, until the budget's target holds (the fewest, so the fastest
    such configuration). Not when the user named the candidates without it, nor with ``quick`` when another
    int8 candidate (``ort_int8``) met the budget: the search quantizes the model once per unit and took 12 of
    --auto's 13 minutes on mobilenet_v2 with 450 calibration images."""
    int8 = candidates.get("int8")
    if not budget.reduced_precision or int8 is None or int8.status != "rejected" or "int8+fallback" in candidates:
        return None
    if quick and any(c.status == "accepted" and _precision(c.name) == "int8" for c in candidates.values()):
        return None
    if int8.reason is None or int8.reason.startswith("failed to run"):
        return None  # a candidate that crashes is not made accurate by keeping some of it in float
    if asked is not None and not any(getattr(b, "name", b) == "int8" for b in asked):
        return None
    return get_backend("int8+fallback")


class _AsModule(nn.Module):
    """A candidate behind nn.Module's interface, for :func:`fxforge.verify.verify`, which calls it as it calls the
    model: with the ``constants`` fixed by --concrete among the keywords. An exported or compiled artifact has them
    built in (a file takes tensors only): those it does not name as parameters are dropped here, not passed ("the
    ONNX model has no input named 'double'"); the model itself (eager) takes them."""

    def __init__(self, function: Runner, constants: Mapping[str, Any]) -> None:
        super().__init__()
        self.function = function
        try:
            named = set(inspect.signature(getattr(function, "forward", function)).parameters)
        except (TypeError, ValueError):
            named = set()
        self.constants = set(constants) - named

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **{k: v for k, v in kwargs.items() if k not in self.constants})


def _verify_candidate(
    captured: Captured,
    candidate: Candidate,
    runner: Runner,
    budget: Budget,
    seeds: Sequence[int],
    eval_data: Any,
) -> bool:
    module = _AsModule(runner, captured.example_kwargs)
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
    # a case judged against float64 (sensitive to rounding) is said, as verify says it (QA: --auto dropped them)
    candidate.notes += [w for w in check.warnings if w not in candidate.notes]
    reason = "verification failed: " + "; ".join(check.problems[:2]) if not check.ok else None
    return check.ok, reason


def _verify_reduced(captured: Captured, candidate: Candidate, module: nn.Module, budget: Budget, eval_data: Any):
    reference, actual = run_batches(captured.original, eval_data.batches), run_batches(module, eval_data.batches)
    accuracy = compare_batches(reference, actual, eval_data.source, eval_data.labels)
    candidate.max_abs_err, candidate.top1_agreement = accuracy.max_abs_err, accuracy.top1_agreement
    candidate.max_rel_err, candidate.top1_drop = accuracy.rel_err, accuracy.top1_drop
    candidate.verified_on = eval_data.source
    if (budget.min_agreement is not None or budget.max_drop is not None) and accuracy.top1_agreement is None:
        return False, "top-1 agreement and drop need a classifier (2-D logits as the first output)"
    if budget.min_agreement is not None and accuracy.top1_agreement < budget.min_agreement:
        return False, f"top-1 agreement {accuracy.top1_agreement:.4f} < {budget.min_agreement}"
    if budget.max_drop is not None and not Target("drop", budget.max_drop).met(accuracy):
        if accuracy.top1_drop is not None:
            return False, f"top-1 accuracy dropped by {accuracy.top1_drop:.4f} > {budget.max_drop} on the labels"
        return False, (
            f"top-1 agreement {accuracy.top1_agreement:.4f} < {1 - budget.max_drop:g}: without labels in --data the "
            "drop is bounded by 1 - agreement"
        )
    if budget.tolerance > FP32_TOLERANCE:
        rtol, atol = budget.rtol_atol
        for index, (ref_batch, cand_batch) in enumerate(zip(reference, actual)):
            comparison = compare_outputs(ref_batch, cand_batch, rtol, atol)
            if not comparison.ok:
                # which batch: the candidate's max_abs_err is over all of them, and read as another number (QA)
                where = f" on batch {index + 1} of {len(reference)}" if len(reference) > 1 else ""
                return False, f"beyond {option('--tolerance')} {budget.tolerance:g}{where}: {comparison.problems[0]}"
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
        candidate.gflops = row.gflops
        if row.gflops and report.peak is not None:
            precision = "fp32" if candidate.exact else _precision(candidate.name)
            peak = report.peak.gflops.get(precision) or report.peak.gflops.get("fp32")
            candidate.peak_fraction = row.gflops / peak if peak else None


def _precision(name: str) -> str:
    base = name.split("+")[0]
    return "int8" if "int8" in base else "bf16" if base in ("bf16", "autocast") else "fp32"


# --------------------------------------------------------------------------------------------------
# the choice


def choose(
    candidates: dict[str, Candidate], report: BenchReport, writable: set[str] | None = None, settled: bool = False
) -> str:
    """The fastest candidate, unless a simpler one ties with it within noise (see the module docstring).

    ``writable``: the candidates whose artifact can be written (the others are timed but cannot be chosen;
    None: all). ``settled``: the close call was timed again (:func:`_settle_close_call`), and only a candidate
    within :data:`PRACTICALLY_EQUAL` of the fastest ties. Fills each timed candidate's ``vs_fastest`` and the
    reasons of those not chosen.
    """
    rounds = {row.backend: row.round_ms for row in report.rows if row.round_ms}
    timed = [c for c in candidates.values() if c.status == "accepted" and c.median_ms is not None]
    eligible = _eligible(timed, writable)
    if not eligible:
        raise FxforgeError("no verified candidate could be timed", hint="see the candidates' reasons with --json")
    fastest = min(eligible, key=lambda c: c.median_ms or 0.0)
    # By medians one candidate is the fastest; paired round by round, another can be faster in most rounds (a
    # table said "eager 1.00x, compile 0.95x (0.71-1.18)"). The paired comparison is the sound one: follow it,
    # at most once per candidate, so that the fastest is the one every other is measured at or above.
    for _ in range(len(eligible)):
        paired = {c.name: _paired_median(rounds.get(c.name, []), rounds.get(fastest.name, [])) for c in eligible}
        below = [c for c in eligible if paired[c.name] < 1.0]
        if not below:
            break
        fastest = min(below, key=lambda c: paired[c.name])
    for candidate in timed:
        candidate.vs_fastest = ratio_interval(rounds.get(candidate.name, []), rounds.get(fastest.name, []))
    ties = [c for c in eligible if _ties(c, settled)]
    chosen = min(ties, key=lambda c: (_simplicity(c), c.median_ms))
    chosen.status = "chosen"
    # a choice made again (after the extra rounds of a close call) must not keep what the first one said of it
    chosen.reason = None
    for candidate in timed:
        if candidate is chosen:
            continue
        # the median of the per-round ratios, as the table's "vs fastest": a ratio of the two medians could say
        # another number (29.5x in the table, 53.3x in the reason) and even order two candidates the other way
        against_chosen = candidate.vs_fastest if chosen is fastest else None  # the same rounds: not bootstrapped again
        paired = against_chosen or ratio_interval(rounds.get(candidate.name, []), rounds.get(chosen.name, []))
        ratio = paired[0] if paired else candidate.median_ms / chosen.median_ms
        # "verified" is the exact check's word; a bf16/int8 candidate passed the budget's accuracy test instead
        judged = "verified" if candidate.exact else "within the budget"
        if candidate not in eligible:
            candidate.reason = (
                f"{judged}; {ratio:.2f}x the time of {chosen.name}, but fxforge cannot write its artifact"
            )
        elif candidate is fastest:
            low, high = chosen.vs_fastest[1:] if chosen.vs_fastest else (ratio, ratio)
            candidate.reason = (
                f"{judged}; the fastest, but {chosen.name} ties with it within noise ({1 / ratio:.2f}x "
                f"its time, interval {low:.2f}-{high:.2f}x), and {chosen.name} is the simpler artifact"
            )
        elif candidate in ties:
            low, high = candidate.vs_fastest[1:] if candidate.vs_fastest else (ratio, ratio)
            candidate.reason = (
                f"{judged}; ties with {fastest.name} within noise ({low:.2f}-{high:.2f}x), and {chosen.name} is "
                "the simpler artifact"
            )
        else:
            candidate.reason = f"{judged}; {ratio:.2f}x slower than {chosen.name}"
    return chosen.name


def _paired_median(times: list[float], reference: list[float]) -> float:
    """The median per-round ratio (the point estimate of :func:`ratio_interval`, without its bootstrap); 1 when
    there are no paired rounds."""
    ratios = paired_ratios(times, reference)
    return statistics.median(ratios) if ratios else 1.0


def _eligible(timed: list[Candidate], writable: set[str] | None) -> list[Candidate]:
    """The timed candidates that can be chosen: those whose artifact can be written (None: all), and eager."""
    return [c for c in timed if writable is None or c.name in writable or c.name == "eager"]


def _settle_close_call(
    rewritten: Captured,
    built: dict[str, tuple[Runner, Artifact | None]],
    candidates: dict[str, Candidate],
    report: BenchReport,
    chosen: str,
    writable: set[str],
    warmup: int,
    repeats: int,
    threads: int | None,
) -> str:
    """Time the choice against its nearest rival again when the first rounds could not settle it.

    Two cases. A simpler choice that tied with the fastest only because the interval was wide: 10 rounds at
    vit_small batch 8 could not tell an AOTInductor package 5% slower than ``torch.compile`` from a tie, and the
    simpler package was written. And a choice that the medians put clearly behind another candidate although the
    per-round ratios put it ahead (a busy machine: int8 chosen at 10.3 ms beside ort_int8 at 5.7 ms). The two are
    timed for :data:`RUNOFF_FACTOR` times the rounds more, in the same interleaved way, and the choice is made
    again on all the rounds (paired, so the earlier rounds still count), this time keeping the simpler one only if
    it is within :data:`PRACTICALLY_EQUAL` of the fastest by median: the extra rounds were its chance to show a tie.
    Where the medians and the rounds still disagree after that, the chosen candidate's reason says so.
    """
    picked = candidates[chosen]
    timed = [c for c in candidates.values() if c.status in ("accepted", "chosen") and c.median_ms is not None]
    by_median = min(_eligible(timed, writable), key=lambda c: c.median_ms or 0.0)
    close_call = picked.vs_fastest is not None and picked.vs_fastest[0] > 1.0 + PRACTICALLY_EQUAL
    if not close_call and not _disputed(picked, by_median):
        return chosen
    rival = by_median if by_median is not picked else _fastest_by_rounds(candidates, writable)
    if rival is None or rival is picked:
        return chosen
    more = _time(
        rewritten, {name: built[name][0] for name in (chosen, rival.name)}, warmup, RUNOFF_FACTOR * repeats, threads
    )
    if any(row.error or not row.round_ms for row in more.rows):
        return chosen  # the first timing stands; a runner that failed now would have failed the first time too
    rows = {row.backend: row for row in report.rows}
    for row in more.rows:
        rows[row.backend].set_rounds(rows[row.backend].round_ms + row.round_ms)
    set_speedups(report.rows)
    picked.status = "accepted"
    _record_timings(candidates, report)
    rechosen = choose(candidates, report, writable, settled=True)
    note = (
        f"{chosen} and {rival.name} were timed {len(more.rows[0].round_ms)} more rounds: the first "
        f"{repeats} could not tell them apart; after them, only a candidate within {PRACTICALLY_EQUAL:.0%} of "
        "the fastest by median ties with it"
    )
    for name in (chosen, rival.name):
        candidates[name].notes.append(note)
    final = candidates[rechosen]
    timed = [c for c in candidates.values() if c.status in ("accepted", "chosen") and c.median_ms is not None]
    by_median = min(_eligible(timed, writable), key=lambda c: c.median_ms or 0.0)
    if _disputed(final, by_median):
        wins = sum(t < r for t, r in zip(rows[final.name].round_ms, rows[by_median.name].round_ms))
        rounds = min(len(rows[final.name].round_ms), len(rows[by_median.name].round_ms))
        disagreement = (
            f"the medians and the rounds disagree: {by_median.name}'s median is lower ({by_median.median_ms:.2f} "
            f"against {final.median_ms:.2f} ms), but {final.name} was faster in {wins} of {rounds} rounds, and "
            "the choice follows the rounds; the machine was too busy to time these two reliably: rerun with "
            "nothing else running"
        )
        final.reason = f"chosen, but {disagreement}"  # printed under the table, where a chosen one has no reason
    return rechosen


def _disputed(picked: Candidate, by_median: Candidate) -> bool:
    """The medians put another candidate clearly (beyond :data:`WITHIN_NOISE`) ahead of the one chosen by the
    rounds."""
    if by_median is picked or not picked.median_ms or not by_median.median_ms:
        return False
    return by_median.median_ms * (1.0 + WITHIN_NOISE) < picked.median_ms


def _fastest_by_rounds(candidates: dict[str, Candidate], writable: set[str] | None) -> Candidate | None:
    """The candidate :func:`choose` measured every other against (``vs_fastest`` 1.00): the rival of a simpler
    choice that tied with it."""
    timed = [c for c in candidates.values() if c.status in ("accepted", "chosen") and c.vs_fastest is not None]
    eligible = _eligible(timed, writable)
    return min(eligible, key=lambda c: c.vs_fastest[0]) if eligible else None


def _ties(candidate: Candidate, settled: bool = False) -> bool:
    if candidate.vs_fastest is None:
        return False
    median, low, _ = candidate.vs_fastest
    if median <= 1.0 + PRACTICALLY_EQUAL:
        return True
    # Once timed again, an interval that still reaches 1 is no longer the benefit of the doubt: three runs of
    # vit_small and BERT-base at batch 8 kept an AOTInductor package 4% slower than torch.compile that way.
    return not settled and low <= 1.0 and median <= 1.0 + WITHIN_NOISE


def _simplicity(candidate: Candidate) -> float:
    base, *variants = candidate.name.split("+")
    rank = SIMPLICITY.index(base) if base in SIMPLICITY else len(SIMPLICITY)
    return rank + 0.1 * len(variants)  # a variant is one more thing that could differ on the user's machine


# --------------------------------------------------------------------------------------------------
# the artifact


def _write(
    result: AutoResult,
    rewritten: Captured,
    artifact: Artifact | None,
    force: bool,
    spec: str | None,
    clocks: tuple[float, float],
) -> list[str]:
    """Write the output directory atomically. ``clocks``: when ``--auto`` and the writing started, so that
    report.json's ``seconds`` has ``write`` and ``total`` as the result has them (QA: the file lacked both)."""
    assert result.output_dir is not None
    with atomic_directory(result.output_dir, force=force) as staging:
        if artifact is not None:
            for path in artifact.directory.iterdir():
                copy = shutil.copytree if path.is_dir() else shutil.copy
                copy(path, staging / path.name)
        else:  # eager: the model itself (torch.save aborts the process on a full disk: check first)
            check_free_space(staging, rewritten.original)
            result.load = write_model_itself(rewritten, staging)
            _check_reloads(staging, rewritten)
        if not (staging / INPUTS_FILE).exists():
            write_inputs(staging, rewritten.example_inputs)
        # a directory whose only model is a pickle loads only with the opt-in (eager, pickled int8), and so does
        # an AOTInductor package (native code, run when loaded)
        forms = (AOTI_FILE, PROGRAM_FILE, TORCHSCRIPT_FILE, ONNX_FILE)
        pickled = (staging / MODEL_FILE).exists() and not any((staging / form).exists() for form in forms)
        opt_in = ", trust_pickle=True" if pickled or (staging / AOTI_FILE).exists() else ""
        # pasted anywhere, it runs: its import, and the directory's absolute path (the command's relative one holds
        # only where the command ran)
        where = str(Path(result.output_dir).resolve())
        result.load_with_fxforge = f"import fxforge; fxforge.load_model({where!r}{opt_in}).module  # runs as timed"
        now = time.perf_counter()
        result.seconds["write"], result.seconds["total"] = now - clocks[1], now - clocks[0]
        report = {"model": spec, "capture": rewritten.record.to_dict(), **result.to_dict()}
        # the file lives in the directory: its line runs there, as `load` does, and output_dir says where it was
        # written whatever the working directory was (QA: a path relative to where the command ran)
        report["load_with_fxforge"] = f"fxforge.load_model('.'{opt_in}).module  # in this directory; runs as timed"
        report["output_dir"] = str(Path(result.output_dir).resolve())
        report["files"] = [*sorted(p.name for p in staging.iterdir()), REPORT_FILE]
        write_report(staging, report)
        return sorted(p.name for p in staging.iterdir())


def _check_reloads(directory: Path, rewritten: Captured) -> None:
    """Check that the model written into ``directory`` (:func:`~fxforge.deploy.write_model_itself`) computes, loaded
    back, what the model computes."""
    with quiet_torch_logs():
        loaded = reload_artifact(directory)
    model = with_constant_kwargs(rewritten.original, rewritten.example_kwargs)
    inputs = rewritten.example_inputs
    comparison = compare_outputs(run_reference(model, inputs, {}), run_reference(loaded, inputs, {}))
    if not comparison.ok:
        raise FxforgeError(f"the saved model does not reload to the same outputs: {comparison.problems[0]}")
