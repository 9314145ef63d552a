"""Human-readable output: rich tables and lines for every report the CLI prints.

Nothing here computes anything; each function takes a report object (read by attribute, so this module
imports no torch and ``fxforge --help`` stays fast) and a ``rich`` console.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from fxforge.display import byte_size, counted, of_peak

_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
# inspect's quant column, in fxforge.vocabulary.QUANT_KINDS order: what is left of calibration stands out
_QUANT_STYLE = {
    "observer": "yellow",
    "fake_quant": "yellow",
    "qat": "yellow",
    "quantize": "cyan",
    "dequantize": "cyan",
    "int8": "green",
}


def human_count(value: float, unit: str = "") -> str:
    for threshold, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= threshold:
            return f"{value / threshold:.2f}{suffix}{unit}"
    return f"{value:g}{unit}"


def print_fitted(console: Any, build: Callable[[set[str]], Table], optional: list[str]) -> list[str]:
    """Print the table ``build(left_out)`` makes, leaving out as few of the ``optional`` columns (first ones first) as
    let every cell fit the console whole; return the columns left out. In a narrow terminal rich cut the numbers
    instead, "567…" for "567.31" (QA, ``COLUMNS=80``). The columns left out are named; ``--json`` has them all. A
    console that widens its tables when piped (``cli.options``) says how wide it lets them grow, as ``table_room``.
    Headers wrap at their words before a column is left out: a wrapped header costs less than a missing column."""
    room = getattr(console, "table_room", console.width)
    unbounded = console.options.update_width(100_000)  # rich clamps a measurement to the width it is given
    left_out: list[str] = []
    table = _cells_whole(build(set()), console, unbounded, room)
    for name in optional:
        if Measurement.get(console, unbounded, table).minimum <= room:
            break
        left_out.append(name)
        table = _cells_whole(build(set(left_out)), console, unbounded, room)
    console.print(table)
    if left_out:
        shown = ", ".join(left_out)
        console.print(f"[dim]not shown at this width ({room} columns): {shown}; --json has every column[/]")
    return left_out


def _cells_whole(table: Table, console: Any, options: Any, room: int) -> Table:
    """Fix each column's width to its widest cell line and its header's, the last column's excepted (its text may
    wrap): squeezing a table, rich narrows its widest columns first, whatever they hold. Where the table is then
    wider than ``room``, headers wrap at their words, those that give back the most columns first. (Every header
    was wrapped at its longest word: "median / ms" over "0.54" even at 200 columns.)"""
    wrappable: list[tuple[int, Any, int]] = []  # (columns it can give back, column, its width, header wrapped)
    for column in table.columns[:-1]:
        if column.no_wrap:
            continue
        lines = [line for cell in column.cells for line in _plain(cell).splitlines()]
        header = _plain(column.header)
        cells = max([len(line) for line in lines] + [1])
        column.width = max([cells] + [len(line) for line in header.splitlines()])
        wrapped = max([cells] + [len(word) for word in header.split()])
        if wrapped < column.width:
            wrappable.append((column.width - wrapped, column, wrapped))
    excess = Measurement.get(console, options, table).minimum - room
    for _, column, wrapped in sorted(wrappable, key=lambda entry: entry[0], reverse=True):
        if excess <= 0:
            break
        narrowed = max(wrapped, column.width - excess)  # no narrower than needed: "GFLOP/s / (of peak)", not 3 lines
        column.width, excess = narrowed, excess - (column.width - narrowed)
    return table


def _plain(cell: Any) -> str:
    return Text.from_markup(cell).plain if isinstance(cell, str) else getattr(cell, "plain", str(cell))


def render_capture(console: Console, spec: str, capture: dict[str, Any]) -> None:
    leaves = ", ".join(capture["leaves"]) or "none"
    how = "loaded as a graph" if capture["method"] == "loaded" else f"captured by [green]{capture['method']}[/]"
    line = f"[bold]{escape(spec)}[/]  {how} ({capture['dialect']} dialect)"  # a saved graph is not captured (QA)
    console.print(line)
    if capture["leaves"] or capture["wrapped"]:
        console.print(f"  leaves: {leaves}; wrapped: {', '.join(capture['wrapped']) or 'none'}")
    for attempt in capture["attempts"]:
        action = f" -> {attempt['action']}" if attempt.get("action") else ""
        where = f" at {attempt['location']}" if attempt.get("location") else ""
        console.print(f"  [dim]{attempt['strategy']} failed{where}: {attempt['error']}{action}[/]")
    for check in capture["checks"]:
        batch = "example batch" if check["batch"] is None else f"batch {check['batch']}"
        if check["ok"]:
            said = f"; {escape(check['message'])}" if check.get("message") else ""
            console.print(f"  check ({batch}): [green]outputs match[/] (max abs err {check['max_abs_err']:.2g}{said})")
        else:
            console.print(f"  check ({batch}): [bold red]outputs differ[/]: {check['message']}")
    for note in capture["notes"]:
        console.print(f"  [dim]{note}[/]")


def render_capture_warnings(console: Console, record: Any) -> None:
    """The capture notes a command that prints no capture section must still show: why the graph was not
    compared with the model (a random model, weights on meta), or why two runs of the model differ."""
    for note in record.notes:
        if note.startswith(("output check skipped", "the model is random")):
            console.print(f"  [yellow]capture: {escape(note)}[/]")


def render_inspect(console: Console, spec: str, report: Any, show_nodes: bool, show_code: bool) -> None:
    render_capture(console, spec, report.capture)
    quantized = any(node.quant for node in report.nodes)
    if show_nodes:
        table = Table(title="Nodes", show_lines=False)
        for column in ("name", "op", "target", "module", "shape", "dtype") + (("quant",) if quantized else ()):
            table.add_column(column)
        for column in ("params", "FLOPs", "act."):
            table.add_column(column, justify="right")
        for node in report.nodes:
            table.add_row(
                node.name,
                node.op,
                node.target,
                node.module,
                _shape(node.shape),
                node.dtype or "",
                *((_quant_cell(node.quant),) if quantized else ()),
                human_count(node.params) if node.params else "",
                human_count(node.flops) if node.flops else "",
                byte_size(node.activation_bytes) if node.activation_bytes else "",
            )
        console.print(table)
    if report.modules:
        table = Table(title="Modules")
        table.add_column("module")
        table.add_column("type")
        for column in ("nodes", "params", "FLOPs", "activations"):
            table.add_column(column, justify="right")
        for module in report.modules:
            indent = "  " * (module.depth - 1)
            table.add_row(
                indent + module.path.rsplit(".", 1)[-1] if module.depth > 1 else module.path,
                module.type,
                str(module.nodes),
                human_count(module.params),
                human_count(module.flops),
                byte_size(module.activation_bytes),
            )
        console.print(table)
    totals = report.totals
    console.print(
        f"[bold]Total[/]: {totals['nodes']} nodes, {totals['params']:,} parameters "
        f"({byte_size(totals['param_bytes'])}), {human_count(totals['flops'], ' FLOPs')} "
        f"({human_count(totals['macs'], ' MACs')}), activations {byte_size(totals['activation_bytes'])}"
    )
    unknown = totals.get("flops_unknown_ops") or []
    if unknown:
        nodes = {op: sum(1 for node in report.nodes if op in node.flops_unknown) for op in unknown}
        listed = ", ".join(f"{op} ({n} node{'s' if n != 1 else ''})" for op, n in nodes.items())
        console.print(f"[yellow]FLOPs unknown[/] (counted as 0, no formula): {listed}")
    if quantized:
        counts = [(kind, totals.get(f"{kind}_nodes", 0)) for kind in _QUANT_STYLE]
        console.print("[bold]Quantization[/]: " + ", ".join(f"{n} {kind}" for kind, n in counts if n) + " nodes")
    if show_code:
        console.print(report.code, markup=False, highlight=False)


def _quant_cell(kind: str) -> str:
    return f"[{_QUANT_STYLE[kind]}]{kind}[/]" if kind in _QUANT_STYLE else ""


def _shape(shape: Any) -> str:
    if shape is None:
        return ""
    if shape and isinstance(shape[0], list):
        return ", ".join("x".join(map(str, s)) for s in shape)
    return "x".join(map(str, shape)) or "scalar"


_LONGEST_KEPT_WHOLE = 40  # characters: a longer fix (a rule's sentence) may wrap rather than squeeze the message
_OTHER_LINT_COLUMNS = 65  # characters the other five columns and the borders need to stay readable beside it


def render_findings(console: Console, spec: str, findings: list[Any]) -> None:
    if not findings:
        console.print(f"{escape(spec)}: [green]All checks passed![/]")
        return
    table = Table(title=f"Lint findings for {escape(spec)}", title_justify="left")
    # a fix names a pass (remove_redundant_activation) the user types next: kept whole, not folded mid-name as
    # rich folds a word longer than its column; the message takes the wrapping
    longest_fix = max(len(finding.fix or "") for finding in findings)
    # where the terminal has the room: a column rich may not wrap, wider than the rest can give, is cut at its edge
    keep_whole = longest_fix <= _LONGEST_KEPT_WHOLE and console.width >= longest_fix + _OTHER_LINT_COLUMNS
    for column in ("rule", "severity", "node", "module", "message", "fix"):
        table.add_column(column, overflow="fold", no_wrap=column == "fix" and keep_whole)
    for finding in findings:
        style = _SEVERITY_STYLE[finding.severity]
        # Text cells, not markup: messages quote user code and module names that may contain "[...]".
        table.add_row(
            Text(f"{finding.code} {finding.name}", style=style),
            Text(finding.severity, style=style),
            Text(finding.node or "<graph>"),
            Text(finding.module or ""),
            Text(finding.message),
            Text(finding.fix or "", style="dim"),
        )
    console.print(table)
    counts = {s: sum(1 for f in findings if f.severity == s) for s in ("error", "warning", "info")}
    summary = ", ".join(f"{n} {s}{'s' if n != 1 else ''}" for s, n in counts.items() if n)
    console.print(f"Found {len(findings)} finding{'s' if len(findings) != 1 else ''} ({summary}).")


def render_rules(console: Console, rules: list[Any]) -> None:
    table = Table(title="Lint rules")
    for column in ("code", "name", "severity", "fix", "dialects", "from", "summary"):
        table.add_column(column)
    for r in rules:
        table.add_row(r.code, r.name, r.severity, r.fix or "", ",".join(r.dialects), r.origin, r.summary)
    console.print(table)


SKIPPED_SHOWN = 3  # per pass; the JSON report has every skipped candidate and its reason


def render_optimize(console: Console, spec: str, result: Any) -> None:
    pipeline = result.pipeline
    table = Table(title=f"Passes on {escape(spec)}")
    for column in ("pass", "changed", "replaced", "removed", "inserted", "folded params", "lint", "verify"):
        table.add_column(column, justify="left" if column == "pass" else "right")
    for step in pipeline.steps:
        r = step.result
        check = step.verification
        verdict = "" if check is None else ("[green]ok[/]" if check.ok else "[bold red]FAIL[/]")
        if check is not None:  # a pass is checked on few cases as it runs; the final graph on all (below)
            # an absolute error of 1e10 passes where the outputs are 1e17 (random weights, no BN statistics): the
            # relative one beside it says why it passed (QA: "ok 9.7e+09" read as alarming)
            relative = f", rel {check.max_rel_err:.0e}" if check.max_abs_err >= 1 else ""
            verdict += f" {check.max_abs_err:.1e}{relative} ({check.trials} case{'s' if check.trials != 1 else ''})"
        table.add_row(
            r.name,
            "yes" if r.changed else "no",
            str(r.replaced),
            str(r.removed),
            str(r.inserted),
            f"{r.folded_params:,}",
            "" if step.lint_findings is None else str(step.lint_findings),
            verdict,
        )
    if pipeline.steps:  # a reference that cannot be verified stops the run before any pass: a bare header said nothing
        console.print(table)
    said: set[tuple[str, str]] = set()
    for step in pipeline.steps:
        # a pass run twice (-p exact runs remove_identity again after fold_constants) skips the same nodes again
        skipped = [line for line in step.result.skipped if (step.result.name, line) not in said]
        said.update((step.result.name, line) for line in skipped)
        for line in skipped[:SKIPPED_SHOWN]:
            console.print(f"  [dim]{step.result.name} skipped: {escape(line)}[/]")
        if len(skipped) > SKIPPED_SHOWN:  # a timm net gave 33 lines of cse alone
            more = len(skipped) - SKIPPED_SHOWN
            console.print(f"  [dim]{step.result.name} skipped {more} more (--json lists all)[/]")
    for step in pipeline.rolled_back:
        if step.result.name != pipeline.failed_pass:
            console.print(f"  [yellow]pass {step.result.name} rolled back[/]: {step.rolled_back}")
    if pipeline.problem:
        # the verdict in verify's and export's words (CANNOT VERIFY); the JSON keeps the problem as it is
        verdict, said, reason = pipeline.problem.partition(": ")
        line = f"[bold red]CANNOT VERIFY[/]: {escape(reason)}" if said and verdict == "cannot verify" else None
        console.print(line or f"[bold red]{escape(pipeline.problem)}[/]")
        console.print("  nothing was written")
    elif pipeline.verification is not None:
        check = pipeline.verification
        if check.ok and pipeline.compared_with_itself:
            # QA: "verified" was printed for a loaded program no pass changed, compared with a copy of itself
            console.print(
                f"[yellow]nothing to verify[/]: no pass changed the graph, and the model is this graph itself "
                f"(loaded, not captured from a model's code), so comparing them could not fail; it ran on "
                f"{check.describe_inputs()}"
            )
        elif check.ok:
            console.print(
                f"[green]verified[/]: outputs match the model on {check.describe_inputs()} "
                f"(max abs err {check.max_abs_err:.2g}, max rel err {check.max_rel_err:.2g}{_within(check)})"
            )
            render_verify_doubts(console, check)
        else:
            culprit = f" after pass {pipeline.failed_pass}" if pipeline.failed_pass else ""
            console.print(f"[bold red]verification failed{culprit}[/]")
            if check.divergence is not None:
                console.print("  " + check.divergence.describe())
            for problem in check.problems[:3]:
                console.print(f"  {problem}")
            console.print("  nothing was written")
    for note in getattr(result, "notes", []):
        console.print(f"  [dim]note: {note}[/]")
    if result.output_dir is not None:
        console.print(f"wrote {result.output_dir}/: {', '.join(result.files)}")


def render_timings(console: Console, capture_s: float, result: Any) -> None:
    """Where an optimize run spent its time: capture, shape facts, reference outputs, each pass, writing."""
    timings = dict(result.pipeline.timings)
    parts = [f"capture {capture_s:.2f} s"]
    parts += [f"{name} {seconds:.2f} s" for name, seconds in timings.items()]
    if getattr(result, "write_s", None):
        parts.append(f"write {result.write_s:.2f} s")
    total = capture_s + sum(timings.values()) + (getattr(result, "write_s", 0.0) or 0.0)
    console.print(f"[dim]time: {', '.join(parts)}; total {total:.2f} s (each pass: rewrite and verification)[/]")


def render_verify_doubts(console: Console, result: Any) -> None:
    """What a verification left out (batch sizes the model rejects) and what it doubts (NaN in the reference)."""
    for skipped in result.skipped[:3]:
        console.print(f"  [dim]not tried: {skipped}[/]")
    for warning in result.warnings[:3]:
        console.print(f"  [yellow]warning:[/] {warning}")


def _within(check: Any) -> str:
    """The tolerances a passed check compared with: what "match" meant."""
    described = check.describe_tolerances()
    return f"; {described}" if described else ""


def render_verify(console: Console, reference: str, candidate: str, result: Any) -> None:
    files = getattr(result, "files", {})
    reference += f" ({files['reference']})" if "reference" in files else ""
    candidate += f" ({files['candidate']})" if "candidate" in files else ""
    if result.ok:
        console.print(
            f"[green]OK[/]: {escape(candidate)} matches {escape(reference)} on {result.describe_inputs()} "
            f"(max abs err {result.max_abs_err:.3g}, max rel err {result.max_rel_err:.3g}{_within(result)})"
        )
        render_verify_doubts(console, result)
        return
    if result.unverifiable:  # the reference gives nothing to compare against: no verdict on the candidate
        console.print(
            f"[bold red]CANNOT VERIFY[/]: {escape(candidate)} against {escape(reference)}: "
            "the reference cannot be checked"
        )
    elif result.rejected_inputs:  # a program exported for other shapes: it computed nothing to compare
        console.print(
            f"[bold red]REJECTED[/]: {escape(candidate)} does not run on inputs {escape(reference)} takes "
            f"({result.rejected_inputs})"
        )
    else:
        console.print(
            f"[bold red]MISMATCH[/]: {escape(candidate)} differs from {escape(reference)} "
            f"(tried {result.describe_inputs()})"
        )
    for problem in result.problems[:5]:
        console.print(f"  {problem}")
    # a mismatch at the batch tried says nothing of a batch left out: name it, as the OK line does (a rejection
    # names the shapes the candidate refuses already)
    for skipped in [] if result.rejected_inputs else result.skipped[:3]:
        console.print(f"  [dim]not tried: {skipped}[/]")
    if result.divergence is not None:
        console.print("  " + result.divergence.describe())
    elif result.divergence_unknown:
        console.print(f"  [dim]no diverging node named: {result.divergence_unknown}[/]")
    if result.hint:
        console.print(f"  hint: {escape(result.hint)}")


def render_passes(console: Console, specs: list[Any]) -> None:
    table = Table(title="Passes", show_lines=True)
    for column in ("name", "dialects", "options", "from", "what it does and guarantees"):
        table.add_column(column)
    for spec in specs:
        options = ", ".join(f.name for f in spec.option_fields()) or "-"
        summary = f"{spec.summary}\n[dim]{spec.guarantees}[/]"
        table.add_row(spec.name, ",".join(spec.dialects), options, spec.origin, summary)
    console.print(table)


def render_plugin_failures(console: Console, failures: list[Any]) -> None:
    """One warning line per plug-in that failed to load (the others still work)."""
    for failure in failures:
        console.print(f"[yellow]warning:[/] {escape(failure.describe())}")


def render_backends(console: Console, backends: list[dict[str, Any]]) -> None:
    table = Table(title="bench backends")
    for column in ("name", "from", "runs here", "summary"):
        table.add_column(column)
    for backend in backends:
        here = "yes" if backend["unsupported_here"] is None else f"no: {backend['unsupported_here']}"
        table.add_row(backend["name"], backend["origin"], escape(here), escape(backend["summary"]))
    console.print(table)


def render_quantize(console: Console, spec: str, result: Any) -> None:
    """The quantize report: what ran, the accuracy against float, the sensitivity ranking, the layers."""
    mode = {"static": "static int8", "dynamic": "dynamic int8", "qat-prepare": "QAT preparation"}[result.mode]
    console.print(f"[bold]{escape(spec)}[/]: {mode} ({result.backend} backend) with {result.machinery}")
    for name, data in (("calibration", result.calibration), ("evaluation", result.evaluation)):
        if data is not None and not (name == "evaluation" and data == result.calibration):
            labels = ", with labels" if data.get("labels") else ""
            console.print(f"  {name}: {data['source']}: {data['samples']} samples in {data['batches']} batches{labels}")
    accuracy = result.accuracy
    if accuracy is not None:
        # with no layer quantized, "int8" would name what is not there (QA)
        title = "int8 vs float" if result.quantized_layers else "quantized model vs float (no layer is int8)"
        table = Table(title=title, title_justify="left")
        table.add_column("metric")
        table.add_column("value", justify="right")
        table.add_row("samples", f"{accuracy.samples} ({accuracy.data})")
        if accuracy.top1_agreement is not None:
            table.add_row("top-1 agreement", f"{accuracy.top1_agreement:.2%}")
        if accuracy.top1_drop is not None:
            table.add_row("float top-1 accuracy", f"{accuracy.float_top1:.2%}")
            table.add_row("int8 top-1 accuracy", f"{accuracy.int8_top1:.2%}")
            table.add_row("top-1 accuracy drop", f"{accuracy.top1_drop * 100:+.2f} pp")
        table.add_row("max abs error", f"{accuracy.max_abs_err:.4g}")
        table.add_row("mean abs error", f"{accuracy.mean_abs_err:.4g}")
        table.add_row("relative error", f"{accuracy.rel_err:.2%}")
        console.print(table)
    if result.sensitivity:
        _render_sensitivity(console, result)
    quantized = ", ".join(result.quantized_layers) or "none"
    done = "fake-quantized" if result.mode == "qat-prepare" else "quantized"
    console.print(f"  {done} ({len(result.quantized_layers)}): {quantized}")
    if result.float_layers:
        console.print(f"  kept in float ({len(result.float_layers)}): {', '.join(result.float_layers)}")
    if result.target is not None:
        verdict = "[green]met[/]" if result.target_met else "[bold red]not met[/]"
        console.print(f"  target {result.target}: {verdict}")
    for note in result.notes:
        console.print(f"  [dim]{note}[/]")
    if result.output_dir is not None:
        console.print(f"wrote {result.output_dir}/: {', '.join(result.files)}")
        if result.load and "sys.path" in result.load:  # the plain torch.load the docs show is not enough
            console.print(f"  load: {escape(result.load_anywhere)}", highlight=False, soft_wrap=True)


def _render_sensitivity(console: Console, result: Any) -> None:
    table = Table(
        title="Sensitivity: each unit (layer or op) quantized alone (a sigmoid, tanh or softmax with its input's), "
        "most harmful first",
        title_justify="left",
    )
    labelled = any(entry.top1_drop is not None for entry in result.sensitivity)
    classifier = any(entry.top1_agreement is not None for entry in result.sensitivity)
    table.add_column("rank", justify="right")
    table.add_column("unit")
    table.add_column("type")
    for column in ("mean abs err", "max abs err", "rel err"):
        table.add_column(column, justify="right")
    if classifier:
        table.add_column("top-1 agreement", justify="right")
    if labelled:
        table.add_column("top-1 drop", justify="right")
    table.add_column("kept float")
    floats = set(result.float_layers)
    for rank, entry in enumerate(result.sensitivity, 1):
        row = [str(rank), entry.layer, entry.type, f"{entry.mean_abs_err:.3g}", f"{entry.max_abs_err:.3g}"]
        row.append(f"{entry.rel_err:.2%}")
        if classifier:
            row.append(f"{entry.top1_agreement:.2%}" if entry.top1_agreement is not None else "")
        if labelled:
            row.append(f"{entry.top1_drop * 100:+.2f} pp" if entry.top1_drop is not None else "")
        row.append("yes" if entry.layer in floats else "")
        table.add_row(*row)
    console.print(table)


def render_export(
    console: Any, spec: str, result: Any, capture_s: float | None = None, total_s: float | None = None
) -> None:
    """Print an export result on a rich console (the CLI's human output). ``capture_s``/``total_s``: the command's
    own clocks, so that the seconds printed add up to the wait (QA: "1.4 s" printed after 36 s)."""
    check = result.verification
    opset = f", opset {result.opset}" if result.opset else ""
    if result.ok:
        took = [f"export {result.export_s:.1f} s"]
        if check is not None:
            took.append(f"load and verify {result.verify_s:.1f} s")
        if capture_s is not None:
            took.insert(0, f"capture {capture_s:.1f} s")
        if total_s is not None:
            took.append(f"{total_s:.1f} s in all")
        console.print(
            f"[green]exported[/] {escape(spec)} to {result.path} ({result.format} via {result.exporter}{opset}, "
            f"{byte_size(result.size_bytes)}; {', '.join(took)})"
        )
        if check is not None:
            console.print(
                f"  [green]verified[/]: reloaded file matches the model on {check.describe_inputs()} "
                f"(max abs err {check.max_abs_err:.3g}, max rel err {check.max_rel_err:.3g}{_within(check)})"
            )
            for skipped in check.skipped[:3]:
                console.print(f"  [dim]not tried: {skipped}[/]")
        else:
            console.print("  [yellow]not verified[/] (--no-verify)")
    else:
        what = f"the {result.format} export of {escape(spec)} (via {result.exporter})"
        if check is not None and check.unverifiable:  # the model itself gives nothing to compare against
            console.print(f"[bold red]CANNOT VERIFY[/]: {what}: the model cannot be checked; nothing was written")
        elif check is not None and check.rejected_inputs:
            console.print(
                f"[bold red]REJECTED[/]: {what} does not run on inputs the model takes ({check.rejected_inputs}); "
                "nothing was written"
            )
        else:
            console.print(
                f"[bold red]MISMATCH[/]: {what} differs from the model beyond the tolerance; nothing was written"
            )
        for problem in (check.problems if check else [])[:5]:
            console.print(f"  {problem}")
        if any(note.startswith("trace:") for note in result.notes):
            console.print("  [dim]hint:[/] the trace fixed a data-dependent value (see the notes); try --script")
    for note in result.notes:
        console.print(f"  [dim]note: {note}[/]")


def render_bench(console: Any, spec: str, report: Any) -> None:
    """Print a bench report as a rich table (the CLI's human output)."""
    # samples/s is batch / median: worth its width only where batch sizes differ (it stays in --json)
    throughput = len({row.batch for row in report.rows}) > 1
    columns: list[tuple[str, Any]] = [
        ("batch", lambda row: str(row.batch)),
        ("median ms", lambda row: _fmt(row.median_ms, ".2f")),
        ("p90 ms", lambda row: _fmt(row.p90_ms, ".2f")),
        *([("samples/s", lambda row: _fmt(row.throughput, ".1f"))] if throughput else []),
        ("speedup", _speedup),
        ("GFLOP/s (of peak)", _gflops),
        ("peak MiB", lambda row: _fmt(row.peak_mem_mib, ".1f")),
        ("max abs err", lambda row: _fmt(row.max_abs_err, ".2g")),
        ("build s", lambda row: _fmt(row.build_s, ".1f")),
    ]

    def build(left_out: set[str]) -> Table:
        table = Table(title=f"{escape(spec)}  inputs {', '.join(report.inputs)}  threads {report.threads}")
        table.add_column("backend", no_wrap=True)
        shown = [(name, cell) for name, cell in columns if name not in left_out]
        for name, _ in shown:
            # the speedup's interval under it ("0.97-1.05") must not be cut
            table.add_column(name, justify="right", min_width=9 if name == "speedup" else None)
        table.add_column("status")
        for row in report.rows:
            if not row.ok:
                cells = [str(row.batch), *["-"] * (len(shown) - 1)]
                # too narrow for the table's columns, too narrow for an error: said whole under it (QA: at 60
                # columns one error wrapped to 45 lines of 12 characters, its key words cut)
                said = "[red]failed (below)[/]" if left_out else f"[red]{escape(row.error)}[/]"
                table.add_row(row.backend, *cells, said)
                continue
            verdict = {True: "[green]ok[/]", False: "[yellow]beyond tol[/]", None: "not compared"}[row.within_tolerance]
            table.add_row(row.backend, *(cell(row) for _, cell in shown), verdict)
        return table

    left_out = print_fitted(
        console, build, ["build s", "peak MiB", "p90 ms", "samples/s", "GFLOP/s (of peak)", "max abs err"]
    )
    for row in report.rows if left_out else ():
        if not row.ok:
            console.print(f"[red]{escape(row.backend)} (batch {row.batch}) failed:[/] {escape(row.error)}")
    if report.machine:
        console.print(f"[dim]machine: {escape(report.machine)}[/]")
    console.print(
        f"[dim]{counted(report.repeats, 'timed call')} per backend after {counted(report.warmup, 'warm-up call')}, "
        "interleaved "
        f"in a shuffled order each round, each right after untimed calls of the same backend (20 ms at least); "
        "speedup: eager's median over the row's, under it the 95% interval of eager's time over the row's round by "
        "round (an interval that reaches 1.00 is no speedup within noise); max abs err "
        f"vs eager on the same inputs; of peak: GFLOP/s over the measured matmul peak of the row's precision; "
        f"peak MiB: {report.memory}[/]"
    )
    _print_row_notes(console, report.rows)
    _print_beyond_peak(console, (row.peak_fraction for row in report.rows))
    _print_noise_warning(console, report)


def _speedup(row: Any) -> str:
    if row.speedup is None:
        return "-"
    if row.speedup_interval is None:
        return f"{row.speedup:.2f}x"
    low, high = row.speedup_interval
    return f"{row.speedup:.2f}x\n[dim]{_short(low)}-{_short(high)}[/]"


def _short(ratio: float) -> str:
    return f"{ratio:.2f}" if ratio < 10 else f"{ratio:.1f}" if ratio < 100 else f"{ratio:.0f}"


def _gflops(row: Any) -> str:
    """GFLOP/s over its share of the measured peak (one column: the table must fit 120 columns when piped)."""
    if row.gflops is None:
        return "-"
    share = f"\n[dim]({of_peak(row.peak_fraction, row.precision)})[/]" if row.peak_fraction is not None else ""
    return f"{row.gflops:.0f}{share}"


def _print_row_notes(console: Any, rows: Any) -> None:
    """Each backend's notes once; a note that holds at some batch sizes only names them (QA: with --batch 1,4
    every note was printed twice, with no batch)."""
    batches: dict[str, list[int]] = {}
    said: dict[tuple[str, str], list[int]] = {}
    for row in rows:
        batches.setdefault(row.backend, []).append(row.batch)
        for note in row.notes:
            said.setdefault((row.backend, note), []).append(row.batch)
    for (backend, note), at in said.items():
        where = "" if len(at) == len(batches[backend]) else f" (batch {', '.join(map(str, at))})"
        console.print(f"[dim]{escape(backend)}{where}: {escape(note)}[/]")


def _print_beyond_peak(console: Any, fractions: Iterable[float | None]) -> None:
    # seen at 242%: a peak measured while the machine was busy makes every fraction of it too high
    if any(f is not None and f > 1 for f in fractions):
        console.print(
            "[yellow]of peak above 100% (!): faster than the matmul peak measured at the start, which cannot "
            "be; the peak was measured while the machine was busy (rerun with nothing else running), or the "
            "backend computes fewer multiplications than the model's FLOP count says[/]"
        )


def _print_noise_warning(console: Any, report: Any) -> None:
    if report.noise_warning:
        console.print(f"[yellow]{escape(report.noise_warning)}[/]")


def render_auto(console: Any, spec: str, result: Any) -> None:
    """Print an auto-optimize result on a rich console (the CLI's human output)."""
    passes = ", ".join(result.passes) or "none changed the graph"
    console.print(f"[bold]{escape(spec)}[/]  exact passes: {passes}")
    for name, reason in result.rejected_passes.items():
        console.print(f"  [yellow]pass {name} rejected[/]: {escape(reason)}")
    dropped = any(c.top1_drop is not None for c in result.candidates)
    columns: list[tuple[str, Any]] = [
        ("median ms", lambda c: _fmt(c.median_ms, ".2f")),
        ("vs fastest (95% CI)", lambda c: _interval(c.vs_fastest)),
        ("speedup", lambda c: _fmt(c.speedup, ".2f", "x")),
        ("of peak", lambda c: of_peak(c.peak_fraction)),
        ("build s", lambda c: _fmt(c.build_s, ".1f")),
        ("max abs err", lambda c: _fmt(c.max_abs_err, ".2g")),
        ("top-1 agr.", lambda c: _fmt(c.top1_agreement, ".4f")),
        *([("top-1 drop", lambda c: _fmt(c.top1_drop, "+.4f"))] if dropped else []),
    ]
    styles = {"chosen": "bold green", "accepted": "green", "rejected": "red", "failed": "red"}

    def build(left_out: set[str]) -> Table:
        tolerance = "each dtype's round-off" if result.budget.per_dtype else f"{result.budget.tolerance:g}"
        table = Table(title=f"candidates (tolerance {tolerance}" + _agreement(result.budget) + ")")
        table.add_column("candidate", no_wrap=True)
        shown = [(name, cell) for name, cell in columns if name not in left_out]
        for name, _ in shown:
            table.add_column(name, justify="right")
        table.add_column("verdict")
        for c in result.candidates:
            table.add_row(c.name, *(cell(c) for _, cell in shown), f"[{styles.get(c.status, '')}]{c.status}[/]")
        return table

    print_fitted(console, build, ["build s", "of peak", "speedup", "top-1 agr.", "max abs err"])
    for c in result.candidates:
        if c.reason:
            console.print(f"  {c.name}: {escape(c.reason)}")
    _print_beyond_peak(console, (c.peak_fraction for c in result.candidates))
    if result.bench is not None:
        _print_noise_warning(console, result.bench)  # the same line bench prints
    if result.bench is not None and result.bench.machine:
        console.print(f"[dim]machine: {escape(result.bench.machine)}[/]")
    timed = ", ".join(f"{stage} {value:.0f} s" for stage, value in result.seconds.items() if stage != "total")
    console.print(
        f"[dim]--auto took {result.seconds.get('total', 0):.0f} s ({timed}); every candidate was timed as "
        "its artifact, written and loaded back[/]"
    )
    if not result.output_dir:  # no load lines: they would name files that were not written
        console.print(f"chosen: [bold green]{result.chosen}[/]; nothing written (-o DIR writes it)")
        return
    console.print(f"chosen: [bold green]{result.chosen}[/]; wrote {result.output_dir} ({', '.join(result.files)})")
    # whole lines, never wrapped by rich: a comment wrapped onto a line of its own broke the pasted code (QA); each
    # runs pasted anywhere (its imports, absolute paths); report.json keeps them relative to the directory
    console.print(f"  load: {escape(result.load_with_fxforge)}", soft_wrap=True)
    console.print(f"  without fxforge: {escape(result.load_anywhere)}", soft_wrap=True)


def _interval(value: Any) -> str:
    if not value:
        return "-"
    median, low, high = value
    if low == high:  # too few rounds for an interval (bench.ratio_interval): the median alone
        return f"{median:.2f}x"
    return f"{median:.2f}x ({low:.2f}-{high:.2f})"


def _agreement(budget: Any) -> str:
    text = f", top-1 agreement >= {budget.min_agreement:g}" if budget.min_agreement is not None else ""
    return text + (f", top-1 drop <= {budget.max_drop:g}" if budget.max_drop is not None else "")


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def render_profile(console: Console, spec: str, report: Any, top: int, depth: int) -> None:
    """The hottest nodes, the module roll-up, and how the sum of node times compares with the whole model."""
    peak = report.peak
    gflops = ", ".join(f"{dtype} {value:.0f}" for dtype, value in peak.gflops.items())
    inputs = ", ".join(report.inputs)
    title = f"{escape(spec)}: {report.backend} backend, inputs {inputs}, median of {report.repeats} runs"
    table = Table(title=title, title_justify="left")
    table.add_column("node" if report.backend == "fx" else "module")
    table.add_column("target")
    for column in ("ms", "share", "GFLOP/s", "FLOP/byte", "alloc"):
        table.add_column(column, justify="right")
    table.add_column("bound (of its limit)")
    for node in report.top(top):
        bound = node.verdict
        table.add_row(
            Text(node.name),
            Text(node.target),
            f"{node.time_ms:.3f}",
            f"{node.share:.1%}",
            f"{node.gflops:.1f}" if node.flops else "-",
            f"{node.intensity:.1f}" if node.intensity else "-",
            byte_size(node.bytes) if node.bytes else "",
            bound,
        )
    console.print(table)
    modules = [m for m in report.modules if m.path.count(".") < depth]
    if modules:
        rollup = Table(title="Modules", title_justify="left")
        rollup.add_column("module")
        for column in ("nodes", "ms", "share", "FLOPs"):
            rollup.add_column(column, justify="right")
        for module in sorted(modules, key=lambda m: m.time_ms, reverse=True):
            rollup.add_row(
                Text(module.path),
                str(module.nodes),
                f"{module.time_ms:.3f}",
                f"{module.share:.1%}",
                human_count(module.flops),
            )
        console.print(rollup)
    console.print(
        f"[bold]Total[/]: {report.total_ms:.2f} ms summed over {len(report.nodes)} "
        f"{'nodes' if report.backend == 'fx' else 'leaf modules'}; the whole model unprofiled: "
        f"{report.whole_ms:.2f} ms (profiling overhead {report.overhead:+.0%})"
    )
    console.print(
        f"[dim]peak on this machine ({counted(peak.threads, 'thread')}): GFLOP/s {gflops}; "
        f"memory {peak.bandwidth_gbs:.1f} GB/s. "
        "compute-bound: FLOP/byte above peak FLOP/s over bandwidth; (%) of the peak it reached[/]"
    )
    for note in report.notes:
        console.print(f"[yellow]note:[/] {note}")
    if report.trace:
        console.print(f"trace written to {report.trace} (chrome://tracing, https://ui.perfetto.dev)")


_FEATURE_STYLE = {"available": "green", "missing-extra": "yellow", "unsupported-hardware": "red"}


def render_doctor(console: Console, report: Any) -> None:
    versions = ", ".join(f"{name} {version}" for name, version in report.versions.items() if version)
    missing = ", ".join(name for name, version in report.versions.items() if version is None)
    console.print(f"[bold]versions[/]: {versions}" + (f" (not installed: {missing})" if missing else ""))
    if report.version_warning:
        console.print(f"[yellow]{escape(report.version_warning)}[/]")
    cpu = report.cpu
    isa = cpu.torch_capability or "unknown"
    console.print(f"[bold]cpu[/]: {cpu.model}; {counted(cpu.cores, 'CPU')}; torch ISA {isa}")
    console.print(f"  features: {' '.join(cpu.features) or 'none of the ones that matter'}")
    backends = report.backends
    console.print(
        f"[bold]torch[/]: {counted(backends['threads'], 'thread')} ({backends['interop_threads']} inter-op), oneDNN "
        f"{'yes' if backends['mkldnn'] else 'no'}, quantized engines {', '.join(backends['quantized_engines'])} "
        f"(current {backends['quantized_engine']})"
    )
    gpu_text = "; ".join(f"{g['name']} ({g['memory_gib']} GiB, sm {g['capability']})" for g in report.gpus) or "none"
    console.print(f"[bold]gpus[/]: {gpu_text}")
    if report.peak is not None:
        gflops = ", ".join(f"{dtype} {value:,.0f}" for dtype, value in report.peak.gflops.items())
        console.print(
            f"[bold]peak[/] ({counted(report.peak.threads, 'thread')}, {report.peak.seconds:.1f} s): "
            f"matmul GFLOP/s {gflops}; "
            f"memory copy {report.peak.bandwidth_gbs:.1f} GB/s"
        )
        for note in report.peak.notes:
            console.print(f"  [dim]{escape(note)}[/]")
        _print_noise_warning(console, report)  # the line bench prints
    table = Table(title="features", title_justify="left")
    table.add_column("feature")
    table.add_column("status")
    table.add_column("why not")
    for feature, state in report.features.items():
        table.add_row(feature, f"[{_FEATURE_STYLE.get(state, '')}]{state}[/]", report.reasons.get(feature, ""))
    console.print(table)


def render_debug(console: Console, spec: str, report: Any) -> None:
    # a case the model raised on ran no module to its end: it is not one of those found clean
    ran = len(report.cases) - len(report.errors)
    cases = counted(ran, "case") + (f"; it raised on {len(report.errors)} more" if report.errors else "")
    if report.nan is not None:
        found = report.nan
        console.print(Text.assemble(("NaN/Inf: ", "bold red"), found.describe()))
        out = found.output
        console.print(f"  output {'x'.join(map(str, out.shape))} {out.dtype}: {out.nan} NaN, {out.inf} Inf")
        for index, value in enumerate(found.inputs):
            span = "" if value.min is None else f", finite values in [{value.min:.4g}, {value.max:.4g}]"
            shape = "x".join(map(str, value.shape))
            console.print(f"  input {index}: {shape} {value.dtype}: {value.nan} NaN, {value.inf} Inf{span}")
    elif report.cases:
        console.print(
            f"{escape(spec)}: [green]no NaN or Inf[/] in any module's output ({report.modules} modules, {cases})"
        )
    if report.stats:
        table = Table(title=f"Activation statistics ({cases})", title_justify="left")
        table.add_column("module")
        for column in ("calls", "min", "max", "mean", "std", "zeros", "NaN", "Inf"):
            table.add_column(column, justify="right")
        for name, stats in report.stats.items():
            if not stats.calls:
                continue
            table.add_row(
                Text(name or "<root>"),
                str(stats.calls),
                _fmt(stats.min, ".4g"),
                _fmt(stats.max, ".4g"),
                _fmt(stats.mean, ".4g"),
                _fmt(stats.std, ".4g"),
                "-" if stats.zero_fraction is None else f"{stats.zero_fraction:.1%}",
                str(stats.nan_count),
                str(stats.inf_count),
            )
        console.print(table)
    for error in report.errors:
        console.print(f"[yellow]the model raised on[/] {error}")


def _cost_text(value: float, balance: str) -> str:
    if balance == "time":
        return f"{value:.2f} ms"
    if balance == "flops":
        return human_count(value)
    return byte_size(value)


def _tensors_text(tensors: list[Any]) -> str:
    return ", ".join(f"{t.name} {'x'.join(map(str, t.shape)) or 'scalar'} {t.dtype}" for t in tensors)


def render_split(console: Console, spec: str, capture: dict[str, Any], result: Any) -> None:
    """The split plan: a row per stage, a row per cut (what crosses it), the balance, verification, files."""
    plan = result.plan
    render_capture(console, spec, capture)
    table = Table(title=f"{len(plan.stages)} stage{'s' if len(plan.stages) != 1 else ''}, balanced by {plan.balance}")
    table.add_column("stage", justify="right")
    table.add_column("nodes", justify="right")
    table.add_column("modules (first .. last)")
    for column in ("params", "weights", "FLOPs", "activations", "receives", "memory", "cost"):
        table.add_column(column, justify="right")
    if plan.balance == "time":
        table.add_column("time", justify="right")
    for stage in plan.stages:
        span = f"{stage.first_module or stage.first_node} .. {stage.last_module or stage.last_node}"
        share = f"{stage.cost / plan.total_cost:.1%}" if plan.total_cost else "-"
        row = [
            str(stage.index),
            str(stage.nodes),
            span,
            human_count(stage.params),
            byte_size(stage.param_bytes),
            human_count(stage.flops),
            byte_size(stage.activation_bytes),
            byte_size(stage.input_bytes),
            byte_size(stage.memory_bytes),
            share,
        ]
        if plan.balance == "time":
            row.append(f"{stage.time_ms:.2f} ms" if stage.time_ms is not None else "-")
        table.add_row(*row)
    console.print(table)
    if plan.cuts:
        cuts = Table(title="Cuts: tensors sent from one stage to the next (per microbatch)")
        for column in ("cut", "after .. before", "tensors", "bytes", "torch split_spec"):
            cuts.add_column(column, justify="right" if column in ("cut", "bytes") else "left")
        for cut in plan.cuts:
            point = "[dim]inside a call[/]"
            if cut.split_spec:
                point = ", ".join(f"{k}: {v}" for k, v in cut.split_spec.items())
            cuts.add_row(
                f"{cut.after_stage}|{cut.after_stage + 1}",
                f"{cut.after_node} .. {cut.before_node}",
                _tensors_text(cut.tensors),
                byte_size(cut.bytes),
                point,
            )
        console.print(cuts)
    console.print(
        f"[bold]imbalance[/] {plan.imbalance:.3f} (largest stage {_cost_text(plan.bottleneck, plan.balance)} / mean "
        f"{_cost_text(plan.total_cost / len(plan.stages), plan.balance)}), {byte_size(plan.crossing_bytes)} cross "
        f"the cuts; {plan.nodes} nodes planned in {plan.plan_s:.2f} s"
    )
    if plan.cuts:
        inside = [cut for cut in plan.cuts if cut.split_spec is None]
        if plan.split_spec is not None:
            entries = ", ".join(f'"{k}": SplitPoint.{v}' for k, v in plan.split_spec.items())
            console.print(f"torch.distributed.pipelining.pipeline(model, mb_args, split_spec={{{entries}}})")
        elif inside:
            console.print(
                f"[dim]{len(inside)} cut{' falls' if len(inside) == 1 else 's fall'} inside a module call: "
                f"pipe_split() {inside[0].pipe_split}[/]"
            )
        else:
            console.print("[dim]two cuts fall on one module: no single split_spec; see each cut's pipe_split[/]")
    verification = result.verification
    if verification is not None:
        if verification.ok:
            count = len(plan.stages)
            what = "the single stage matches" if count == 1 else f"the {count} stages chained in one process match"
            console.print(
                f"  [green]verified[/]: {what} the model on "
                f"{verification.describe_inputs()} (max abs err {verification.max_abs_err:.3g}{_within(verification)})"
            )
            render_verify_doubts(console, verification)
        else:
            problems = "; ".join(verification.problems[:2])
            console.print(f"  [bold red]MISMATCH[/]: the chained stages differ from the model: {problems}")
    elif result.stages is not None:  # stage modules that were not compared with the model: said, not left out
        console.print("  [yellow]not verified[/] (--no-verify): the stages were not compared with the model")
    for note in plan.notes:
        console.print(f"  [dim]note: {note}[/]")
    if result.directory:
        console.print(f"wrote {result.directory}/: {', '.join(result.files)}")


def _ratio(value: float) -> str:
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.2g}x"


def render_pipeline_run(console: Console, run: Any) -> None:
    """run-pipeline: how it ran, throughput per schedule next to one process, and the output check."""
    stages = f"{run.stages} stage{'s' if run.stages != 1 else ''}"
    processes = f"{run.stages} process{'es' if run.stages != 1 else ''}"
    console.print(
        f"[bold]{run.directory}[/]: {stages} as {processes} ({run.backend} on {run.device}, "
        f"{run.threads} thread{'s' if run.threads != 1 else ''} each); batch {run.batch} = {run.microbatches} "
        f"microbatches ({', '.join(run.inputs)})"
    )
    runs = len(run.schedules[0].times_s) if run.schedules else 0
    table = Table(title=f"Throughput, median of {runs} run{'s' if runs != 1 else ''}")
    for column in ("run", "ms per batch", "samples/s", "vs best one-process"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for timing in run.schedules:
        speedup = _ratio(timing.speedup) if timing.speedup is not None else "-"
        table.add_row(
            f"pipeline, {timing.schedule}", f"{timing.median_s * 1000:.1f}", f"{timing.samples_per_s:.1f}", speedup
        )
    best = min((b.median_s for b in run.baselines), default=None)
    for base in run.baselines:
        how = ", once per microbatch" if base.per_microbatch else ""
        if run.device != "cpu":  # the unsplit model is timed in this process, on the CPU
            how += ", CPU"
        table.add_row(
            f"one process, unsplit ({base.threads} thread{'s' if base.threads != 1 else ''}{how})",
            f"{base.median_s * 1000:.1f}",
            f"{base.samples_per_s:.1f}",
            _ratio(best / base.median_s) if best else "-",
        )
    console.print(table)
    check = run.check
    if check is not None:
        if check.ok:
            console.print(
                f"  [green]verified[/]: the pipeline's output matches the unsplit model ({check.reference}) on this "
                f"batch (max abs err {check.max_abs_err:.3g}, max rel err {check.max_rel_err:.3g})"
            )
        else:
            console.print(f"  [bold red]MISMATCH[/]: the pipeline's output differs from {check.reference}")
            for problem in check.problems[:3]:
                console.print(f"    {problem}")
    for note in run.notes:
        console.print(f"  [dim]note: {note}[/]")
    console.print(f"  [dim]{run.wall_s:.1f} s in all (process start-up, loading, every run)[/]")


def page_node_counts(model: dict[str, Any]) -> dict[str, int]:
    """The nodes a graph page draws and those it keeps in the details only (weights, torch.export's checks), as the
    line ``render_page`` prints and the commands' ``--json`` both count them."""
    hidden = sum(1 for n in model.get("nodes", []) if n.get("h"))
    return {"nodes": len(model.get("nodes", [])) - hidden, "hidden_nodes": hidden}


def render_page(console: Console, view: Any) -> None:
    """``fxforge graph`` / ``fxforge report``: what was written, in one line (the page holds the rest)."""
    model = view.model or {}
    nodes = page_node_counts(model)["nodes"]
    counts = model.get("counts")
    diff = ""
    if counts:
        diff = f"; {counts['changed']} changed, {counts['inserted']} inserted, {counts['removed']} removed"
    divergence = model.get("divergence")
    first = f"; first divergence at {divergence['node']}" if divergence else ""
    size = byte_size(len(view.html.encode()) if view.html else 0)
    modules = sum(1 for m in model.get("modules", []) if not m.get("g"))  # "g": a box of consecutive nodes
    console.print(
        f"wrote {escape(str(view.path))} ({nodes} nodes, {counted(modules, 'module')}, opens at depth "
        f"{model.get('depth', 0)}{diff}{first}; {size})",
        highlight=False,
        soft_wrap=True,
    )
    for failure in view.failures:  # a report's failed verification, which its page shows too (exit code 1)
        console.print(f"[bold red]{escape(failure)}[/]", highlight=False, soft_wrap=True)
