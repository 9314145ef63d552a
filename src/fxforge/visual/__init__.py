"""Pictures of graphs: interactive HTML pages (graph, before/after diff), static SVG, and the HTML report frame.

One module per concern: :mod:`.graph` (the graph model: nodes, edges, modules, with shapes, FLOPs, source
lines, lint findings, provenance, divergence and profile times), :mod:`.page` (self-contained pages, the
notebook view), :mod:`.render` (the API: :func:`graph_html`, :func:`diff_html`, :func:`graph_svg`,
:func:`show`), :mod:`.sections` (the report's tables and charts) and :mod:`.report_page` (the pages that
``optimize -o`` and ``quantize -o`` write). The layout engine is ELK (``assets/elk.bundled.js``, EPL-2.0,
licence in ``assets/ELK-LICENSE.md``); why ELK is in docs/commands/graph.md.
"""

from __future__ import annotations

from fxforge.visual.graph import diff_model, graph_model
from fxforge.visual.page import GraphView
from fxforge.visual.render import diff_html, graph_html, graph_svg, show

__all__ = ["GraphView", "diff_html", "diff_model", "graph_html", "graph_model", "graph_svg", "show"]
