"""The report's sections: HTML tables and inline SVG charts, each built from a result's ``to_dict()`` form.

Sections read dicts (the same data ``report.json`` holds), so this module needs none of the layers above
it: the environment, the capture record, the inspect table, lint findings (a click selects the node in
the graph), the optimize change log and verification, bench latencies (a chart: median per backend with
its p10-p90 range) and quantize accuracy and per-layer sensitivity (a chart). Charts are plain SVG drawn
here: no charting library, nothing to load.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from typing import Any

import torch

from fxforge import machine
from fxforge.display import byte_size, counted, escape, key_values, number, of_peak, status, table, tolerances_text
from fxforge.errors import option

_PACKAGES = ("fxforge", "torch", "torchvision", "timm", "transformers", "onnx", "onnxruntime", "numpy")


def environment() -> dict[str, Any]:
    """Versions, CPU and threads: what a reader of a report needs to trust or reproduce its numbers."""
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    # the CPU as bench's machine line and doctor read it: one list of the flags that change what is fast (this page
    # kept a shorter one of its own, and left out AMX's bf16 and int8, avx512_fp16, avx512bw and avx_vnni)
    cpu = machine.cpu_info()
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu.model,
        "cpu_flags": cpu.features,
        "cores": cpu.cores,
        "torch_threads": torch.get_num_threads(),
        "versions": versions,
    }


def section(title: str, body: str, *, anchor: str = "") -> str:
    ident = f' id="{escape(anchor)}"' if anchor else ""
    return f'<section class="fxr"{ident}><h2>{escape(title)}</h2>{body}</section>'


def environment_section(env: Mapping[str, Any]) -> str:
    versions = ", ".join(f"{name} {version}" for name, version in env.get("versions", {}).items())
    pairs = [
        (
            "CPU",
            f"{env.get('cpu')} ({env.get('cores')} cores; {', '.join(env.get('cpu_flags', [])) or 'no flags read'})",
        ),
        ("torch threads", env.get("torch_threads")),
        ("Python", env.get("python")),
        ("platform", env.get("platform")),
        ("versions", versions),
    ]
    return section("Environment", key_values(pairs), anchor="environment")


def capture_section(spec: str | None, record: Mapping[str, Any]) -> str:
    pairs = [
        ("model", spec),
        ("method", f"{record.get('method')} ({record.get('dialect')} dialect)"),
        ("leaves", ", ".join(record.get("leaves", [])) or None),
        ("wrapped", ", ".join(record.get("wrapped", [])) or None),
    ]
    body = key_values(pairs)
    checks = record.get("checks") or []
    if checks:
        rows = [
            (
                "example inputs" if c.get("batch") is None else f"batch {c['batch']}",
                status(c.get("ok"), "match", "differ"),
                f"{c.get('max_abs_err', 0):.3g}",
                c.get("message", ""),
            )
            for c in checks
        ]
        body += table(["check", "outputs", "max abs err", "note"], rows, raw=[1])
    attempts = record.get("attempts") or []
    if attempts:
        body += table(
            ["tried", "error", "at", "done"],
            [(a.get("strategy"), a.get("error"), a.get("location") or "", a.get("action") or "") for a in attempts],
        )
    return section("Capture", body, anchor="capture")


def inspect_section(report: Mapping[str, Any], *, depth: int = 2, limit: int = 60) -> str:
    totals = report.get("totals", {})
    summary = (
        f"<p>{totals.get('nodes', 0)} nodes, {totals.get('params', 0):,} parameters "
        f"({byte_size(totals.get('param_bytes'))}), {number(totals.get('flops'))} FLOPs "
        f"({number(totals.get('macs'))} MACs), activations {byte_size(totals.get('activation_bytes'))}</p>"
    )
    rows = [
        (m["path"], m["type"], m["nodes"], number(m["params"]), number(m["flops"]), byte_size(m["activation_bytes"]))
        for m in report.get("modules", [])
        if m["depth"] <= depth
    ]
    body = summary + table(
        ["module", "type", "nodes", "params", "FLOPs", "activations"], rows, numeric=[2, 3, 4, 5], limit=limit
    )
    return section("Inspect", body, anchor="inspect")


def lint_section(findings: Sequence[Mapping[str, Any]]) -> str:
    if not findings:
        return section("Lint", "<p>No findings.</p>", anchor="lint")
    rows = []
    for f in findings:
        node = escape(f.get("node") or "")
        rows.append(
            f'<tr class="fxr-finding" data-node="{node}" title="show {node} in the graph">'
            f"<td>{escape(f['code'])} {escape(f['name'])}</td>"
            f'<td class="sev-{escape(f["severity"])}">{escape(f["severity"])}</td>'
            f"<td>{node}</td><td>{escape(f['message'])}</td><td>{escape(f.get('fix') or '')}</td></tr>"
        )
    counts: dict[str, int] = {}
    for f in findings:
        counts[f["severity"]] = counts.get(f["severity"], 0) + 1
    head = "<tr><th>rule</th><th>severity</th><th>node</th><th>message</th><th>fix</th></tr>"
    summary = ", ".join(counted(count, severity) for severity, count in counts.items())
    body = f"<p>{counted(len(findings), 'finding')} ({escape(summary)}). Click one to see its node in the graph.</p>"
    rows_html = "".join(rows)
    scroll = f'<div class="fxr-scroll"><table><thead>{head}</thead><tbody>{rows_html}</tbody></table></div>'
    return section("Lint", body + scroll, anchor="lint")


def changelog_section(pipeline: Mapping[str, Any]) -> str:
    rows = []
    for step in pipeline.get("passes", []):
        check = step.get("verify")
        verdict = "-" if check is None else status(check.get("ok"), f"ok {check.get('max_abs_err', 0):.2g}", "FAILED")
        rows.append(
            (
                step["name"],
                "yes" if step.get("changed") else "no",
                step.get("replaced", 0),
                step.get("removed", 0),
                step.get("inserted", 0),
                f"{step.get('folded_params', 0):,}",
                verdict,
                f"{step.get('seconds', 0):.2f}",
                "; ".join(step.get("log", [])[:3])
                + (" ..." if len(step.get("log", [])) > 3 else "")
                + (f" (rolled back: {step['rolled_back']})" if step.get("rolled_back") else ""),
            )
        )
    body = table(
        ["pass", "changed", "replaced", "removed", "inserted", "folded params", "verify", "s", "what it did"],
        rows,
        numeric=[2, 3, 4, 5, 7],
        raw=[6],
    )
    return section("Optimize: change log", body, anchor="changelog")


def pipeline_verify_section(pipeline: Mapping[str, Any]) -> str:
    """The Verification section of a pipeline run, from its ``to_dict()``."""
    return verify_section(
        pipeline.get("verify"),
        failed_pass=pipeline.get("failed_pass"),
        problem=pipeline.get("problem"),
        compared_with_itself=bool(pipeline.get("compared_with_itself")),
    )


def verify_section(
    check: Mapping[str, Any] | None,
    *,
    failed_pass: str | None = None,
    problem: str | None = None,
    compared_with_itself: bool = False,
) -> str:
    if check is None and not problem:
        return section("Verification", f"<p>Not verified (run with {option('--verify', True)}).</p>", anchor="verify")
    parts = []
    if check is not None and check.get("ok") and compared_with_itself:
        # a graph no pass changed, whose reference is that graph itself: the check could not fail (QA)
        parts.append(
            "<p>Nothing to verify: no pass changed the graph, and the model is this graph itself (loaded, not "
            "captured from a model's code), so comparing them could not fail; it ran on "
            f"{escape(check.get('tried', ''))}.</p>"
        )
    elif check is not None:
        word = status(check.get("ok"), "verified", "FAILED")
        # what "verified" meant, as the command line says it (QA: the page gave errors with no tolerance)
        within = tolerances_text(check.get("tolerances") or {})
        parts.append(
            f"<p>{word}: {escape(check.get('tried', ''))}; max abs err {check.get('max_abs_err', 0):.3g}, "
            f"max rel err {check.get('max_rel_err', 0):.3g}{escape('; ' + within) if within else ''}</p>"
        )
        divergence = check.get("divergence")
        if divergence:
            node = escape(divergence["node"])
            rewritten = divergence.get("pass_name")
            parts.append(
                f'<table><tbody><tr class="fxr-finding" data-node="{node}"><td>first divergence</td><td>node {node} '
                f"({escape(divergence['target'])}), should equal reference node {escape(divergence['reference_node'])}"
                f"; max abs error {divergence['max_abs_err']:.3g}"
                f"{', last rewritten by pass ' + escape(rewritten) if rewritten else ''}"
                "</td></tr></tbody></table>"
            )
        for label, values in (
            ("problems", check.get("problems")),
            ("skipped", check.get("skipped")),
            ("warnings", check.get("warnings")),
        ):
            if values:
                parts.append(f"<p><b>{label}</b>: {escape('; '.join(values[:5]))}</p>")
    if failed_pass:
        parts.append(f'<p class="fxf-bad">pass {escape(failed_pass)} failed verification; nothing was written.</p>')
    if problem:
        parts.append(f'<p class="fxf-bad">{escape(problem)}</p>')
    return section("Verification", "".join(parts), anchor="verify")


# --------------------------------------------------------------------------------------------------
# charts


def bar_chart(
    rows: Sequence[tuple[str, float, float | None, float | None]],
    *,
    unit: str,
    title: str,
    width: int = 640,
    bar_color: str = "#4c6ef5",
) -> str:
    """Horizontal bars (label, value, low, high): the bar is the value, a whisker spans low..high."""
    if not rows:
        return ""
    label_w, row_h, top = 150, 24, 26
    plot_w = width - label_w - 90
    high = max(max(v, hi or v) for _, v, _, hi in rows) or 1.0
    height = top + row_h * len(rows) + 24
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="{escape(title)}" style="font:12px system-ui,sans-serif">',
        f'<text x="0" y="14" font-weight="600">{escape(title)}</text>',
    ]
    for tick in range(5):
        x = label_w + plot_w * tick / 4
        parts.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{height - 20}" stroke="#e9ecef"/>')
        parts.append(
            f'<text x="{x:.1f}" y="{height - 6}" text-anchor="middle" fill="#868e96">{high * tick / 4:.3g}</text>'
        )
    for index, (label, value, lo, hi) in enumerate(rows):
        y = top + index * row_h
        bar = plot_w * value / high
        parts.append(f'<text x="{label_w - 8}" y="{y + 15}" text-anchor="end">{escape(label)}</text>')
        parts.append(
            f'<rect x="{label_w}" y="{y + 4}" width="{max(bar, 1):.1f}" height="{row_h - 9}" '
            f'fill="{bar_color}" rx="2"/>'
        )
        if lo is not None and hi is not None:
            x1, x2, cy = label_w + plot_w * lo / high, label_w + plot_w * hi / high, y + row_h / 2
            parts.append(
                f'<line x1="{x1:.1f}" y1="{cy:.1f}" x2="{x2:.1f}" y2="{cy:.1f}" stroke="#212529" stroke-width="1.5"/>'
            )
            for x in (x1, x2):
                parts.append(
                    f'<line x1="{x:.1f}" y1="{cy - 5:.1f}" x2="{x:.1f}" y2="{cy + 5:.1f}" '
                    'stroke="#212529" stroke-width="1.5"/>'
                )
        parts.append(
            f'<text x="{label_w + max(bar, (hi or 0) * plot_w / high) + 6:.1f}" y="{y + 15}" fill="#343a40">'
            f"{value:.3g} {escape(unit)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def bench_section(bench: Mapping[str, Any]) -> str:
    rows = bench.get("rows", [])
    batches = sorted({row["batch"] for row in rows})
    charts = []
    for batch in batches:
        bars = [
            (row["backend"], row["median_ms"], row.get("p10_ms"), row.get("p90_ms"))
            for row in rows
            if row["batch"] == batch and row.get("median_ms") is not None
        ]
        charts.append(bar_chart(bars, unit="ms", title=f"latency per backend, batch {batch}: median, p10-p90"))
    table_rows = [
        (
            row["backend"],
            row["batch"],
            _ms(row.get("median_ms")),
            _ms(row.get("p10_ms")),
            _ms(row.get("p90_ms")),
            _speedup(row),
            f"{row['throughput']:.1f}" if row.get("throughput") else "-",
            _gflops(row),
            f"{row['peak_mem_mib']:.1f}" if row.get("peak_mem_mib") is not None else "-",
            f"{row['max_abs_err']:.2g}" if row.get("max_abs_err") is not None else "-",
            f"{row['build_s']:.1f}" if row.get("build_s") is not None else "-",
            _bench_status(row),
            row.get("error") or "; ".join(row.get("notes", [])),
        )
        for row in rows
    ]
    headers = ["backend", "batch", "median ms", "p10 ms", "p90 ms", "speedup", "samples/s", "GFLOP/s (of peak)"]
    headers += ["peak MiB", "max abs err", "build s", "status", "notes"]
    body = "".join(charts) + table(headers, table_rows, numeric=range(1, 11), raw=[11])
    body += (
        f"<p>{counted(bench.get('threads') or 0, 'thread')}, {counted(bench.get('warmup') or 0, 'warm-up call')}, "
        f"{bench.get('repeats')} timed "
        f"rounds (backends shuffled each round); inputs {escape(', '.join(bench.get('inputs', [])))}; speedup: "
        "eager's median over the row's, in brackets the 95% interval of eager's time over the row's round by "
        "round (an interval that reaches 1.00 is no speedup within noise)</p>"
    )
    if bench.get("machine"):  # the CPU, its features and measured peaks the timings were taken on, as bench prints
        body += f"<p>machine: {escape(bench['machine'])}</p>"
    if bench.get("noise_warning"):
        body += f"<p class='fxf-warn'>{escape(bench['noise_warning'])}</p>"
    return section("Bench", body, anchor="bench")


def _bench_status(row: Mapping[str, Any]) -> str:
    """As the CLI's status column: a row out of tolerance must not read as a plain timing (QA: a backend returning
    NaN showed as a normal row in the notebook)."""
    if row.get("error"):
        return status(False, bad="failed")
    return {True: status(True), False: '<span class="fxf-bad">beyond tol</span>'}.get(
        row.get("within_tolerance"), "not compared"
    )


def _gflops(row: Mapping[str, Any]) -> str:
    if row.get("gflops") is None:
        return "-"
    fraction = row.get("peak_fraction")
    if fraction is None:
        return f"{row['gflops']:.0f}"
    return f"{row['gflops']:.0f} ({of_peak(fraction, row.get('precision', 'fp32'))})"


def _speedup(row: Mapping[str, Any]) -> str:
    if not row.get("speedup"):
        return "-"
    interval = row.get("speedup_interval")
    return f"{row['speedup']:.2f}x" + (f" ({interval[0]:.2f}-{interval[1]:.2f})" if interval else "")


def _ms(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "-"


def quantize_section(result: Mapping[str, Any]) -> str:
    accuracy = result.get("accuracy") or {}
    pairs = [
        ("mode", f"{result.get('mode')} ({result.get('backend')} backend, {result.get('machinery')})"),
        ("evaluated on", _evaluation(result.get("evaluation"), result.get("accuracy_known"))),
        (
            "top-1 agreement",
            f"{100 * accuracy['top1_agreement']:.2f}%" if accuracy.get("top1_agreement") is not None else None,
        ),
        ("max abs error", f"{accuracy['max_abs_err']:.4g}" if accuracy.get("max_abs_err") is not None else None),
        ("mean abs error", f"{accuracy['mean_abs_err']:.4g}" if accuracy.get("mean_abs_err") is not None else None),
        ("relative error", f"{100 * accuracy['rel_err']:.2f}%" if accuracy.get("rel_err") is not None else None),
        ("quantized layers", len(result.get("quantized_layers", []))),
        ("kept in float", ", ".join(result.get("float_layers", [])) or None),
        (
            "target",
            f"{result.get('target')}: {'met' if result.get('target_met') else 'not met'}"
            if result.get("target")
            else None,
        ),
    ]
    body = key_values(pairs)
    for warning in result.get("warnings", []):
        body += f'<p class="fxf-warn">warning: {escape(warning)}</p>'
    sensitivity = result.get("sensitivity") or []
    if sensitivity:
        ranked = sorted(sensitivity, key=lambda s: -s["rel_err"])[:25]
        bars = [(s["layer"], 100 * s["rel_err"], None, None) for s in ranked]
        body += bar_chart(
            bars,
            unit="%",
            title="sensitivity: relative error with only this layer in int8",
            bar_color="#f08c00",
            width=680,
        )
    return section("Quantize", body, anchor="quantize")


def _evaluation(evaluation: Mapping[str, Any] | None, accuracy_known: bool | None = None) -> str | None:
    if not evaluation:
        return None
    if evaluation.get("random"):
        what = "random inputs (accuracy on real data unknown)"
    elif accuracy_known is False and evaluation.get("samples"):  # the user's data, but the calibration data itself
        what = "the calibration data itself (in-sample: the error on new data can be larger)"
    else:
        what = "your data"
    return f"{evaluation.get('samples', '?')} samples of {what}"


def graph_section(title: str, note: str = "") -> str:
    """The place the graph viewer mounts into (``#fxg-graph``)."""
    return section(title, (f"<p>{escape(note)}</p>" if note else "") + '<div id="fxg-graph"></div>', anchor="graph")


# Lint findings and the divergence row select their node in the graph (the viewer is window.fxgraph).
REPORT_SCRIPT = """
document.addEventListener('click', function (ev) {
  var row = ev.target.closest('tr[data-node]');
  if (!row || !window.fxgraph || !row.getAttribute('data-node')) return;
  document.getElementById('graph').scrollIntoView({behavior: 'instant', block: 'start'});
  window.fxgraph.select(row.getAttribute('data-node'));
});
"""


def join(parts: Iterable[str]) -> str:
    return "".join(part for part in parts if part)
