"""Writes examples/tour.ipynb (unexecuted): the tour of fxforge on resnet18 that tests/visual runs with nbclient."""

from __future__ import annotations

from pathlib import Path

import nbformat

CELLS = [
    (
        "markdown",
        "# A tour of fxforge\nCapture, inspect, lint, fix, diff, verify, export and bench resnet18 "
        "(small inputs, 1x3x64x64, so the tour runs in seconds). The last line of each cell shows a table "
        "or a graph.",
    ),
    (
        "code",
        "import tempfile, warnings\nimport fxforge\nwarnings.simplefilter('ignore')\n"
        "work = tempfile.TemporaryDirectory(prefix='fxforge-tour-')  # the tour's files, removed at the end\n"
        "captured = fxforge.prepare('torchvision:resnet18', ['1x3x64x64'])\ncaptured",
    ),
    ("code", "fxforge.inspect_graph(captured)"),
    ("code", "findings = fxforge.lint(captured)\nfindings"),
    ("markdown", "Fix what lint found: fold the batch norms, verified after the pass."),
    ("code", "result = fxforge.optimize(captured, ['fold_bn', 'remove_dropout'], verify=True)\nresult"),
    ("markdown", "The graph, with modules you can open: click a node for its shape, FLOPs and source line."),
    ("code", "fxforge.show(captured)"),
    ("code", "fxforge.diff_html(captured, result)"),
    ("code", "fxforge.verify(captured, result.pipeline.graph_module)"),
    ("code", "fxforge.export_model(captured, to='pt2', path=f'{work.name}/resnet18.pt2')"),
    ("code", "fxforge.bench(captured, ['eager', 'fx'], warmup=1, repeats=5)"),
    ("markdown", "Remove the tour's files (47 MB of exported resnet18)."),
    ("code", "work.cleanup()"),
]


def main() -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_markdown_cell(text) if kind == "markdown" else nbformat.v4.new_code_cell(text)
        for kind, text in CELLS
    ]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, Path(__file__).resolve().parent.parent / "examples" / "tour.ipynb")


if __name__ == "__main__":
    main()
