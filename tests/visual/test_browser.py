"""The pages in a real browser (headless Chromium driven by Playwright): no console errors, no network
request, one element per visible node, modules that open and close, lint findings that select their node,
screenshots that are not blank. Under CI these fail (never skip) when Chromium or Playwright is missing."""

from __future__ import annotations

import io
import time

import pytest

import fxforge
from browser_helpers import PageRecord, browser, browser_or_skip, open_page
from fxforge.visual.graph import visible_count


@pytest.fixture(scope="module")
def report_page(resnet_captures, tmp_path_factory):
    path = tmp_path_factory.mktemp("pages") / "report.html"
    view = fxforge.report(resnet_captures["torch"], path, passes=["fold_bn"], spec="torchvision:resnet18")
    return path, view.model


@pytest.fixture(scope="module")
def chromium():
    browser_or_skip()
    with browser() as context:
        yield context


def _wait_until(page, expression: str, expected, timeout_s: float = 20.0) -> None:
    """Poll ``expression`` (page.evaluate goes through the devtools protocol: the page's CSP forbids eval)."""
    deadline = time.monotonic() + timeout_s
    while page.evaluate(expression) != expected:
        assert time.monotonic() < deadline, f"{expression} never became {expected!r}"
        page.wait_for_timeout(50)


def _not_blank(png: bytes) -> bool:
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB").resize((200, 200))
    return len(set(image.get_flattened_data())) > 20


def test_report_page_works_offline_and_draws_every_node(chromium, report_page):
    path, model = report_page
    record = PageRecord()
    page = open_page(chromium, path, record)
    assert record.console_errors == [] and record.requests == []
    deepest = max(m["depth"] for m in model["modules"])
    page.evaluate(f"window.fxgraph.setDepth({deepest})")
    visible = sum(1 for n in model["nodes"] if not n.get("h"))
    assert page.locator("#fxg-graph g.node").count() == visible
    assert page.locator("#fxg-graph g.node.st-removed").count() == model["counts"]["removed"]
    assert _not_blank(page.locator("#fxg-graph").screenshot())
    assert record.console_errors == [] and record.requests == []


def test_expanding_a_module_shows_its_children(chromium, report_page):
    path, model = report_page
    page = open_page(chromium, path, PageRecord())
    page.evaluate("window.fxgraph.setDepth(0)")
    layer1 = next(i for i, m in enumerate(model["modules"]) if m["path"] == "layer1")
    children = [i for i, m in enumerate(model["modules"]) if m["parent"] == layer1]
    assert page.locator(f'g.node[data-k="m{layer1}"]').count() == 1
    assert all(page.locator(f'[data-k="m{c}"]').count() == 0 for c in children)
    page.locator("#graph").scroll_into_view_if_needed()
    page.locator(f'g.node[data-k="m{layer1}"] .toggle').dispatch_event("click")
    _wait_until(page, "window.fxgraph.isOpen('layer1')", True)
    page.wait_for_selector(f'g.node[data-k="m{children[0]}"]')
    assert all(page.locator(f'g.node[data-k="m{c}"]').count() == 1 for c in children)
    assert page.locator(f'g.mod[data-k="m{layer1}"]').count() == 1  # now drawn as an open box


def test_clicking_a_lint_finding_selects_its_node(chromium, report_page):
    path, model = report_page
    page = open_page(chromium, path, PageRecord())
    page.evaluate("window.fxgraph.setDepth(0)")
    finding = next(f for f in model["findings"] if f["node"] == "layer3_1_relu")
    node_index = next(i for i, n in enumerate(model["nodes"]) if n["n"] == finding["node"])
    page.locator(f'tr.fxr-finding[data-node="{finding["node"]}"]').first.click()
    _wait_until(page, "window.fxgraph.selected()", f"n{node_index}")
    assert page.locator(f'g.node.sel[data-k="n{node_index}"]').count() == 1
    assert page.locator(".fxg-side h3").inner_text() == finding["node"]
    assert finding["code"] in page.locator(".fxg-side").inner_text()


def test_search_and_source_line_in_details(chromium, report_page):
    path, _ = report_page
    page = open_page(chromium, path, PageRecord())
    page.fill(".fxg-search", "layer4_1_conv2")
    page.wait_for_selector(".fxg-results [data-go='layer4_1_conv2']")
    page.keyboard.press("Enter")
    _wait_until(page, "(document.querySelector('.fxg-side h3') || {}).textContent", "layer4_1_conv2")
    side = page.locator(".fxg-side").inner_text()
    assert "BasicBlock.forward" in side and "changed by pass fold_bn" in side


def test_broken_pass_page_opens_on_the_diverging_node(chromium, resnet_captures, broken_pass, tmp_path):
    result = fxforge.optimize(resnet_captures["torch"], [broken_pass], verify=True)
    view = fxforge.diff_html(resnet_captures["torch"], result, tmp_path / "diff.html")
    record = PageRecord()
    page = open_page(chromium, tmp_path / "diff.html", record)
    node = view.model["divergence"]["node"]
    index = next(i for i, n in enumerate(view.model["nodes"]) if n["n"] == node)
    _wait_until(page, "window.fxgraph.selected()", f"n{index}")
    assert page.locator(f'g.node.div[data-k="n{index}"]').count() == 1
    assert "First divergence" in page.locator(".fxg-side").inner_text()
    assert record.console_errors == [] and record.requests == []


def test_a_profiled_graph_colours_its_nodes_by_time(chromium, resnet_captures, tmp_path):
    captured = resnet_captures["torch"]
    names = [n.name for n in captured.graph_module.graph.nodes if n.op not in ("placeholder", "output")]
    times = {name: 0.01 for name in names} | {"conv1": 5.0, "layer4_1_conv2": 0.3}
    total = sum(times.values())
    profile = {
        "total_ms": total,
        "nodes": [{"name": name, "time_ms": ms, "share": ms / total} for name, ms in times.items()],
        "modules": [],
    }
    view = fxforge.report(captured, tmp_path / "hot.html", profile=profile, spec="resnet18 profiled")
    record = PageRecord()
    page = open_page(chromium, tmp_path / "hot.html", record)
    page.evaluate("window.fxgraph.setDepth(3)")
    _wait_until(page, "document.querySelectorAll('#fxg-graph g.node').length > 40", True)

    def fill(name: str) -> str:
        index = next(i for i, n in enumerate(view.model["nodes"]) if n["n"] == name)
        return page.locator(f'g.node[data-k="n{index}"] rect.box').evaluate("e => getComputedStyle(e).fill")

    assert fill("conv1") == "rgb(255, 105, 55)"  # over 12% of the time: the hottest colour
    red, green, blue = (int(c) for c in fill("layer1_0_relu")[4:-1].split(","))
    assert red == 255 and green > 230 and blue > 225  # a tenth of a percent: almost white
    assert fill("layer4_1_conv2") not in (fill("conv1"), fill("layer1_0_relu"))  # about 5%: in between
    assert "time share" in page.locator(".fxg-legend").inner_text()
    assert record.console_errors == [] and record.requests == []


def test_clicking_a_search_result_opens_and_selects_it(chromium, report_page):
    path, model = report_page
    record = PageRecord()
    page = open_page(chromium, path, record)
    page.evaluate("window.fxgraph.setDepth(0)")
    _wait_until(page, "window.fxgraph.isOpen('layer3')", False)
    page.locator(".fxg-search").press_sequentially("layer3.0.down")
    result = page.locator(".fxg-results [data-go='layer3.0.downsample']")
    result.wait_for()
    assert page.locator(".fxg-results [data-go]").count() >= 1
    result.click()
    module = next(i for i, m in enumerate(model["modules"]) if m["path"] == "layer3.0.downsample")
    _wait_until(page, "window.fxgraph.selected()", f"m{module}")
    assert page.evaluate("window.fxgraph.isOpen('layer3') && window.fxgraph.isOpen('layer3.0')")
    assert page.locator(f'g.node.sel[data-k="m{module}"]').count() == 1  # drawn (collapsed) and selected
    assert page.locator(".fxg-side h3").inner_text() == "layer3.0.downsample"
    assert not page.locator(".fxg-results").is_visible()
    # the details' expand button opens it: its conv and batch norm appear
    page.locator(".fxg-side button[data-toggle]").click()
    _wait_until(page, "window.fxgraph.isOpen('layer3.0.downsample')", True)
    page.wait_for_selector('g.node[data-k^="n"]:has(text:text-is("layer3_0_downsample_0"))')
    assert record.console_errors == [] and record.requests == []


@pytest.mark.slow
def test_a_flat_10k_node_graph_opens_in_seconds_as_boxes(chromium, tmp_path):
    """No module to collapse: boxes of 100 consecutive nodes are drawn instead, and open on a click."""
    import torch
    from test_graph_model import _Flat

    captured = fxforge.capture(_Flat(9_998), (torch.randn(2, 4),), method="symbolic_trace", check=False)
    start = time.perf_counter()
    view = fxforge.graph_html(captured, tmp_path / "flat.html")
    assert time.perf_counter() - start < 30  # about 3 s on the 2-core development machine
    record = PageRecord()
    page = open_page(chromium, tmp_path / "flat.html", record, timeout_ms=60_000)
    assert page.evaluate("window.fxgraphReadyMs") < 5000
    assert page.locator("#fxg-graph g.node").count() == 100
    box = next(i for i, m in enumerate(view.model["modules"]) if m["path"] == "nodes 4901-5000")
    page.evaluate("window.fxgraph.select('nodes 4901-5000').then(() => 1)")
    page.locator(f'g.node[data-k="m{box}"] .toggle').click()
    _wait_until(page, "window.fxgraph.isOpen('nodes 4901-5000')", True)
    _wait_until(page, "document.querySelectorAll('#fxg-graph g.node').length", 199)
    assert page.locator(f'g.mod[data-k="m{box}"]').count() == 1
    assert record.console_errors == [] and record.requests == []


def test_a_module_named_like_a_node_is_selected_from_search(chromium, tmp_path):
    """An nn.Sequential named ``relu`` beside a torch.relu call: each search result selects what it lists."""
    import torch

    class Collide(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.relu = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))

        def forward(self, x):
            return self.relu(torch.relu(x))

    captured = fxforge.capture(Collide(), (torch.randn(1, 4),), method="symbolic_trace", check=False)
    view = fxforge.graph_html(captured, tmp_path / "collide.html")
    module = next(i for i, m in enumerate(view.model["modules"]) if m["path"] == "relu")
    node = next(i for i, n in enumerate(view.model["nodes"]) if n["n"] == "relu")
    record = PageRecord()
    page = open_page(chromium, tmp_path / "collide.html", record)
    page.locator(".fxg-search").press_sequentially("relu")
    page.locator(".fxg-results [data-go='relu'][data-kind='module']").click()
    _wait_until(page, "window.fxgraph.selected()", f"m{module}")
    assert page.locator(".fxg-side h3").inner_text() == "relu"
    assert "Sequential" in page.locator(".fxg-side").inner_text()
    page.locator(".fxg-search").fill("")
    page.locator(".fxg-search").press_sequentially("relu")
    page.locator(".fxg-results [data-go='relu'][data-kind='node']").click()
    _wait_until(page, "window.fxgraph.selected()", f"n{node}")
    assert record.console_errors == [] and record.requests == []


def test_a_looped_module_list_is_drawn_in_boxes_of_the_nodes_around_it(chromium, tmp_path):
    """The linears of a ModuleList looped over with work between them sit in the boxes of consecutive nodes, with
    the relus and adds they alternate with: every node drawn at depth 1, the ModuleList itself no box at any depth,
    and its linears found by a search for it."""
    import torch
    from test_graph_model import _LoopOverLayers

    captured = fxforge.capture(_LoopOverLayers(150), (torch.randn(1, 4),), method="symbolic_trace", check=False)
    view = fxforge.graph_html(captured, tmp_path / "loop.html")
    model = view.model
    layers = next(i for i, m in enumerate(model["modules"]) if m["path"] == "layers")
    record = PageRecord()
    page = open_page(chromium, tmp_path / "loop.html", record)
    page.evaluate("window.fxgraph.setDepth(0).then(() => 1)")
    assert page.locator("#fxg-graph g.node").count() == visible_count(model, 0)
    assert page.locator(f'[data-k="m{layers}"]').count() == 0
    page.evaluate("window.fxgraph.setDepth(1).then(() => 1)")
    assert page.locator("#fxg-graph g.node").count() == sum(1 for n in model["nodes"] if not n.get("h"))
    linear = next(i for i, n in enumerate(model["nodes"]) if n["n"] == "layers_7")
    page.evaluate("window.fxgraph.setDepth(0).then(() => 1)")
    page.locator(".fxg-search").press_sequentially("layers")
    page.locator(".fxg-results [data-go='layers_7']").click()
    _wait_until(page, "window.fxgraph.selected()", f"n{linear}")
    assert "module\tlayers\n" in page.locator(".fxg-side").inner_text()  # the ModuleList it belongs to
    assert record.console_errors == [] and record.requests == []
