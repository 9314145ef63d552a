"""The HTML report (``fxforge report``): one self-contained page a user can attach to a pull request.

It runs what is asked and puts the results on one page: the environment (versions, CPU), the capture
record, the inspect table, lint findings (a click selects the node in the graph), the optimize change log
and its verification with the diff graph (when passes are given), bench latencies as a chart (``bench``)
and the int8 model's accuracy (``quantize``; a sensitivity chart is in the page ``fxforge quantize --sensitivity
-o DIR`` writes: ranking here would quantize once per unit, on random data). A profile (``fxforge profile``'s dict, or
its result object) colours the graph's nodes by time share. Sits at the top of the library: it may call
everything below it; the page itself is assembled by :mod:`fxforge.visual`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fxforge.api import prepare
from fxforge.bench import bench as run_bench
from fxforge.capture import Captured, require_captured
from fxforge.errors import FxforgeError, first_line, option, said
from fxforge.inspect import inspect_graph
from fxforge.lint import lint
from fxforge.optimize import optimize
from fxforge.passes import PassError, get_pass, parse_options
from fxforge.pipeline import PipelineResult
from fxforge.profile import profile_model
from fxforge.quantize import RandomCalibrationWarning
from fxforge.quantize import quantize as run_quantize
from fxforge.visual.graph import diff_model, graph_model
from fxforge.visual.page import HTML_SUFFIXES, GraphView, check_page_path, describe
from fxforge.visual.render import rewritten_graph
from fxforge.visual.report_page import report_document
from fxforge.visual.sections import (
    bench_section,
    capture_section,
    changelog_section,
    environment,
    environment_section,
    inspect_section,
    lint_section,
    pipeline_verify_section,
    quantize_section,
)

# Backends a report times unless told otherwise: quick to build (torch.compile's minute of compiling is left out).
REPORT_BACKENDS = ("eager", "fx", "torchscript", "onnxruntime")


def check_report_path(path: str | Path, *, force: bool = False) -> Path:
    """``path`` as a report may be written there, checked before the work: an HTML page's name (a report is no
    picture: ``report.svg`` would have held HTML), not a directory, an existing file only with ``force``."""
    if Path(path).suffix.lower() not in HTML_SUFFIXES:
        raise FxforgeError(f"a report is an HTML page, not {str(path)!r}", hint="e.g. report.html")
    return check_page_path(path, force=force)


def verification_failure(pipeline: PipelineResult) -> str:
    """One line for a failed pipeline, as its page's Verification section puts it: why nothing could be verified, or
    the pass that failed and where the outputs first diverged."""
    check = pipeline.verification
    if pipeline.problem:  # a random model, which nothing can be checked against
        reason = pipeline.problem
    else:
        culprit = f" after pass {pipeline.failed_pass}" if pipeline.failed_pass else ""
        detail = ""
        if check is not None and check.divergence is not None:
            detail = f": {check.divergence.describe()}"
        elif check is not None and check.problems:
            detail = f": {check.problems[0]}"
        reason = f"outputs differ{culprit}{detail}"
    return f"verification FAILED: {first_line(reason)}"


def check_report_passes(names: Sequence[str]) -> None:
    """Refuse a pass that cannot run with its default options (replace_pattern, insert_after), before any work: a
    report runs each pass with its defaults, and the pass's own hint offered ``--option``, which report has not
    (QA): the way to such a pass's diff is optimize, then graph --diff."""
    for name in names:
        spec = get_pass(name)
        try:
            parse_options(spec, {})
        except PassError as exc:
            raise FxforgeError(
                f"{exc.message}: a report runs each pass with its default options",
                hint=said(
                    f"run fxforge optimize MODEL -p {name} --option {name}.NAME=VALUE ... -o OUT, then fxforge graph "
                    "MODEL --diff OUT for its diff",
                    f"run fxforge.optimize(captured, fxforge.Pipeline([({name!r}, {{...its options}})])), then "
                    "fxforge.diff_html(captured, result)",
                ),
            ) from None


def report(
    model: Captured | str,
    path: str | Path | None = None,
    *,
    passes: Sequence[str] = (),
    bench: bool | Sequence[str] = False,
    bench_repeats: int | None = None,
    quantize: str | None = None,
    calibration: Any = None,
    profile: Any = None,
    inputs: Sequence[str] | None = None,
    spec: str | None = None,
    depth: int | None = None,
    force: bool = False,
) -> GraphView:
    """Build the report of ``model`` (a Captured, or a spec :func:`fxforge.prepare` loads) and write it to ``path``.

    ``passes``: run them (verified) and show the change log, verification and diff. ``bench``: True for
    :data:`REPORT_BACKENDS`, or the backend names, timed ``bench_repeats`` rounds (default 20; refused without
    ``bench``). ``quantize``: a mode (``static``, ``dynamic``) to run and report. ``profile``:
    ``fxforge.profile_model``'s result, its dict or that JSON file's path, or True to profile the model now, to
    colour nodes by time. The view's ``failures`` has one line per check that failed (the passes' verification),
    which the page shows too.
    """
    if bench_repeats is not None and bench is False:
        # the page would have no bench section, and the rounds asked for would be ignored, as --repeats without --bench
        raise FxforgeError(
            f"{option('--repeats', python='bench_repeats')} applies to {option('--bench', True)}",
            hint=f"add {option('--bench', True)}",
        )
    if path is not None:
        check_report_path(path, force=force)  # before the work: a refusal after it would waste it
    check_report_passes(passes)
    if isinstance(model, str):
        spec = spec or model
        captured = prepare(model, list(inputs) if inputs else None)
    else:
        require_captured(model, "report")
        captured = model
    spec = spec or type(captured.original).__name__
    if profile is True:  # report --profile: time every node now
        profile = profile_model(captured)
    inspected = inspect_graph(captured, depth=3, include_code=False)
    findings = lint(captured)
    quantized = None
    if quantize:  # first: a model quantize refuses (float16, say) was refused after the passes and the timings (QA)
        with warnings.catch_warnings():  # the quantize section shows the result's warnings
            warnings.simplefilter("ignore", RandomCalibrationWarning)
            quantized = run_quantize(captured, quantize, calibration=calibration)
    sections: list[str] = []  # above the graph: what changed and whether it was proven
    after = [  # below it: the model, its findings, timings and where the numbers come from
        lint_section([f.to_dict() for f in findings.findings]),
        inspect_section(inspected.to_dict()),
    ]
    graph_title = "Graph"
    findings_data: dict[str, Any] = {"lint": [f.to_dict() for f in findings.findings]}
    failures: list[str] = []
    if passes:
        result = optimize(captured, list(passes), verify=True, spec=spec)
        if not result.pipeline.ok:
            failures.append(verification_failure(result.pipeline))
        data = result.pipeline.to_dict()
        # the change log is "passes" in a pipeline's dict; the report calls it "steps" (docs/commands/report.md)
        findings_data["optimize"] = {key: data.get(key) for key in ("verify", "failed_pass", "problem")}
        findings_data["optimize"]["steps"] = data["passes"]
        graph, steps, divergence = rewritten_graph(result)
        model_data = diff_model(
            captured,
            graph,
            steps=steps,
            passes=list(passes),
            divergence=divergence,
            lint_report=findings,
            profile=profile,
            title=spec,
        )
        sections += [
            pipeline_verify_section(data),
            changelog_section(data),
        ]
        graph_title = "Diff: the rewritten graph over the captured one"
    else:
        model_data = graph_model(captured, report=inspected, lint_report=findings, profile=profile, title=spec)
    if depth is not None:
        model_data["depth"] = depth
    if bench:
        backends = list(REPORT_BACKENDS) if bench is True else list(bench)
        timings = run_bench(captured, backends, repeats=bench_repeats or 20).to_dict()
        findings_data["bench"] = timings
        after.append(bench_section(timings))
    if quantized is not None:
        findings_data["quantize"] = quantized.to_dict()
        after.append(quantize_section(findings_data["quantize"]))
    after += [capture_section(spec, captured.record.to_dict()), environment_section(environment())]
    title = f"fxforge report: {spec}"
    html = report_document(title, describe(model_data), sections, model_data, graph_title, after)
    view = GraphView(html, model_data, title=title, findings=findings_data, failures=failures)
    if path is not None:
        view.save(path, force=force)
    return view
