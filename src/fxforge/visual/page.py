"""Self-contained HTML pages: the graph viewer and the report frame, with every script and style inlined.

A page works offline from ``file://`` and makes no network request: the layout engine (ELK, vendored in
``assets/`` with its licence), the viewer script and the graph model are embedded, and a Content
Security Policy (``default-src 'none'``) forbids the browser to fetch anything even if a script tried.
:class:`GraphView` is what the API returns: the page's HTML, written to a file with :meth:`GraphView.save`
and shown inline in Jupyter (``_repr_html_``, an iframe holding the page).

In a notebook the page is smaller: ELK (1.6 MB of script, most of any page) travels gzip-compressed and base64-encoded
(:func:`packed_elk`, 0.64 MB) and the browser unpacks it (``DecompressionStream``) into a ``blob:`` script, which the
notebook page's policy (:data:`NOTEBOOK_CSP`) adds to the inline scripts; nothing is fetched still. A saved page keeps
ELK as a plain script: it opens in any browser, also one without ``DecompressionStream``, under the strictest policy.
"""

from __future__ import annotations

import base64
import gzip
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
# A notebook's page also runs a blob: script: ELK, unpacked by the page itself (ELK_LOADER). A blob: URL can only be
# made by a script already running in the page, so this lets no new code in (remote scripts stay forbidden, as does
# every request). Not 'unsafe-eval' instead: that would let any script of the page turn any string into code.
NOTEBOOK_CSP = CSP.replace("script-src 'unsafe-inline'", "script-src 'unsafe-inline' blob:")

# Unpacks ELK (page.py's packed_elk) and runs it as a blob: script; window.fxgElk is the promise of the ELK class,
# which graphview.js's FXG.layout waits for. A browser that cannot unpack it says so in the page (the viewer shows
# why the graph could not be laid out) rather than drawing nothing.
ELK_LOADER = """(function () {
  "use strict";
  window.fxgElk = new Promise(function (resolve, reject) {
    if (typeof DecompressionStream === "undefined") {
      throw new Error("this browser cannot unpack the layout engine (no DecompressionStream: Chrome 80, " +
        "Firefox 113, Safari 16.4 or newer can); fxforge graph -o page.html writes a page any browser opens");
    }
    var text = atob(document.getElementById("fxg-elk").textContent);
    var bytes = new Uint8Array(text.length);
    for (var i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
    var unpacked = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    new Response(unpacked).blob().then(function (js) {
      var url = URL.createObjectURL(new Blob([js], { type: "text/javascript" }));
      var script = document.createElement("script");
      script.onload = function () {
        URL.revokeObjectURL(url);
        if (window.ELK) resolve(window.ELK); else reject(new Error("the layout engine did not load"));
      };
      script.onerror = function () { URL.revokeObjectURL(url); reject(new Error("the layout engine could not run")); };
      script.src = url;
      document.head.appendChild(script);
    }).catch(reject);
  });
})();"""


@cache
def asset(name: str) -> str:
    """The text of a bundled asset (``assets/`` in the package)."""
    return resources.files("fxforge.visual").joinpath("assets", name).read_text(encoding="utf-8")


@cache
def plain_elk() -> str:
    """ELK as a saved page holds it: one inline script, as :func:`document` writes each of :data:`ASSETS`."""
    return f"<script>\n{asset('elk.bundled.js')}\n</script>"


@cache
def packed_elk() -> str:
    """ELK as a notebook's page holds it: gzip (mtime 0, so the same bytes every time) in base64, and the script that
    unpacks and runs it (:data:`ELK_LOADER`). Made once a process: every graph of a notebook shares it."""
    packed = base64.b64encode(gzip.compress(asset("elk.bundled.js").encode(), compresslevel=9, mtime=0)).decode()
    return f'<script type="application/octet-stream" id="fxg-elk">{packed}</script>\n<script>\n{ELK_LOADER}\n</script>'


def csp_meta(policy: str) -> str:
    return f'<meta http-equiv="Content-Security-Policy" content="{policy}">'


def notebook_page(page: str) -> str:
    """``page`` as a notebook shows it: its inline ELK packed (:func:`packed_elk`) under :data:`NOTEBOOK_CSP`.
    A page without ELK (an SVG, a report without a graph) is returned as it is."""
    start = page.find(plain_elk()[:80])  # where ELK begins (a short search), then the whole of it compared
    if start < 0 or not page.startswith(plain_elk(), start):
        return page
    packed = page[:start] + packed_elk() + page[start + len(plain_elk()) :]
    return packed.replace(csp_meta(CSP), csp_meta(NOTEBOOK_CSP), 1)


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
        f"{csp_meta(CSP)}"
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
        # An iframe: the page's scripts and styles stay inside it, and the notebook's stay out. Its ELK is packed
        # (notebook_page): a graph in a notebook was 1.8 MB, whatever the model's size. Its border inside its 100%
        # width: 2 px wider than the card, it made the card scroll (QA).
        return (
            f'<iframe srcdoc="{html.escape(notebook_page(self.html), quote=True)}" style="width:100%;height:720px;'
            'border:1px solid #e4e7eb;border-radius:6px;box-sizing:border-box" '
            'sandbox="allow-scripts allow-downloads"></iframe>'
        )
