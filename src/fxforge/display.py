"""Display: small HTML tables for notebooks, shared by every result object's ``_repr_html_``.

Jupyter shows the last value of a cell through its ``_repr_html_``; fxforge's results (``Captured``,
``InspectReport``, lint reports, verification, export, profile, debug and doctor reports, split plans and
results, pipeline runs; bench and quantize results through :mod:`fxforge.visual.notebook`) build theirs from
:func:`table` and :func:`card` so that they look alike, and keep their ``__repr__`` to one short line. Standard
library only (bottom layer): results are read by attribute, and the interactive graph pictures live in
:mod:`fxforge.visual`, which sits higher up.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# One inline style block per card, scoped by class: notebooks render many outputs on one page, and a
# card must neither depend on nor change the notebook's own styles. Its own background: a dark notebook theme
# left dark text on a near-black page (QA).
_STYLE = """<style>
.fxf-card{font:13px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;color:#1f2933;max-width:100%;overflow-x:auto;
  background:#fff;padding:4px 8px;border-radius:6px;box-sizing:border-box}
.fxf-card h4{margin:4px 0 6px;font-size:14px}
/* a report section inside a card: its heading no larger than the card's (the notebook's h2 is) */
.fxf-card section.fxr h2{margin:6px 0 4px;font-size:14px}
.fxf-card .fxf-sub{color:#52606d;margin:0 0 6px}
.fxf-card table{border-collapse:collapse;margin:4px 0 8px}
.fxf-card th,.fxf-card td{border-bottom:1px solid #e4e7eb;padding:3px 10px;text-align:left;vertical-align:top}
.fxf-card th{background:#f5f7fa;font-weight:600}
.fxf-card td.num{text-align:right;font-variant-numeric:tabular-nums}
.fxf-ok{color:#1b7f3b;font-weight:600}.fxf-bad{color:#b42318;font-weight:600}.fxf-warn{color:#b54708}
</style>"""


def json_text(data: Any, **dumps: Any) -> str:
    """``json.dumps(data)`` as strict JSON: a non-finite float (an infinite error, a NaN) is written as the string
    ``"inf"``, ``"-inf"`` or ``"nan"``, since Python's ``Infinity``/``NaN`` is no JSON (``jq``, ``JSON.parse`` and
    strict parsers refuse the whole document); values JSON cannot hold otherwise as their ``str``."""
    return json.dumps(_finite_json(data), allow_nan=False, default=str, **dumps)


def _finite_json(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {key: _finite_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_json(item) for item in value]
    return value


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


def of_peak(fraction: float | None, precision: str = "fp32") -> str:
    """A share of the machine's measured peak, ``87%``; the precision it is of when not fp32 (``41% bf16``). Above
    100% it is marked ``!``: faster than the measured peak cannot be (a peak measured on a busy machine), which
    the bench table and page explain under it."""
    if fraction is None:
        return "-"
    return f"{fraction:.0%}" + ("!" if fraction > 1 else "") + ("" if precision == "fp32" else f" {precision}")


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
    """A titled block of HTML parts (tables, paragraphs), with the shared style; no title line for ``""`` (a part
    that brings its own heading, as a report section does: "Bench" over "Bench" read twice, QA)."""
    sub = f'<p class="fxf-sub">{escape(subtitle)}</p>' if subtitle else ""
    heading = f"<h4>{escape(title)}</h4>" if title else ""
    return f'{_STYLE}<div class="fxf-card">{heading}{sub}{"".join(parts)}</div>'


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


def inspect_html(report: Any) -> str:
    totals = report.totals
    # the report holds the modules down to the depth it was asked for (a fixed depth 2 here hid BERT's layers, QA)
    rows = [
        (m.path, m.type, m.nodes, number(m.params), number(m.flops), byte_size(m.activation_bytes))
        for m in report.modules
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


def tolerances_text(tolerances: Mapping[str, Sequence[float]]) -> str:
    """``float32 within rtol 1e-04, atol 1e-05; int64 exactly``: what "equal" meant, per output dtype."""
    return "; ".join(
        f"{name} exactly" if rtol == atol == 0 else f"{name} within rtol {rtol:.0e}, atol {atol:.0e}"
        for name, (rtol, atol) in tolerances.items()
    )


def verify_repr(result: Any) -> str:
    where = f", first divergence at {result.divergence.node}" if result.divergence is not None else ""
    verdict = "ok" if result.ok else "CANNOT VERIFY" if result.unverifiable else "FAILED"
    # why, where no node says it: "FAILED ..., max abs err 0" of a random model said nothing (QA)
    problem = result.problems[0] if not result.ok and not where and result.problems else ""
    why = f"; {problem if len(problem) <= 100 else problem[:97] + '...'}" if problem else ""
    return f"<VerifyResult {verdict}: {result.describe_inputs()}, max abs err {result.max_abs_err:.3g}{where}{why}>"


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
        ("hint", getattr(result, "hint", None)),
    ]
    rows = [(name, value if name == "result" else escape(value)) for name, value in pairs if value is not None]
    return card(
        "Verification", table(["", ""], rows, raw=[1]).replace("<thead><tr><th></th><th></th></tr></thead>", "")
    )


def export_repr(result: Any) -> str:
    verdict = "FAILED" if not result.ok else "ok" if result.verification is not None else "written, not verified"
    return f"<ExportResult {result.format} ({result.exporter}): {verdict}, {result.path}>"


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


def counted(count: int, word: str, many: str = "") -> str:
    """``1 stage``, ``4 stages``, ``1 process`` / ``4 processes`` (``many``): counts in results are often 1."""
    return f"{count} {word if count == 1 else many or word + 's'}"


def _heading(text: str) -> str:
    return f"<p><b>{escape(text)}</b></p>"


def profile_repr(report: Any) -> str:
    parts = "nodes" if report.backend == "fx" else "leaf modules"
    hottest = report.top(1)
    hot = f", hottest {hottest[0].name} ({hottest[0].share:.0%})" if hottest else ""
    return (
        f"<ProfileReport {report.backend} backend, inputs {', '.join(report.inputs) or 'none'}: "
        f"{report.total_ms:.2f} ms summed over {len(report.nodes)} {parts}, whole model {report.whole_ms:.2f} ms{hot}>"
    )


def _bound(node: Any) -> str:
    return node.verdict


def profile_html(report: Any, top: int = 15, depth: int = 1) -> str:
    """The ``top`` slowest nodes, the modules down to ``depth`` levels by time, and the notes."""
    parts = "nodes" if report.backend == "fx" else "leaf modules"
    hottest = report.top(top)
    node_rows = [
        (
            n.name,
            n.target,
            f"{n.time_ms:.3f}",
            f"{n.share:.1%}",
            f"{n.gflops:.1f}" if n.flops else "-",
            byte_size(n.bytes) if n.bytes else "",
            _bound(n),
        )
        for n in hottest
    ]
    body = [
        _heading(f"The {len(hottest)} slowest of {len(report.nodes)} {parts}"),
        table(
            ["node" if report.backend == "fx" else "module", "target", "ms", "share", "GFLOP/s", "alloc", "bound"],
            node_rows,
            numeric=[2, 3, 4, 5],
        ),
    ]
    modules = sorted((m for m in report.modules if m.path.count(".") < depth), key=lambda m: m.time_ms, reverse=True)
    if modules:
        module_rows = [(m.path, m.nodes, f"{m.time_ms:.3f}", f"{m.share:.1%}", number(m.flops)) for m in modules]
        body += [
            _heading("Modules"),
            table(["module", "nodes", "ms", "share", "FLOPs"], module_rows, numeric=[1, 2, 3, 4]),
        ]
    body += [paragraph(f"note: {note}") for note in report.notes]
    if report.trace:
        body.append(paragraph(f"trace written to {report.trace} (chrome://tracing, https://ui.perfetto.dev)"))
    subtitle = (
        f"inputs {', '.join(report.inputs) or 'none'}, median of {report.repeats} runs: {report.total_ms:.2f} ms "
        f"summed over {len(report.nodes)} {parts}; the whole model unprofiled {report.whole_ms:.2f} ms"
    )
    return card(f"Profile ({report.backend} backend)", *body, subtitle=subtitle)


def _non_finite_verdict(report: Any) -> str:
    if report.nan is not None:
        return f"NaN/Inf first in {report.nan.module or 'the model itself'} ({report.nan.type})"
    # with statistics alone the run was not checked for a first NaN, but every module's counts were kept
    seen = sum(1 for s in report.stats.values() if s.nan_count or s.inf_count)
    return f"NaN/Inf in the output of {counted(seen, 'module')}" if seen else "no NaN or Inf in any module's output"


def debug_repr(report: Any) -> str:
    stats = f", statistics of {counted(sum(1 for s in report.stats.values() if s.calls), 'module')}"
    raised = f", the model raised on {counted(len(report.errors), 'case')}" if report.errors else ""
    return (
        f"<DebugReport {_non_finite_verdict(report)}: {report.modules} modules watched, "
        f"{counted(len(report.cases), 'case')}{stats if report.stats else ''}{raised}>"
    )


def _tensor_summary(summary: Any) -> str:
    span = "" if summary.min is None else f", finite values in [{summary.min:.4g}, {summary.max:.4g}]"
    shape = "x".join(map(str, summary.shape)) or "scalar"
    return f"{shape} {summary.dtype}: {summary.nan} NaN, {summary.inf} Inf{span}"


def _value(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def debug_html(report: Any) -> str:
    """The first module to produce NaN/Inf (with what it got and gave), the activation statistics, the errors."""
    body = []
    found = report.nan
    if found is not None:
        pairs = [("first NaN/Inf", found.describe()), ("output", _tensor_summary(found.output))]
        pairs += [(f"input {index}", _tensor_summary(value)) for index, value in enumerate(found.inputs)]
        body.append(key_values(pairs))
    else:
        verdict = _non_finite_verdict(report)
        body.append(paragraph(f"{verdict[0].upper()}{verdict[1:]}."))
    rows = [
        (
            name or "<root>",
            s.calls,
            _value(s.min),
            _value(s.max),
            _value(s.mean),
            _value(s.std),
            "-" if s.zero_fraction is None else f"{s.zero_fraction:.1%}",
            s.nan_count,
            s.inf_count,
        )
        for name, s in report.stats.items()
        if s.calls
    ]
    if rows:
        headers = ["module", "calls", "min", "max", "mean", "std", "zeros", "NaN", "Inf"]
        body += [_heading("Activation statistics"), table(headers, rows, numeric=range(1, 9), limit=100)]
    body += [paragraph(f"the model raised on {error}") for error in report.errors]
    subtitle = f"{report.modules} modules watched; inputs run: {'; '.join(report.cases) or 'none'}"
    return card("Debug", *body, subtitle=subtitle)


_FEATURE_CLASS = {"available": "fxf-ok", "missing-extra": "fxf-warn", "unsupported-hardware": "fxf-bad"}


def doctor_repr(report: Any) -> str:
    available = sum(1 for state in report.features.values() if state == "available")
    cpu = report.cpu
    return (
        f"<DoctorReport torch {report.versions.get('torch')}, {counted(cpu.cores, 'CPU')} "
        f"({cpu.torch_capability or 'ISA unknown'}), {counted(len(report.gpus), 'GPU')}: {available} of "
        f"{len(report.features)} features available>"
    )


def doctor_html(report: Any) -> str:
    """The machine in a few lines, then every feature with its status and, when it is not available, why."""
    cpu, backends, peak = report.cpu, report.backends, report.peak
    versions = ", ".join(f"{name} {version}" for name, version in report.versions.items() if version)
    missing = ", ".join(name for name, version in report.versions.items() if version is None)
    gpus = "; ".join(f"{g['name']} ({g['memory_gib']} GiB, sm {g['capability']})" for g in report.gpus)
    pairs = [
        ("versions", versions),
        ("not installed", missing or None),
        ("cpu", f"{cpu.model}; {counted(cpu.cores, 'CPU')}; torch ISA {cpu.torch_capability or 'unknown'}"),
        ("cpu features", " ".join(cpu.features) or "none of the ones that matter"),
        ("torch threads", f"{backends.get('threads')} ({backends.get('interop_threads')} inter-op)"),
        ("gpus", gpus or "none"),
        (
            "peak",
            None
            if peak is None
            else f"matmul GFLOP/s {', '.join(f'{k} {v:,.0f}' for k, v in peak.gflops.items())}; "
            f"memory copy {peak.bandwidth_gbs:.1f} GB/s ({counted(peak.threads, 'thread')})",
        ),
        ("warning", report.noise_warning),
        ("torch too old", report.version_warning),
    ]
    rows = [
        (
            feature,
            f'<span class="{_FEATURE_CLASS.get(state, "")}">{escape(state)}</span>',
            report.reasons.get(feature, ""),
        )
        for feature, state in report.features.items()
    ]
    capabilities = table(["feature", "status", "why not"], rows, raw=[1])
    return card("Doctor", key_values(pairs), _heading("Features"), capabilities)


# --------------------------------------------------------------------------------------------------
# split plans and pipeline runs (split and distributed sit above this module: read by attribute)


def split_plan_repr(plan: Any) -> str:
    name = f" {plan.model}" if plan.model else ""
    return (
        f"<SplitPlan{name}: {counted(len(plan.stages), 'stage')} balanced by {plan.balance}, imbalance "
        f"{plan.imbalance:.3f}, {byte_size(plan.crossing_bytes)} cross the cuts>"
    )


def _cost(value: float, balance: str) -> str:
    if balance == "time":
        return f"{value:.2f} ms"
    # a mean cost is a float: rounded first, or number() would print it to 4 digits rather than with a suffix
    return number(round(value)) if balance == "flops" else byte_size(round(value))


def _split_plan_parts(plan: Any) -> list[str]:
    """The stage table, the cut table and the notes of a split plan."""
    timed = plan.balance == "time"
    stage_rows = []
    for stage in plan.stages:
        row = [
            stage.index,
            stage.nodes,
            f"{stage.first_module or stage.first_node} .. {stage.last_module or stage.last_node}",
            number(stage.params),
            byte_size(stage.param_bytes),
            number(stage.flops),
            byte_size(stage.activation_bytes),
            byte_size(stage.input_bytes),
            byte_size(stage.memory_bytes),
            f"{stage.cost / plan.total_cost:.1%}" if plan.total_cost else "-",
        ]
        if timed:
            row.append("-" if stage.time_ms is None else f"{stage.time_ms:.2f} ms")
        stage_rows.append(row)
    headers = ["stage", "nodes", "modules (first .. last)", "params", "weights", "FLOPs", "activations", "receives"]
    headers += ["memory", "cost"] + (["time"] if timed else [])
    parts = [table(headers, stage_rows, numeric=[0, 1, *range(3, len(headers))])]
    if plan.cuts:
        cut_rows = [
            (
                f"{cut.after_stage}|{cut.after_stage + 1}",
                f"{cut.after_node} .. {cut.before_node}",
                ", ".join(f"{t.name} {'x'.join(map(str, t.shape)) or 'scalar'} {t.dtype}" for t in cut.tensors),
                byte_size(cut.bytes),
                ", ".join(f"{k}: {v}" for k, v in cut.split_spec.items()) if cut.split_spec else "inside a call",
            )
            for cut in plan.cuts
        ]
        parts += [
            _heading("Cuts: tensors sent from one stage to the next (per microbatch)"),
            table(["cut", "after .. before", "tensors", "bytes", "torch split_spec"], cut_rows, numeric=[3]),
        ]
    parts += [paragraph(f"note: {note}") for note in plan.notes]
    return parts


def _split_subtitle(plan: Any) -> str:
    mean = plan.total_cost / len(plan.stages) if plan.stages else 0.0
    return (
        f"{plan.model or 'model'} ({plan.dialect} dialect), inputs {', '.join(plan.inputs) or 'none'}: imbalance "
        f"{plan.imbalance:.3f} (largest stage {_cost(plan.bottleneck, plan.balance)} / mean "
        f"{_cost(mean, plan.balance)}), {byte_size(plan.crossing_bytes)} cross the cuts"
    )


def split_plan_html(plan: Any) -> str:
    title = f"Split plan: {counted(len(plan.stages), 'stage')} balanced by {plan.balance}"
    return card(title, *_split_plan_parts(plan), subtitle=_split_subtitle(plan))


def split_result_html(result: Any) -> str:
    """The plan, how the chained stages were verified, and the files written."""
    plan = result.plan
    parts = _split_plan_parts(plan)
    if result.verification is not None:
        parts.append(verify_html(result.verification))
    if result.directory:
        parts.append(paragraph(f"wrote {result.directory}/: {', '.join(result.files)}"))
    title = f"Split: {counted(len(plan.stages), 'stage')} balanced by {plan.balance}"
    return card(title, *parts, subtitle=_split_subtitle(plan))


def _ratio(value: float) -> str:
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.2g}x"


def pipeline_run_repr(run: Any) -> str:
    fastest = max(run.schedules, key=lambda t: t.samples_per_s, default=None)
    speed = ""
    if fastest is not None:
        versus = f" ({_ratio(fastest.speedup)} the best one-process run)" if fastest.speedup is not None else ""
        speed = f": {fastest.schedule} {fastest.samples_per_s:.1f} samples/s{versus}"
    check = "" if run.check is None else (", verified" if run.check.ok else ", output MISMATCH")
    return (
        f"<PipelineRun {counted(run.stages, 'stage')} on {run.device} ({run.backend}), batch {run.batch} in "
        f"{run.microbatches} microbatches{speed}{check}>"
    )


def pipeline_run_html(run: Any) -> str:
    """Throughput per schedule next to the unsplit model in one process, and the output check."""
    rows = [
        (
            f"pipeline, {t.schedule}",
            f"{t.median_s * 1000:.1f}",
            f"{t.samples_per_s:.1f}",
            "-" if t.speedup is None else _ratio(t.speedup),
        )
        for t in run.schedules
    ]
    best = min((b.median_s for b in run.baselines), default=None)
    for base in run.baselines:
        how = ", once per microbatch" if base.per_microbatch else ""
        rows.append(
            (
                f"one process, unsplit ({counted(base.threads, 'thread')}{how})",
                f"{base.median_s * 1000:.1f}",
                f"{base.samples_per_s:.1f}",
                _ratio(best / base.median_s) if best else "-",
            )
        )
    parts = [table(["run", "ms per batch", "samples/s", "vs best one-process"], rows, numeric=[1, 2, 3])]
    check = run.check
    if check is not None:
        verdict = status(check.ok, "verified", "MISMATCH")
        detail = escape(
            f"against {check.reference}: max abs err {check.max_abs_err:.3g}, max rel err {check.max_rel_err:.3g}"
            + (f"; {'; '.join(check.problems[:3])}" if check.problems else "")
        )
        parts.append(f"<p>{verdict} {detail}</p>")
    parts += [paragraph(f"note: {note}") for note in run.notes]
    parts.append(paragraph(f"{run.wall_s:.1f} s in all (process start-up, loading, every run)"))
    subtitle = (
        f"{run.directory}: {counted(run.stages, 'stage')} as {counted(run.stages, 'process', 'processes')} "
        f"({run.backend} on {run.device}, {counted(run.threads, 'thread')} each); batch {run.batch} = "
        f"{run.microbatches} microbatches ({', '.join(run.inputs)})"
    )
    return card("Pipeline run", *parts, subtitle=subtitle)
