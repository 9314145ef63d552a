"""A graph in a notebook is small: its iframe carries ELK packed (gzip + base64, unpacked by the browser) rather than
1.6 MB of plain script, and still lays out and draws every node offline, with no request and no console error, in
a sandboxed srcdoc iframe (opaque origin) as Jupyter shows it. A saved page keeps the plain script and still works
from file://. Under CI the browser tests fail (never skip) when Chromium or Playwright is missing."""

from __future__ import annotations

import html
import re

import pytest
import torch
from torch import nn

import fxforge
from browser_helpers import PageRecord, browser, browser_or_skip, open_page
from fxforge.visual.page import CSP, NOTEBOOK_CSP, GraphView, asset, notebook_page, packed_elk

# what a small graph's notebook output may weigh: it is 0.69 MB (ELK packed: 0.64 MB of it); it was 1.8 MB
NOTEBOOK_BOUND = 800_000


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.b(torch.relu(self.a(x)))).softmax(-1)


@pytest.fixture(scope="module")
def view() -> GraphView:
    return fxforge.show(fxforge.capture(Small().eval(), (torch.randn(2, 8),)))


@pytest.fixture(scope="module")
def chromium():
    browser_or_skip()
    with browser() as context:
        yield context


def visible(view: GraphView) -> int:
    return sum(1 for n in view.model["nodes"] if not n.get("h"))


def srcdoc(notebook_html: str) -> str:
    """The page inside the notebook output's iframe."""
    found = re.search(r'<iframe srcdoc="([^"]*)"', notebook_html)
    assert found is not None
    return html.unescape(found.group(1))


def test_a_small_graph_in_a_notebook_is_small(view):
    output = view._repr_html_()
    assert len(output) < NOTEBOOK_BOUND, f"{len(output):,} characters"
    assert len(view.html) > 1_600_000  # the saved page keeps ELK as a plain script
    inner = srcdoc(output)
    assert asset("elk.bundled.js") not in inner and packed_elk() in inner
    assert f'content="{NOTEBOOK_CSP}"' in inner and f'content="{CSP}"' not in inner
    assert inner.count('id="fxg-model"') == 1 and asset("graphview.js") in inner  # the viewer stays inline


def test_packing_is_done_once_and_the_same_every_time(view):
    assert packed_elk() is packed_elk()  # cached: every graph of a notebook shares it
    assert view._repr_html_() == view._repr_html_()  # gzip's mtime is 0: no timestamp in the output
    assert notebook_page("<svg></svg>") == "<svg></svg>"  # a page without ELK is shown as it is


def test_the_notebook_policy_adds_only_blob_scripts():
    # still nothing from the network; blob: scripts are made by the page's own scripts (ELK unpacked)
    assert NOTEBOOK_CSP.startswith("default-src 'none';")
    assert NOTEBOOK_CSP.replace(" blob:", "", 1) == CSP
    assert "http" not in NOTEBOOK_CSP and "unsafe-eval" not in NOTEBOOK_CSP and "*" not in NOTEBOOK_CSP


def test_a_notebook_graph_lays_out_and_draws_every_node_in_a_sandboxed_iframe(chromium, view, tmp_path):
    # the notebook's output in a page of its own: the iframe is sandboxed (opaque origin) and holds the page as srcdoc
    path = tmp_path / "notebook.html"
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'></head><body>{view._repr_html_()}</body></html>")
    record = PageRecord()
    page = open_page(chromium, path, record)
    frame = next(f for f in page.frames if f is not page.main_frame)
    frame.wait_for_selector("body[data-ready='1'], #fxg-graph .fxg-error", timeout=30_000)
    errors = frame.locator("#fxg-graph .fxg-error")
    assert errors.count() == 0, errors.first.inner_text()
    assert frame.evaluate("typeof window.ELK") == "function"  # unpacked from the page, not fetched
    assert frame.locator("#fxg-graph g.node").count() == visible(view) >= 7
    assert record.console_errors == [] and record.requests == []


def test_a_saved_page_still_works_from_a_file(chromium, view, tmp_path):
    record = PageRecord()
    page = open_page(chromium, view.save(tmp_path / "small.html"), record)
    assert page.locator("#fxg-graph g.node").count() == visible(view)
    assert record.console_errors == [] and record.requests == []


def test_a_page_whose_elk_cannot_be_unpacked_says_so(chromium, view, tmp_path):
    # a browser without DecompressionStream (Firefox before 113): the viewer tells why, rather than a blank frame
    inner = srcdoc(view._repr_html_()).replace("<script>", "<script>window.DecompressionStream = undefined;", 1)
    path = tmp_path / "old.html"
    path.write_text(f'<iframe srcdoc="{html.escape(inner, quote=True)}" sandbox="allow-scripts"></iframe>')
    page = open_page(chromium, path, PageRecord())
    frame = next(f for f in page.frames if f is not page.main_frame)
    frame.wait_for_selector("#fxg-graph .fxg-error", timeout=30_000)
    assert "DecompressionStream" in frame.locator("#fxg-graph .fxg-error").inner_text()
