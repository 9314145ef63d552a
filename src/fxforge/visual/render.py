"""The picture API: a graph or a before/after diff as an interactive HTML page or an SVG file.

:func:`graph_html` and :func:`diff_html` return a :class:`~fxforge.visual.page.GraphView` (shown inline in
Jupyter) and write it when given a path; :func:`graph_svg` writes a static SVG of the graph with modules
open to a depth, laid out by the very same script (ELK) as the page, run in an embedded V8 (the
``mini-racer`` package, extra ``visual``).

What a diff is drawn from: an original (a :class:`~fxforge.capture.Captured` or GraphModule) and a
rewritten graph -- a GraphModule, or any result that holds one: an optimize result (``.pipeline``), a
pipeline result (``.graph_module`` and ``.steps``, whose per-pass graphs name the pass that removed each
node) or a quantize result (``.model``). This module sits below optimize and quantize (they write
``report.html`` with it), so it reads those results by their attributes rather than importing them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import fx

from fxforge.artifacts import PROVENANCE_FILE, REPORT_FILE
from fxforge.capture import Captured, capture, model_args_text
from fxforge.errors import FxforgeError, ModelSpecError, option, require, said
from fxforge.graphs import TORCH, dialect_of
from fxforge.inspect import InspectReport
from fxforge.lint import LintReport
from fxforge.verify import Divergence
from fxforge.visual.graph import diff_model, graph_model
from fxforge.visual.page import GraphView, asset, check_page_path, graph_document


def graph_html(
    target: Captured | fx.GraphModule,
    path: str | Path | None = None,
    *,
    depth: int | None = None,
    profile: Any = None,
    title: str = "",
    report: InspectReport | None = None,
    lint_report: LintReport | None = None,
    force: bool = False,
) -> GraphView:
    """The interactive page of ``target``'s graph, written to ``path`` when given.

    ``depth``: modules open when the page opens (default: as deep as keeps about 220 nodes on screen).
    ``profile``: ``fxforge profile``'s dict (or an object with ``to_dict()``): nodes coloured by time share.
    """
    model = graph_model(target, report=report, lint_report=lint_report, profile=profile, title=title)
    return _page(model, depth, title or "graph", path, force)


def _page(model: dict[str, Any], depth: int | None, title: str, path: str | Path | None, force: bool) -> GraphView:
    """The page of a graph or diff model, opened at ``depth`` when given, written to ``path`` when given."""
    if depth is not None:
        model["depth"] = depth
    view = GraphView(graph_document(model, title), model, title=title)
    if path is not None:
        view.save(path, force=force)
    return view


def load_output_dir(
    directory: str | Path,
    *,
    trust_pickle: bool | None = None,
    model: str | None = None,
    model_kwargs: Mapping[str, Any] | None = None,
) -> tuple[fx.GraphModule, list[str]]:
    """The rewritten graph of an ``fxforge optimize`` output directory (with its provenance) and its passes.

    ``model`` (and ``model_kwargs``, its constructor/config arguments): the model it is to be compared with; a
    directory whose ``report.json`` names another model, or the same model built with other arguments (another
    number of layers), is refused before anything is unpickled (a node-by-node diff of two models draws nonsense).

    A torch-dialect result is its ``model.pt`` (a pickle: it loads only with ``trust_pickle``); its
    ``model.pt2`` is an ATen re-export whose nodes do not match the captured graph's, so it cannot be diffed
    node for node.
    """
    from fxforge.models import load_model

    path = Path(directory)
    if not path.is_dir():
        raise ModelSpecError(f"{directory} is not a directory", hint="give an output directory of fxforge optimize -o")
    missing = [name for name in (PROVENANCE_FILE, REPORT_FILE) if not (path / name).is_file()]
    if missing:
        raise ModelSpecError(
            f"{directory} is not an fxforge optimize output (no {' or '.join(missing)})",
            hint="give a directory written by fxforge optimize -o",
        )
    try:
        saved = json.loads((path / REPORT_FILE).read_text())
        passes = [str(step["name"]) for step in saved.get("passes", [])]
        dialect = (saved.get("capture") or {}).get("dialect")
        written_with = (saved.get("capture") or {}).get("model_args")  # absent where written before it was recorded
        written_from = saved.get("model")
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ModelSpecError(f"{path / REPORT_FILE} is corrupt: {exc}") from None
    if isinstance(written_from, str) and model and not same_model_spec(written_from, model):
        raise ModelSpecError(
            f"{directory} was written from {written_from}, not {model}",
            hint=said(
                f"fxforge graph {written_from} --diff {directory}",
                f"fxforge.diff_html(fxforge.prepare({written_from!r}), {str(directory)!r})",
            ),
        )
    asked = model_args_text(model_kwargs)
    if isinstance(written_with, dict) and model and written_with != asked:
        raise ModelSpecError(
            f"{directory} was written from {written_from} built with {_listed(written_with)}, not {_listed(asked)}",
            hint="build the model with the arguments the directory was written from",
        )
    loaded = load_model(str(path), trust_pickle=trust_pickle)
    graph = loaded.module
    if not isinstance(graph, fx.GraphModule):
        raise ModelSpecError(f"{directory} holds no fx graph to compare ({type(graph).__name__})")
    if dialect == TORCH and dialect_of(graph) != TORCH:
        raise ModelSpecError(
            f"the rewritten torch-dialect graph of {directory} is its model.pt, a pickle",
            hint=f"pass {option('--trust-pickle', True)} if you trust the directory; model.pt2 is an ATen re-export "
            "whose nodes do not match the captured graph's",
        )
    return graph, passes


def _listed(model_args: Mapping[str, Any]) -> str:
    return " ".join(f"{option('--model-arg')} {k}={v}" for k, v in model_args.items()) or "no model arguments"


def same_model_spec(first: str, second: str) -> bool:
    """Whether two model specs name the same model: equal, or ``file.py:attr`` specs of the same file name and
    attribute (one written relative to another working directory)."""
    if first.strip() == second.strip():
        return True
    (file_a, _, attr_a), (file_b, _, attr_b) = first.strip().rpartition(":"), second.strip().rpartition(":")
    return file_a.endswith(".py") and attr_a == attr_b and Path(file_a).name == Path(file_b).name


def rewritten_graph(result: Any) -> tuple[fx.GraphModule, list[tuple[str, fx.GraphModule]], Divergence | None]:
    """(rewritten graph, per-pass graphs, first divergence) of a result or a GraphModule (see the module docstring)."""
    if isinstance(result, fx.GraphModule):
        return result, [], None
    pipeline = getattr(result, "pipeline", result)
    if hasattr(pipeline, "steps") and isinstance(getattr(pipeline, "graph_module", None), fx.GraphModule):
        steps, divergence, shown = [], None, pipeline.graph_module
        for step in pipeline.steps:
            check = step.verification
            if check is not None and not check.ok and divergence is None:
                divergence = check.divergence
                shown = step.result.graph_module  # the failing pass's graph: that is where the divergence is
            if not step.rolled_back or (check is not None and not check.ok):
                steps.append((step.result.name, step.result.graph_module))
        return shown, steps, divergence
    model = getattr(result, "model", None)
    if isinstance(model, fx.GraphModule):
        return model, [], None
    raise FxforgeError(f"cannot find a rewritten graph in {type(result).__name__}", hint="pass a GraphModule")


def _captured_in(captured: Captured, dialect: str) -> Captured | None:
    """``captured``'s model captured again in ``dialect``, from the same example; None where that fails."""
    method = "symbolic_trace" if dialect == TORCH else "export"
    try:
        return capture(
            captured.original, captured.example_inputs, example_kwargs=captured.example_kwargs, method=method
        )
    except FxforgeError:  # the refusal below says what to do
        return None


def diff_html(
    original: Captured | fx.GraphModule,
    rewritten: Any,
    path: str | Path | None = None,
    *,
    passes: Sequence[str] = (),
    divergence: Divergence | None = None,
    depth: int | None = None,
    profile: Any = None,
    title: str = "",
    force: bool = False,
    trust_pickle: bool | None = None,
    match_dialect: bool = True,
) -> GraphView:
    """The interactive page of ``rewritten`` overlaid on ``original``: removed, inserted and changed nodes
    coloured and labelled with the pass that made each change, the first diverging node of a failed
    verification highlighted (given, or found in a pipeline result). ``rewritten`` may also be an optimize
    output directory (:func:`load_output_dir`; its pickled ``model.pt`` loads with ``trust_pickle``, default the
    ``FXFORGE_TRUST_PICKLE`` environment variable). ``path`` is written only with a page's suffix (``.html``),
    an existing file only with ``force``. A ``Captured`` original in the other dialect than ``rewritten`` is
    captured again in its dialect unless ``match_dialect`` is False (then such a diff is refused)."""
    if path is not None:
        check_page_path(path, force=force)  # before loading and drawing
    if isinstance(rewritten, (str, Path)):
        rewritten, saved_passes = load_output_dir(rewritten, trust_pickle=trust_pickle)
        passes = list(passes) or saved_passes
    graph, steps, found = rewritten_graph(rewritten)
    original_dialect = dialect_of(original.graph_module if isinstance(original, Captured) else original)
    if original_dialect != dialect_of(graph) and isinstance(original, Captured) and match_dialect:
        # the model captured again as the rewritten graph was, as the CLI's graph --diff does (the API refused)
        original = _captured_in(original, dialect_of(graph)) or original
        original_dialect = dialect_of(original.graph_module)
    if original_dialect != dialect_of(graph):  # no node of one corresponds to a node of the other
        other = "export" if original_dialect == TORCH else "symbolic_trace"
        raise FxforgeError(
            f"the rewritten graph is in the {dialect_of(graph)} dialect, the original in the {original_dialect} "
            "dialect: a node-by-node diff needs both in one",
            hint=f"capture the original as the rewritten graph was ({option('--method', other)})",
        )
    mode = getattr(rewritten, "mode", None)
    if not passes and not steps and isinstance(mode, str) and not isinstance(rewritten, fx.GraphModule):
        passes = [f"quantize ({mode})"]  # a quantize result: torch's convert_fx records no provenance
    model = diff_model(
        original,
        graph,
        steps=steps,
        passes=passes,
        divergence=divergence or found,
        profile=profile,
        title=title,
    )
    return _page(model, depth, title or "diff", path, force)


_V8_LOCK = threading.Lock()


def svg_of(model: dict[str, Any], depth: int | None = None) -> str:
    """The SVG of a graph model with modules open to ``depth``, laid out by ELK in an embedded V8."""
    require("py_mini_racer", "visual", "writing SVG pictures")
    from py_mini_racer import MiniRacer

    with _V8_LOCK:
        context = MiniRacer()
        # ELK's bundle looks for a window and defers work with setTimeout; in V8 alone both are shims and the
        # deferred calls run at once (the layout is synchronous work behind a promise).
        context.eval(
            "var window = globalThis; var self = globalThis; globalThis.setTimeout = function (f) { f(); return 0; };"
        )
        context.eval(asset("elk.bundled.js"))
        context.eval(asset("graphview.js"))
        context.eval("var SVG_OUT = null, SVG_ERR = null;")
        call = (
            "FXG.renderSvg({}, {}, {}).then(function (s) {{ SVG_OUT = s; }}, function (e) {{ SVG_ERR = String(e); }});"
        )
        depth_arg = "null" if depth is None else str(int(depth))
        context.eval(
            call.format(
                json.dumps(json.dumps(model, default=str)), depth_arg, "true" if model.get("profile") else "false"
            )
        )
        error, svg = context.eval("SVG_ERR"), context.eval("SVG_OUT")
    if error or not svg:
        raise FxforgeError(f"the graph could not be laid out: {error or 'no result'}")
    return str(svg)


def graph_svg(
    target: Captured | fx.GraphModule | dict[str, Any],
    path: str | Path | None = None,
    *,
    depth: int | None = None,
    profile: Any = None,
    force: bool = False,
) -> str:
    """A static SVG picture of ``target`` (a graph, or a model from :func:`graph_model`/:func:`diff_model`)
    with modules open to ``depth``; written to ``path`` when given. Returns the SVG text."""
    from fxforge.visual.page import write_text

    model = target if isinstance(target, dict) else graph_model(target, profile=profile)
    svg = svg_of(model, depth)
    if path is not None:
        write_text(path, svg, force=force)
    return svg


def show(target: Any, *, depth: int | None = None, profile: Any = None) -> GraphView:
    """For notebooks: the graph of a Captured or GraphModule; the diff of an optimize result (from its ``captured``
    attribute); the quantized graph of a quantize result (its ``model``; ``diff_html(float_model, result)`` shows
    what quantization changed). The last line of a cell displays it."""
    if isinstance(target, (Captured, fx.GraphModule)):
        return graph_html(target, depth=depth, profile=profile)
    captured = getattr(target, "captured", None)
    if captured is not None:
        return diff_html(captured, target, depth=depth, profile=profile)
    model = getattr(target, "model", None)
    if isinstance(model, fx.GraphModule):  # QA: show(quantize_result) refused, as its docstring said it would draw
        return graph_html(model, depth=depth, profile=profile)
    raise FxforgeError(
        f"cannot draw a {type(target).__name__}",
        hint="pass a Captured, a GraphModule, an optimize result or a quantize result",
    )
