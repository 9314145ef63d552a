"""Self-contained HTML pages: the graph viewer and the report frame, with every script and style inlined.

A page works offline from ``file://`` and makes no network request: the layout engine (ELK, vendored in
``assets/`` with its licence), the viewer script and the graph model are embedded, and a Content
Security Policy (``default-src 'none'``) forbids the browser to fetch anything even if a script tried.
:class:`GraphView` is what the API returns: the page's HTML, written to a file with :meth:`GraphView.save`
and shown inline in Jupyter (``_repr_html_``, an iframe holding the page).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from fxforge.artifacts import StagedOutput, check_output_file
from fxforge.display import byte_size, counted, json_text, number
from fxforge.errors import FxforgeError

ASSETS = ("elk.bundled.js", "graphview.js", "graphpage.js")

# No network, ever: scripts and styles are inline, images are data: URIs, downloads are blob: URLs.
CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:"


@cache
def asset(name: str) -> str:
    """The text of a bundled asset (``assets/`` in the package)."""
    return resources.files("fxforge.visual").joinpath("assets", name).read_text(encoding="utf-8")


def script_json(data: Any) -> str:
    """JSON safe inside ``<script type="application/json">``: no ``</script>`` or ``<!--`` can end it early."""
    text = json_text(data, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def opening_depth(model: dict[str, Any]) -> int:
    """The depth a page opens at: the model's ``depth`` brought within 0 and its deepest module level. The page's
    depth menu offers only those levels (a deeper one showed a blank menu) and opening deeper changes nothing."""
    deepest = max((module["depth"] for module in model.get("modules", [])), default=0)
    return max(0, min(int(model["depth"]), deepest))


def document(title: str, subtitle: str, body: str, model: dict[str, Any] | None, extra_script: str = "") -> str:
    """A whole page: header, ``body`` (HTML), and -- with ``model`` -- the graph viewer's data and scripts.

    The model's ``depth`` is clamped in place (:func:`opening_depth`), so that what the caller prints or records
    about the page is the depth it opens at."""
    scripts = ""
    if model is not None:
        if "depth" in model:
            model["depth"] = opening_depth(model)
        scripts = f'<script type="application/json" id="fxg-model">{script_json(model)}</script>\n'
        scripts += "\n".join(f"<script>\n{asset(name)}\n</script>" for name in ASSETS)
    if extra_script:
        scripts += f"<script>\n{extra_script}\n</script>"
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{asset('page.css')}</style></head>\n<body>"
        f'<header class="fxg-top"><h1>{html.escape(title)}</h1><p>{html.escape(subtitle)}</p></header>'
        f"<main>{body}</main>\n{scripts}\n</body></html>\n"
    )


def graph_document(model: dict[str, Any], title: str, subtitle: str = "") -> str:
    """The page of one graph (or one diff): the viewer filling the window."""
    return document(title, subtitle or describe(model), '<div id="fxg-graph"></div>', model)


def describe(model: dict[str, Any]) -> str:
    """One line under a graph's title: dialect, counts, totals, diff counts, the profile that colours it."""
    visible = sum(1 for n in model["nodes"] if not n.get("h"))
    modules = sum(1 for m in model["modules"] if not m.get("g"))  # not the boxes of consecutive nodes
    counts = model.get("counts")
    # a diff draws the nodes of both graphs (removed ones too) and totals the rewritten one: said so
    drawn = f"{visible} nodes of both graphs" if counts else f"{visible} nodes"
    parts = [f"{model.get('dialect', '')} dialect", drawn, counted(modules, "module")]
    totals = model.get("totals") or {}
    after = "after the passes: " if counts else ""
    if totals.get("params") is not None:
        parts.append(f"{after}{totals['params']:,} parameters")
    if totals.get("flops"):
        # 110.66K FLOPs, not 0.000111 GFLOPs; a large model's 1.82G as before
        parts.append(f"{'' if totals.get('params') is not None else after}{number(totals['flops'])} FLOPs")
    if counts:
        parts.append(", ".join(f"{counts[k]} {k}" for k in ("changed", "inserted", "removed")))
    if model.get("divergence"):
        parts.append(f"first divergence at {model['divergence'].get('node')}")
    timed = model.get("profile")
    if timed:
        parts.append(f"coloured by time: {timed['matched']} nodes timed, {timed['total_ms']:.3g} ms in all")
    return " · ".join(parts)


HTML_SUFFIXES = (".html", ".htm")
PAGE_SUFFIXES = (*HTML_SUFFIXES, ".svg")


def check_page_path(path: str | Path, *, force: bool = False) -> Path:
    """``path`` as a page may be written there, checked before the work: a page's own suffix
    (:data:`PAGE_SUFFIXES`), not a directory, an existing file only with ``force``, a writable folder."""
    if Path(path).suffix.lower() not in PAGE_SUFFIXES:
        raise FxforgeError(f"cannot tell what to write from {str(path)!r}", hint="name it .html (interactive) or .svg")
    check_output_file(path, force=force)
    return Path(path)


def write_text(path: str | Path, text: str, *, force: bool = False) -> Path:
    """Write ``text`` to ``path`` atomically (never a half-written page); errors become one-line FxforgeErrors.
    Only a page's own names (:data:`PAGE_SUFFIXES`), and an existing file only with ``force``: a user's
    ``model.py`` given by mistake was replaced by a page."""
    target = check_page_path(path, force=force)
    with StagedOutput(target, force=force) as staged:
        try:
            staged.path.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise FxforgeError(f"cannot write {target}: {exc.strerror or exc}") from None
        staged.commit()
    return target


@dataclass
class GraphView:
    """A rendered page (graph, diff or report). In Jupyter the last line of a cell shows it inline."""

    html: str
    model: dict[str, Any] | None = None
    path: Path | None = None
    title: str = ""
    notes: list[str] = field(default_factory=list)
    # what a report found besides the graph, as data (for --json): the passes' verification, bench, quantize
    findings: dict[str, Any] = field(default_factory=dict)
    # one line for each check a report ran that failed (a verification): the page says so, and so must the exit code
    # (fxforge report exits 1 on any, as optimize --verify does), which a CI job reads rather than the page
    failures: list[str] = field(default_factory=list)

    def save(self, path: str | Path, *, force: bool = False) -> Path:
        self.path = write_text(path, self.html, force=force)
        return self.path

    def __repr__(self) -> str:
        nodes = sum(1 for n in self.model["nodes"] if not n.get("h")) if self.model else 0
        where = f", saved to {self.path}" if self.path else ""
        # in bytes as written, scaled to their size: an SVG of 15 KB read "0.0 MB" in megabytes
        size = byte_size(len(self.html.encode()))
        return f"<fxforge page {self.title!r}: {nodes} nodes, {size}{where}>"

    def _repr_html_(self) -> str:
        # An iframe: the page's scripts and styles stay inside it, and the notebook's stay out.
        return (
            f'<iframe srcdoc="{html.escape(self.html, quote=True)}" style="width:100%;height:720px;'
            'border:1px solid #e4e7eb;border-radius:6px" sandbox="allow-scripts allow-downloads"></iframe>'
        )
