"""Display: small HTML tables for notebooks, shared by every result object's ``_repr_html_``.

Jupyter shows the last value of a cell through its ``_repr_html_``; fxforge's results (``Captured``,
``InspectReport``, lint reports, verification, export, bench and quantize results) build theirs from
:func:`table` and :func:`card` so that they look alike. Standard library only (bottom layer): the
interactive graph pictures live in :mod:`fxforge.visual`, which sits higher up.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any

# One inline style block per card, scoped by class: notebooks render many outputs on one page, and a
# card must neither depend on nor change the notebook's own styles.
_STYLE = """<style>
.fxf-card{font:13px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;color:#1f2933;max-width:100%;overflow-x:auto}
.fxf-card h4{margin:4px 0 6px;font-size:14px}
.fxf-card .fxf-sub{color:#52606d;margin:0 0 6px}
.fxf-card table{border-collapse:collapse;margin:4px 0 8px}
.fxf-card th,.fxf-card td{border-bottom:1px solid #e4e7eb;padding:3px 10px;text-align:left;vertical-align:top}
.fxf-card th{background:#f5f7fa;font-weight:600}
.fxf-card td.num{text-align:right;font-variant-numeric:tabular-nums}
.fxf-ok{color:#1b7f3b;font-weight:600}.fxf-bad{color:#b42318;font-weight:600}.fxf-warn{color:#b54708}
</style>"""


def escape(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def number(value: float | int | None) -> str:
    """``11689512`` -> ``11.69M``; ``None`` -> ``-``."""
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.4g}"
    magnitude = abs(value)
    for factor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if magnitude >= factor:
            return f"{value / factor:.2f}{suffix}"
    return str(int(value))


def byte_size(value: int | None) -> str:
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    return f"{size:.1f} GiB"


def status(ok: bool | None, good: str = "ok", bad: str = "FAILED") -> str:
    """A coloured word: ``ok``/``FAILED`` (``-`` when unknown)."""
    if ok is None:
        return "-"
    return f'<span class="{"fxf-ok" if ok else "fxf-bad"}">{escape(good if ok else bad)}</span>'


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    numeric: Iterable[int] = (),
    raw: Iterable[int] = (),
    limit: int | None = None,
) -> str:
    """An HTML table. Cells are escaped except in the ``raw`` columns (already HTML); ``numeric`` columns
    align right. With ``limit``, rows past it are replaced by one line saying how many were left out."""
    numeric, raw = set(numeric), set(raw)
    body = []
    rows = list(rows)
    shown = rows if limit is None else rows[:limit]
    for row in shown:
        cells = []
        for index, cell in enumerate(row):
            text = str(cell) if index in raw else escape(cell)
            cells.append(f'<td class="num">{text}</td>' if index in numeric else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    if limit is not None and len(rows) > limit:
        body.append(f'<tr><td colspan="{len(headers)}">... {len(rows) - limit} more rows</td></tr>')
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def card(title: str, *parts: str, subtitle: str = "") -> str:
    """A titled block of HTML parts (tables, paragraphs), with the shared style."""
    sub = f'<p class="fxf-sub">{escape(subtitle)}</p>' if subtitle else ""
    return f'{_STYLE}<div class="fxf-card"><h4>{escape(title)}</h4>{sub}{"".join(parts)}</div>'


def paragraph(text: str) -> str:
    return f"<p>{escape(text)}</p>"


def key_values(pairs: Iterable[tuple[str, Any]]) -> str:
    """A two-column table of names and (escaped) values; pairs whose value is None are left out."""
    return table(["", ""], [(k, v) for k, v in pairs if v is not None]).replace(
        "<thead><tr><th></th><th></th></tr></thead>", ""
    )


# --------------------------------------------------------------------------------------------------
# the objects of the lower layers (read by attribute: this module imports none of them)


def captured_repr(captured: Any) -> str:
    nodes = len(captured.graph_module.graph.nodes)
    name = type(captured.original).__name__
    return f"<Captured {name}: {nodes} nodes, {captured.record.method} ({captured.dialect} dialect)>"


def captured_html(captured: Any) -> str:
    record = captured.record
    ops: dict[str, int] = {}
    for node in captured.graph_module.graph.nodes:
        ops[node.op] = ops.get(node.op, 0) + 1
    checks = "; ".join(
        f"{'example' if c.batch is None else f'batch {c.batch}'}: {'match' if c.ok else 'DIFFER'} "
        f"(max abs err {c.max_abs_err:.3g})"
        for c in record.checks
    )
    pairs = [
        ("captured by", f"{record.method} ({record.dialect} dialect)"),
        ("nodes", ", ".join(f"{count} {op}" for op, count in ops.items())),
        ("leaves", ", ".join(record.leaves) or None),
        ("wrapped", ", ".join(record.wrapped) or None),
        ("check", checks or None),
    ]
    hint = paragraph("fxforge.show(captured) draws the graph; fxforge.inspect_graph(captured) tabulates it.")
    return card(f"Captured {type(captured.original).__name__}", key_values(pairs), hint)


def inspect_repr(report: Any) -> str:
    totals = report.totals
    return (
        f"<InspectReport {report.dialect}: {totals.get('nodes')} nodes, {totals.get('params', 0):,} params, "
        f"{number(totals.get('flops'))} FLOPs>"
    )


def inspect_html(report: Any, depth: int = 2) -> str:
    totals = report.totals
    rows = [
        (m.path, m.type, m.nodes, number(m.params), number(m.flops), byte_size(m.activation_bytes))
        for m in report.modules
        if m.depth <= depth
    ]
    subtitle = (
        f"{totals.get('nodes')} nodes, {totals.get('params', 0):,} parameters, {number(totals.get('flops'))} "
        f"FLOPs ({number(totals.get('macs'))} MACs), activations {byte_size(totals.get('activation_bytes'))}"
    )
    body = table(["module", "type", "nodes", "params", "FLOPs", "activations"], rows, numeric=[2, 3, 4, 5], limit=80)
    return card(f"Inspect ({report.dialect} dialect)", body, subtitle=subtitle)


def lint_repr(report: Any) -> str:
    counts = report.to_dict()["counts"]
    return f"<LintReport: {len(report.findings)} findings ({', '.join(f'{v} {k}' for k, v in counts.items() if v)})>"


def lint_html(report: Any) -> str:
    rows = [(f"{f.code} {f.name}", f.severity, f.node or "", f.message, f.fix or "") for f in report.findings]
    if not rows:
        return card("Lint", paragraph(f"No findings ({len(report.rules_run)} rules run)."))
    return card(
        "Lint",
        table(["rule", "severity", "node", "message", "fix"], rows, limit=100),
        subtitle=lint_repr(report).strip("<>"),
    )


def verify_repr(result: Any) -> str:
    where = f", first divergence at {result.divergence.node}" if result.divergence is not None else ""
    verdict = "ok" if result.ok else "FAILED"
    return f"<VerifyResult {verdict}: {result.describe_inputs()}, max abs err {result.max_abs_err:.3g}{where}>"


def verify_html(result: Any) -> str:
    pairs = [
        ("result", status(result.ok, "verified", "FAILED")),
        ("tried", result.describe_inputs()),
        ("max abs / rel error", f"{result.max_abs_err:.3g} / {result.max_rel_err:.3g}"),
        ("first divergence", result.divergence.describe() if result.divergence is not None else None),
        ("no diverging node named", getattr(result, "divergence_unknown", None)),
        ("problems", "; ".join(result.problems[:4]) or None),
        ("skipped", "; ".join(result.skipped[:4]) or None),
        ("warnings", "; ".join(result.warnings[:4]) or None),
    ]
    rows = [(name, value if name == "result" else escape(value)) for name, value in pairs if value is not None]
    return card(
        "Verification", table(["", ""], rows, raw=[1]).replace("<thead><tr><th></th><th></th></tr></thead>", "")
    )


def export_repr(result: Any) -> str:
    return f"<ExportResult {result.format} ({result.exporter}): {'ok' if result.ok else 'FAILED'}, {result.path}>"


def export_html(result: Any) -> str:
    check = result.verification
    pairs = [
        ("format", f"{result.format} ({result.exporter} exporter{f', opset {result.opset}' if result.opset else ''})"),
        ("file", f"{result.path} ({byte_size(result.size_bytes)})" if result.path else "not written"),
        ("verified", f"{'ok' if check.ok else 'FAILED'}: {check.describe_inputs()}" if check is not None else None),
        ("batches", ", ".join(str(b) for b in result.verified_batches) or None),
        ("dynamic batch", "yes" if result.dynamic_batch else "no"),
        ("notes", "; ".join(result.notes) or None),
    ]
    return card(f"Export: {result.format}", key_values(pairs))
