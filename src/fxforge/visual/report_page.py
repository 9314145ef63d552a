"""Report pages: one self-contained HTML page of sections and a graph, and the two that output directories
get -- ``optimize -o DIR`` and ``quantize -o DIR`` write ``report.html`` beside ``report.json``.

:func:`report_document` assembles any list of sections (:mod:`fxforge.visual.sections`) with a graph
model; :mod:`fxforge.report` (``fxforge report``) runs everything and calls it. The optimize and quantize
pages take their results as they are (read by attribute: this module sits below both).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from fxforge.capture import Captured
from fxforge.visual.graph import diff_model, graph_model
from fxforge.visual.page import describe, document
from fxforge.visual.render import rewritten_graph
from fxforge.visual.sections import (
    REPORT_SCRIPT,
    capture_section,
    changelog_section,
    environment,
    environment_section,
    graph_section,
    join,
    pipeline_verify_section,
    quantize_section,
)

REPORT_HTML = "report.html"


def report_document(
    title: str,
    subtitle: str,
    sections: Sequence[str],
    model: dict[str, Any] | None,
    graph_title: str = "Graph",
    after: Sequence[str] = (),
) -> str:
    """``sections``, the graph, then ``after`` (the lint findings and the divergence row select nodes in it)."""
    body = join(sections)
    if model is not None:
        body += graph_section(graph_title, describe(model))
    body += join(after)
    return document(title, subtitle, body, model, REPORT_SCRIPT if model is not None else "")


def optimize_report_html(captured: Captured, pipeline: Any, spec: str | None = None) -> str:
    """The page ``optimize -o DIR`` writes: environment, capture, change log, verification and the diff."""
    data = pipeline.to_dict()
    names = [step["name"] for step in data["passes"]]
    graph, steps, divergence = rewritten_graph(pipeline)
    model = diff_model(
        captured,
        graph,
        steps=steps,
        passes=names,
        divergence=divergence,
        title=f"{spec or 'model'}: {', '.join(names)}",
    )
    sections = [
        pipeline_verify_section(data),
        changelog_section(data),
    ]
    after = [capture_section(spec, captured.record.to_dict()), environment_section(environment())]
    title = f"fxforge optimize: {spec or 'model'}"
    subtitle = f"passes {', '.join(names) or 'none'}; " + describe(model)
    return report_document(title, subtitle, sections, model, "Diff: the rewritten graph over the captured one", after)


def quantize_report_html(captured: Captured, result: Any, spec: str | None = None) -> str:
    """The page ``quantize -o DIR`` writes: accuracy, sensitivity chart, capture, environment and -- when the
    quantized model is a graph -- the diff of the captured graph and the quantized one."""
    data = result.to_dict()
    model = None
    if captured.dialect == "torch" and hasattr(result.model, "graph"):
        quantized = dataclasses.replace(captured, graph_module=result.model)
        try:
            model = diff_model(
                captured, result.model, passes=[f"quantize ({result.mode})"], title=f"{spec or 'model'}: int8"
            )
        except Exception:  # a graph inspect cannot run (a QAT-prepared model in training mode): draw it alone
            model = graph_model(quantized, run_lint=False, title=f"{spec or 'model'}: int8")
    sections = [quantize_section(data)]
    after = [capture_section(spec, captured.record.to_dict()), environment_section(environment())]
    title = f"fxforge quantize: {spec or 'model'}"
    subtitle = f"{result.mode} int8, {len(result.quantized_layers)} layers quantized"
    return report_document(title, subtitle, sections, model, "Diff: the quantized graph over the captured one", after)


def page_or_note(build: Any, notes: list[str], *args: Any) -> str | None:
    """``build(*args)``, or None with a note saying why: a picture that cannot be drawn never costs the user
    the model an output directory holds."""
    try:
        return build(*args)
    except Exception as exc:
        notes.append(
            f"not written: {REPORT_HTML}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        )
        return None
