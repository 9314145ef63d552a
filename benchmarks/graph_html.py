"""How the graph page scales: time to write it, its size, and time to open it in a browser, by node count.

Builds synthetic models whose captured graphs have about 1k, 10k and 30k nodes and writes each one's page
with :func:`fxforge.graph_html`, timing the stages separately (best of ``--repeat``):

* ``inspect`` and ``lint``: what the page shows on its nodes (shapes, FLOPs, findings);
* ``model``: :func:`fxforge.visual.graph_model` given those reports (nodes, edges, modules, source lines);
* ``page``: the self-contained HTML (the model as JSON and the inlined scripts: ELK and the viewer);
* ``graph_html``: all of it end to end, written to a file -- what ``fxforge graph`` spends after capture.

Then (with Chromium and Playwright, as the browser tests use them) opens each page from ``file://`` and
measures the time until the viewer reports ready (its own clock, ``performance.now()`` from parse to drawn),
the wall time from navigation, the boxes drawn, the time to open one module, and -- up to ``--full-limit``
nodes -- the time to lay out each depth between the opening one and the deepest, and every module open.

Three synthetic models:

* ``layers``: a transformer-like stack of ``Layer`` modules (layer norm, attention with q/k/v/o linears,
  softmax, an MLP): 16 nodes and 10 modules per layer, nested 3 deep, as real models are; the page opens
  collapsed at the depth that keeps about 220 boxes on screen;
* ``flat``: one ``forward`` with a loop of elementwise ops, no submodules -- nothing to collapse: the page
  draws boxes of 100 consecutive nodes instead (boxes of boxes above 10k nodes);
* ``loop``: a ``ModuleList`` of linears looped over with work between the layers (``x = relu(layer(x)) + 1``):
  3 nodes per step, the list left and re-entered at each one, so it is drawn without a box and its linears
  are boxed with the relus and adds around them. Boxed on their own, they made ELK take 44 s at depth 1 of
  the 3k-node page.

Not part of the test suite::

    .venv/bin/python benchmarks/graph_html.py                       # layers, flat and loop; 1k, 10k, 30k nodes
    .venv/bin/python benchmarks/graph_html.py --sizes 3000 --models loop
    .venv/bin/python benchmarks/graph_html.py --sizes 1000 10000 --models layers --json
    .venv/bin/python benchmarks/graph_html.py --no-browser           # writing only
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fxforge.capture import capture  # noqa: E402
from fxforge.inspect import inspect_graph  # noqa: E402
from fxforge.lint import lint  # noqa: E402
from fxforge.machine import describe  # noqa: E402
from fxforge.visual import graph_html, graph_model  # noqa: E402
from fxforge.visual.graph import visible_count  # noqa: E402
from fxforge.visual.page import graph_document  # noqa: E402

WIDTH = 8
_NODES_PER_LAYER = 16  # norm1, q, k, v, transpose, matmul, softmax, matmul, o, add, norm2, up, act, down, add, + 1
_FIXED_NODES = 4  # placeholder, embed, head, output


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(WIDTH, WIDTH) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(self.q(x), self.k(x).transpose(-1, -2))
        return self.o(torch.matmul(scores.softmax(-1), self.v(x)))


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.act, self.down = nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = nn.LayerNorm(WIDTH), Attention(), nn.LayerNorm(WIDTH), Mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Layers(nn.Module):
    def __init__(self, count: int) -> None:
        super().__init__()
        self.embed = nn.Linear(WIDTH, WIDTH)
        self.layers = nn.ModuleList(Layer() for _ in range(count))
        self.head = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class Loop(nn.Module):
    """A ModuleList looped over with work of the loop's own between the layers."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(count))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x)) + 1
        return x


class Flat(nn.Module):
    def __init__(self, length: int) -> None:
        super().__init__()
        self.length = length

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.length):
            x = x + 0.5 if i % 3 == 0 else (x * 0.5 if i % 3 == 1 else torch.relu(x))
        return x


def build(kind: str, nodes: int) -> nn.Module:
    if kind == "layers":
        return Layers(max(1, (nodes - _FIXED_NODES) // (_NODES_PER_LAYER - 1))).eval()
    if kind == "loop":
        return Loop(max(1, (nodes - 2) // 3)).eval()
    return Flat(max(1, nodes - 2)).eval()


def best_of(repeat: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


@dataclass
class Row:
    model: str
    nodes: int
    modules: int
    drawn_at_open: int  # boxes on screen when the page opens (default depth)
    depth: int
    inspect_s: float
    lint_s: float
    model_s: float
    page_s: float
    graph_html_s: float  # end to end, written to a file
    mb: float
    bytes_per_node: float
    ready_ms: float | None = None  # the viewer's own clock: JSON parsed, laid out by ELK, drawn
    open_wall_s: float | None = None  # navigation to ready, as the user waits
    expand_one_s: float | None = None  # open one collapsed module (re-layout of what is visible)
    middle_s: dict[int, float] | None = None  # each depth between the opening one and the deepest (--full-limit)
    all_open_s: float | None = None  # every module open (up to --full-limit nodes)
    all_open_drawn: int | None = None


def write_page(kind: str, target: int, repeat: int, folder: Path) -> tuple[Row, Path, dict[str, Any]]:
    model = build(kind, target)
    captured = capture(model, (torch.randn(2, 4, WIDTH),), method="symbolic_trace", check=False)
    inspect_s, report = best_of(repeat, lambda: inspect_graph(captured, depth=0, include_code=False))
    lint_s, findings = best_of(repeat, lambda: lint(captured))
    model_s, data = best_of(repeat, lambda: graph_model(captured, report=report, lint_report=findings))
    page_s, html = best_of(repeat, lambda: graph_document(data, kind))
    path = folder / f"{kind}_{target}.html"
    total_s, _ = best_of(repeat, lambda: graph_html(captured, path, title=kind, force=True))  # rewritten each run
    nodes = sum(1 for n in data["nodes"] if not n.get("h"))
    size = path.stat().st_size
    row = Row(
        kind,
        nodes,
        len(data["modules"]),
        visible_count(data, data["depth"]),
        data["depth"],
        inspect_s,
        lint_s,
        model_s,
        page_s,
        total_s,
        size / 1e6,
        size / nodes,
    )
    assert len(html) > 0
    return row, path, data


def measure_in_browser(rows: list[tuple[Row, Path, dict[str, Any]]], full_limit: int, console: Console) -> str:
    from browser_helpers import PageRecord, browser, chromium_path, open_page

    with browser() as context:
        version = context.browser.version if context.browser is not None else ""
        for row, path, data in rows:
            console.print(f"[dim]browser: {row.model} {row.nodes} nodes ...[/]")
            record = PageRecord()
            start = time.perf_counter()
            page = open_page(context, path, record, timeout_ms=600_000)
            row.open_wall_s = time.perf_counter() - start
            row.ready_ms = page.evaluate("window.fxgraphReadyMs")
            assert not record.console_errors and not record.requests, (record.console_errors, record.requests)
            closed = [m["path"] for m in data["modules"] if m["depth"] == data["depth"] + 1]
            if closed:
                start = time.perf_counter()
                page.evaluate(f"window.fxgraph.expand({json.dumps(closed[len(closed) // 2])}).then(() => 1)")
                row.expand_one_s = time.perf_counter() - start
            deepest = max((m["depth"] for m in data["modules"]), default=0)
            if row.nodes <= full_limit:
                row.middle_s = {}
                for depth in range(data["depth"] + 1, deepest):
                    start = time.perf_counter()
                    page.evaluate(f"window.fxgraph.setDepth({depth}).then(() => 1)")
                    row.middle_s[depth] = time.perf_counter() - start
            if row.nodes <= full_limit and deepest > data["depth"]:
                start = time.perf_counter()
                page.evaluate(f"window.fxgraph.setDepth({deepest}).then(() => 1)")
                row.all_open_s = time.perf_counter() - start
                row.all_open_drawn = page.locator("#fxg-graph g.node").count()
            page.close()
    return f"Chromium {version or '?'} ({chromium_path()})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 30_000], help="target node counts")
    models = ["layers", "flat", "loop"]
    parser.add_argument("--models", nargs="+", choices=models, default=models)
    parser.add_argument("--repeat", type=int, default=3, help="best of N up to 10k nodes (one run above)")
    parser.add_argument("--full-limit", type=int, default=10_000, help="open each depth up to this many nodes")
    parser.add_argument("--no-browser", action="store_true", help="only write the pages")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console(stderr=True, highlight=False)
    machine = describe()
    load_before = os.getloadavg()[0]
    folder = Path(tempfile.mkdtemp(prefix="fxforge-graph-bench-"))
    # the first inspect imports torch._dynamo's FLOP counter (about 1.5 s): once, before timing
    write_page("layers", 100, 1, folder)

    written = []
    for kind in args.models:
        for size in args.sizes:
            if not args.json:
                console.print(f"[dim]{kind} ~{size} nodes ...[/]")
            written.append(write_page(kind, size, args.repeat if size <= 10_000 else 1, folder))
    browser_line = "browser: not measured"
    if not args.no_browser:
        from browser_helpers import missing_reason

        reason = missing_reason()
        if reason is None:
            browser_line = measure_in_browser(written, args.full_limit, console)
        else:
            browser_line = f"browser: not measured ({reason})"
    rows = [row for row, _, _ in written]
    load = f"load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    versions = f"python {platform.python_version()}, torch {torch.__version__}"
    with_git = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    commit = with_git.stdout.strip() or "?"

    if args.json:
        payload = {"machine": machine, "load": load, "browser": browser_line, "versions": versions, "commit": commit}
        print(json.dumps({**payload, "rows": [asdict(r) for r in rows]}, indent=2))
        return 0
    out = Console(highlight=False, width=160)
    out.print(f"graph page scaling  |  {machine}")
    out.print(f"{browser_line}; {versions}; fxforge at {commit}; {load}")
    table = Table(title="writing the page (seconds, best of 3 up to 10k nodes)")
    for column in ("model", "nodes", "modules", "inspect", "lint", "model", "page", "graph_html", "MB", "B/node"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for r in rows:
        table.add_row(
            r.model,
            f"{r.nodes:,}",
            f"{r.modules:,}",
            f"{r.inspect_s:.2f}",
            f"{r.lint_s:.2f}",
            f"{r.model_s:.2f}",
            f"{r.page_s:.2f}",
            f"{r.graph_html_s:.2f}",
            f"{r.mb:.1f}",
            f"{r.bytes_per_node:.0f}",
        )
    out.print(table)
    if any(r.ready_ms is not None for r in rows):
        table = Table(title="opening it in Chromium (one run)")
        for column in ("model", "nodes", "depth", "drawn", "ready (page clock)", "open (wall)", "open 1 module"):
            table.add_column(column, justify="left" if column == "model" else "right")
        table.add_column("middle depths", justify="right")
        table.add_column("all open (drawn)", justify="right")
        for r in rows:
            table.add_row(
                r.model,
                f"{r.nodes:,}",
                str(r.depth),
                f"{r.drawn_at_open:,}",
                f"{r.ready_ms / 1000:.2f} s" if r.ready_ms is not None else "-",
                f"{r.open_wall_s:.2f} s" if r.open_wall_s is not None else "-",
                f"{r.expand_one_s:.2f} s" if r.expand_one_s is not None else "-",
                ", ".join(f"{d}: {t:.2f} s" for d, t in r.middle_s.items()) if r.middle_s else "-",
                f"{r.all_open_s:.2f} s ({r.all_open_drawn:,})" if r.all_open_s is not None else "-",
            )
        out.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
