"""Notebook views of the results above this layer (optimize, bench, quantize): their ``_repr_html_`` and
short ``__repr__``. Results of the layers below build theirs with :mod:`fxforge.display` alone."""

from __future__ import annotations

from typing import Any

from fxforge.display import card, counted, paragraph
from fxforge.visual.render import diff_html
from fxforge.visual.sections import bench_section, changelog_section, pipeline_verify_section, quantize_section


def optimize_repr(result: Any) -> str:
    steps = result.pipeline.steps
    # a rolled-back pass changed nothing that is kept (QA: "changed by replace_modules" after its rollback)
    changed = [s.result.name for s in steps if s.result.changed and not s.rolled_back]
    rolled_back = [s.result.name for s in steps if s.rolled_back]
    verdict = "ok" if result.pipeline.ok else f"FAILED ({result.pipeline.failed_pass or 'verification'})"
    undone = f", rolled back {', '.join(rolled_back)}" if rolled_back else ""
    checked = "" if result.pipeline.verification is not None else ", not verified"
    where = f", wrote {result.output_dir}" if result.output_dir else ""
    return (
        f"<OptimizeResult {verdict}: {counted(len(steps), 'pass', 'passes')}, changed by {', '.join(changed) or 'none'}"
        f"{undone}{checked}{where}>"
    )


def optimize_html(result: Any) -> str:
    """The change log, the verification and -- when the result knows its captured model -- the diff graph."""
    data = result.pipeline.to_dict()
    parts = [
        pipeline_verify_section(data),
        changelog_section(data),
    ]
    captured = getattr(result, "captured", None)
    changed = any(s.result.changed and not s.rolled_back for s in result.pipeline.steps)
    if captured is not None and changed:
        parts.append(diff_html(captured, result, title="diff")._repr_html_())
    elif captured is not None:  # a diff page of no change weighed as much as any other (QA)
        parts.append(paragraph("No pass changed the graph: no diff to draw."))
    return card("Optimize", *parts)


def fix_repr(result: Any) -> str:
    before, after = result.before.to_dict()["counts"], result.after.to_dict()["counts"]
    verdict = "ok" if result.optimized.pipeline.ok else "FAILED"
    return (
        f"<FixResult {verdict}: passes {', '.join(result.passes) or 'none'}; findings {sum(before.values())} -> "
        f"{sum(after.values())}>"
    )


def fix_html(result: Any) -> str:
    """``lint --fix``: the findings before and after, then the optimize result of the fix passes."""
    return card(
        "Lint --fix",
        result.after._repr_html_(),
        optimize_html(result.optimized),
        subtitle=f"fix passes: {', '.join(result.passes) or 'none'}; findings left after them below",
    )


def bench_repr(report: Any) -> str:
    several = len({r.batch for r in report.rows}) > 1  # "eager 18.77 ms, ..., eager 20.45 ms" named no batch (QA)

    def name(row: Any) -> str:
        return f"{row.backend} (batch {row.batch})" if several else row.backend

    def timing(row: Any) -> str:
        if not row.median_ms:
            return f"{name(row)} failed"
        # a wrong answer, fast, must not read as a plain timing (QA: a NaN backend as "qa_nan 0.24 ms")
        verdict = {False: " beyond tol", None: " not compared"}.get(row.within_tolerance, "")
        return f"{name(row)} {row.median_ms:.2f} ms{verdict}"

    head = f"<BenchReport {counted(report.threads, 'thread')}, {counted(report.repeats, 'round')}"
    if len(report.rows) <= _REPR_ROWS:
        return f"{head}: {', '.join(timing(r) for r in report.rows)}>"
    # many backends at many batches made a repr of 600+ characters (QA): per batch, the fastest row that
    # matches, and how many were timed; the table (the HTML view, to_dict) has them all
    parts = []
    for batch in dict.fromkeys(r.batch for r in report.rows):
        rows = [r for r in report.rows if r.batch == batch]
        good = [r for r in rows if r.median_ms and r.within_tolerance is not False]
        fastest = f"fastest {min(good, key=lambda r: r.median_ms).backend} " if good else ""
        best = f"{min(r.median_ms for r in good):.2f} ms, " if good else "none ran, "
        failed = sum(1 for r in rows if not r.median_ms or r.within_tolerance is False)
        parts.append(
            f"batch {batch}: {fastest}{best}{counted(len(rows), 'backend')}"
            + (f" ({failed} failed or beyond tol)" if failed else "")
        )
    return f"{head}: {'; '.join(parts)}>"


_REPR_ROWS = 6  # a repr names every row up to this many, and summarises per batch above it


def bench_html(report: Any) -> str:
    return card("", bench_section(report.to_dict()))


def quantize_repr(result: Any) -> str:
    accuracy = result.accuracy
    agreement = (
        f", top-1 agreement {100 * accuracy.top1_agreement:.1f}%"
        if accuracy is not None and accuracy.top1_agreement is not None
        else ""
    )
    layers = counted(len(result.quantized_layers), "layer")
    # QAT's prepared model is float with fake-quant nodes: nothing is int8 until it is converted (QA)
    what = "with fake-quant, still float" if result.mode == "qat-prepare" else "int8"
    return f"<QuantizeResult {result.mode} ({result.backend}): {layers} {what}{agreement}>"


def quantize_html(result: Any) -> str:
    return card("", quantize_section(result.to_dict()))
