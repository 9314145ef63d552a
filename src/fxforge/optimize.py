"""Optimize: run a pass pipeline on a captured model, verify it, and write the result atomically.

The output directory holds everything needed to use the result with torch alone:

* ``model.pt2`` -- a ``torch.export`` program of the rewritten graph (both dialects, when it exports); reload
  with ``torch.export.load("model.pt2").module()``: no pickled code, safe to share;
* ``model.pt`` -- the rewritten GraphModule, ``torch.save``d (torch dialect); reload with
  ``torch.load("model.pt", weights_only=False)`` -- a pickle: load only files you trust;
* ``optimized_model/`` -- ``GraphModule.to_folder`` source plus weights (torch dialect, when every submodule is
  serialisable that way), importable as a plain Python package;
* ``report.json`` -- capture record, change log per pass and the verification result;
* ``inputs.txt`` -- the example input specs, so ``fxforge verify`` and ``bench`` can reuse them;
* ``provenance.json`` -- node origins and producing passes, so ``verify`` can bisect after reloading.

The directory is built under a temporary name beside the target and renamed into place at the end:
a failed run leaves nothing behind, and an existing directory is replaced only with ``force``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fxforge.artifacts import atomic_directory, check_output_directory, save_graph_module, write_report
from fxforge.capture import Captured, require_captured, require_real_weights
from fxforge.errors import FxforgeError, InputSpecError
from fxforge.lint import LintReport, lint
from fxforge.passes import FIX_ORDER, registered_passes
from fxforge.pipeline import Pipeline, PipelineResult
from fxforge.references import as_names
from fxforge.runtime import keeps_rng_state
from fxforge.visual import notebook
from fxforge.visual.report_page import REPORT_HTML, optimize_report_html, page_or_note


@dataclass
class OptimizeResult:
    pipeline: PipelineResult
    output_dir: Path | None
    files: list[str]
    notes: list[str] = field(default_factory=list)  # forms that could not be written, and why
    write_s: float = 0.0  # seconds spent writing the output directory
    captured: Captured | None = field(default=None, repr=False)  # the model rewritten: notebooks draw the diff

    def __repr__(self) -> str:
        return notebook.optimize_repr(self)

    def _repr_html_(self) -> str:  # Jupyter shows this for the last value of a cell
        return notebook.optimize_html(self)

    @property
    def ok(self) -> bool:
        """Whether every step passed (what ``--json``'s ``ok`` says): ``pipeline.ok``."""
        return self.pipeline.ok

    def to_dict(self) -> dict[str, Any]:
        data = self.pipeline.to_dict()
        data["ok"] = self.ok
        data["output_dir"] = str(self.output_dir) if self.output_dir else None
        data["files"] = self.files
        data["notes"] = self.notes
        data["write_s"] = round(self.write_s, 3)
        return data


@keeps_rng_state
def optimize(
    captured: Captured,
    passes: Sequence[Any] | Pipeline,
    *,
    output_dir: str | Path | None = None,
    verify: bool | None = None,
    keep_going: bool | None = None,
    force: bool = False,
    spec: str | None = None,
) -> OptimizeResult:
    """Run ``passes`` on a copy of ``captured`` and, if ``output_dir`` is given, write the result.

    With ``verify`` each pass that changes the graph is checked against the original model; when one fails,
    nothing is written and the result names the pass and the first diverging node -- unless ``keep_going``,
    which rolls the failing pass back, reports it and runs the rest. ``None`` keeps a :class:`Pipeline`'s
    own settings (a pipeline file's ``verify: true``), and means False for a list of names.
    """
    require_captured(captured, "optimize")
    require_real_weights(captured, "optimize")
    wants_verify = verify if verify is not None else isinstance(passes, Pipeline) and passes.verify_each
    if wants_verify and not (captured.example_inputs or captured.example_kwargs):
        # verification runs the model on the example's shapes: without any it checked nothing and said ok (QA)
        raise InputSpecError(
            "verifying the passes needs example inputs, and the graph was captured without any",
            hint="capture with inputs: fxforge.capture(model, (x,)) or fxforge.prepare(spec, ['1x3x224x224'])",
        )
    if output_dir is not None:  # before the work: refusing afterwards would waste it
        check_output_directory(output_dir, force=force)
    if isinstance(passes, Pipeline):
        pipeline = passes
        if verify is not None:
            pipeline.verify_each = verify
        if keep_going is not None:
            pipeline.keep_going = keep_going
    else:
        if passes is None or isinstance(passes, (bytes, int, float)):  # list(None) raised a bare TypeError
            raise FxforgeError(f"passes must be pass names or a Pipeline, got {passes!r}", hint="e.g. passes=['exact']")
        pipeline = Pipeline(list(as_names(passes)), verify_each=bool(verify), keep_going=bool(keep_going))
    result = pipeline.run(captured)
    if output_dir is None or not result.ok:
        return OptimizeResult(result, None, [], captured=captured)
    output_dir = Path(output_dir)
    notes: list[str] = []
    started = time.perf_counter()
    with atomic_directory(output_dir, force=force) as staging:
        files = save_graph_module(
            result.graph_module,
            staging,
            captured.example_inputs,
            captured.dialect,
            captured.example_kwargs,
            notes,
        )
        page = page_or_note(optimize_report_html, notes, captured, result, spec)  # report.html: the diff, for people
        report = {"model": spec, "capture": captured.record.to_dict(), **result.to_dict(), "notes": notes}
        files.append(write_report(staging, report))
        if page is not None:
            (staging / REPORT_HTML).write_text(page, encoding="utf-8")
            files.append(REPORT_HTML)
    return OptimizeResult(result, output_dir, files, notes, time.perf_counter() - started, captured)


@dataclass
class FixResult:
    """``lint --fix``: the findings before and after, the fix passes run, and their optimize result."""

    before: LintReport
    after: LintReport
    passes: list[str]
    optimized: OptimizeResult

    def __repr__(self) -> str:
        return notebook.fix_repr(self)

    def _repr_html_(self) -> str:  # Jupyter shows this for the last value of a cell
        return notebook.fix_html(self)

    @property
    def landed(self) -> list[str]:
        """The fix passes whose change is in the result (not rolled back), in the order they ran."""
        return [s.result.name for s in self.optimized.pipeline.steps if s.result.changed and not s.rolled_back]

    def to_dict(self) -> dict[str, Any]:
        return {
            "passes": self.passes,
            "landed": self.landed,
            "before": self.before.to_dict()["counts"],
            "after": self.after.to_dict()["counts"],
            "optimize": self.optimized.to_dict(),
        }


def fix(
    captured: Captured,
    output_dir: str | Path | None,
    *,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
    force: bool = False,
    spec: str | None = None,
) -> FixResult:
    """Lint, run (verified) the passes named by the findings' ``fix`` fields (only those, in ``FIX_ORDER``), write
    the result to ``output_dir`` when given (the model unchanged when no finding names a pass), and lint it."""
    before = lint(captured, select=select, ignore=ignore)
    wanted = {f.fix for f in before.findings if f.fix and f.fix in registered_passes()}
    names = [name for name in FIX_ORDER if name in wanted] + sorted(wanted - set(FIX_ORDER))
    # keep_going: a fix pass that fails verification is rolled back and reported; the other fixes still land.
    # The output directory is written even when no finding names a pass: the caller asked for the model there,
    # and a script that loads it next must find it (unchanged, with its report), not a missing directory.
    optimized = optimize(captured, names, output_dir=output_dir, verify=True, keep_going=True, force=force, spec=spec)
    # The rewritten graph is the model now. FX006 compares the graph with its model: against the rewritten graph
    # it finds nothing, against the original it would count the BatchNorms fold_bn consumed as unused. No fix pass
    # makes a weight of the model used or unused, so FX006's findings after the fix are those before it.
    rewritten = optimized.pipeline.graph_module
    fixed = dataclasses.replace(captured, graph_module=rewritten, original=rewritten)
    after = lint(fixed, select=select, ignore=ignore)
    after.findings = [f for f in after.findings if f.code != UNUSED_PARAMETER]
    after.findings += [f for f in before.findings if f.code == UNUSED_PARAMETER]
    return FixResult(before, after, names, optimized)


UNUSED_PARAMETER = "FX006"
