"""Optimize: run a pass pipeline on a captured model, verify it, and write the result atomically.

The output directory holds everything needed to use the result with torch alone:

* ``model.pt`` -- the rewritten GraphModule, ``torch.save``d (torch dialect); reload with
  ``torch.load("model.pt", weights_only=False)``; or ``model.pt2`` -- a ``torch.export`` program
  (ATen dialect); reload with ``torch.export.load("model.pt2").module()``;
* ``optimized_model/`` -- ``GraphModule.to_folder`` source plus weights (torch dialect, when every submodule is
  serialisable that way), importable as a plain Python package;
* ``report.json`` -- capture record, change log per pass and the verification result;
* ``inputs.txt`` -- the example input specs, so ``fxforge verify`` and ``bench`` can reuse them;
* ``provenance.json`` -- node origins and producing passes, so ``verify`` can bisect after reloading.

The directory is built under a temporary name beside the target and renamed into place at the end:
a failed run leaves nothing behind, and an existing directory is replaced only with ``force``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import fx

from fxforge.capture import Captured, quiet_torch_logs
from fxforge.errors import FxforgeError
from fxforge.graphs import ATEN
from fxforge.inputs import specs_of
from fxforge.passes import ORIGIN, PASS
from fxforge.passes.pipeline import Pipeline, PipelineResult

MODEL_FILE = "model.pt"
PROGRAM_FILE = "model.pt2"
PACKAGE_DIR = "optimized_model"  # not "code": that would shadow the standard library module on import


@dataclass
class OptimizeResult:
    pipeline: PipelineResult
    output_dir: Path | None
    files: list[str]

    def to_dict(self) -> dict[str, Any]:
        data = self.pipeline.to_dict()
        data["ok"] = self.pipeline.ok
        data["output_dir"] = str(self.output_dir) if self.output_dir else None
        data["files"] = self.files
        return data


@contextlib.contextmanager
def atomic_directory(target: Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``target`` only if the block succeeds."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise FxforgeError(f"{target} exists and is not a directory")
    if target.exists() and any(target.iterdir()) and not force:
        raise FxforgeError(f"output directory {target} is not empty", hint="pass --force to replace it")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
        # mkdtemp makes it private (0700); the output should get the permissions of any directory the user makes.
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)
    except OSError as exc:
        raise FxforgeError(f"cannot write to {target.parent}: {exc.strerror}") from None
    try:
        yield staging
        if target.exists():
            backup = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.rename(target, backup)
            os.rename(staging, target)
            shutil.rmtree(backup, ignore_errors=True)
        else:
            os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def save_graph_module(
    gm: fx.GraphModule,
    directory: Path,
    example_inputs: Sequence[Any],
    dialect: str,
) -> list[str]:
    """Write ``gm`` into ``directory`` in the forms described in the module docstring."""
    files = []
    if dialect == ATEN:
        # The unlifted export module cannot be pickled; re-export the rewritten graph instead.
        with torch.no_grad(), quiet_torch_logs():
            program = torch.export.export(gm, tuple(example_inputs), strict=False)
        torch.export.save(program, str(directory / PROGRAM_FILE))
        files.append(PROGRAM_FILE)
    else:
        torch.save(gm, directory / MODEL_FILE)
        files.append(MODEL_FILE)
        try:
            with warnings.catch_warnings():
                # to_folder warns for every child it pickles instead of printing as source: expected here
                warnings.simplefilter("ignore")
                gm.to_folder(directory / PACKAGE_DIR, "OptimizedModel")
            _make_folder_relocatable(directory / PACKAGE_DIR)
            files.append(f"{PACKAGE_DIR}/")
        except Exception:  # modules to_folder cannot write as source: model.pt still holds everything
            shutil.rmtree(directory / PACKAGE_DIR, ignore_errors=True)
    provenance = {node.name: {"origin": node.meta.get(ORIGIN), "pass": node.meta.get(PASS)} for node in gm.graph.nodes}
    (directory / "provenance.json").write_text(json.dumps(provenance, indent=1))
    specs = specs_of([t for t in example_inputs if isinstance(t, torch.Tensor)])
    (directory / "inputs.txt").write_text("\n".join(str(s) for s in specs) + "\n")
    files += ["provenance.json", "inputs.txt"]
    return files


def _make_folder_relocatable(folder: Path) -> None:
    """Point ``to_folder``'s weight loads at the package's own directory.

    ``to_folder`` writes ``torch.load(r'<folder>/x.pt')`` with the path it was given -- here the staging
    directory, renamed away once the output is complete -- so the package would only import from there.
    """
    module = folder / "module.py"
    source = module.read_text()
    source = source.replace(f"r'{folder}/", "_HERE / r'")
    header = "import pathlib\n_HERE = pathlib.Path(__file__).resolve().parent\n"
    module.write_text(header + source)


def optimize(
    captured: Captured,
    passes: Sequence[Any] | Pipeline,
    *,
    output_dir: str | Path | None = None,
    verify: bool = False,
    force: bool = False,
    spec: str | None = None,
) -> OptimizeResult:
    """Run ``passes`` on a copy of ``captured`` and, if ``output_dir`` is given, write the result.

    With ``verify`` each pass is checked against the original model; when one fails, nothing is
    written and the result names the pass and the first diverging node.
    """
    pipeline = passes if isinstance(passes, Pipeline) else Pipeline(list(passes), verify_each=verify)
    if verify:
        pipeline.verify_each = True
    result = pipeline.run(captured)
    if output_dir is None or not result.ok:
        return OptimizeResult(result, None, [])
    output_dir = Path(output_dir)
    with atomic_directory(output_dir, force=force) as staging:
        files = save_graph_module(result.graph_module, staging, captured.example_inputs, captured.dialect)
        report = {"model": spec, "capture": captured.record.to_dict(), **result.to_dict()}
        (staging / "report.json").write_text(json.dumps(report, indent=2, default=str))
        files.append("report.json")
    return OptimizeResult(result, output_dir, files)


def load_provenance(gm: fx.GraphModule, directory: Path) -> None:
    """Restore node origins saved by :func:`save_graph_module` (pickling drops ``node.meta``)."""
    path = Path(directory) / "provenance.json"
    if not path.exists():
        return
    saved = json.loads(path.read_text())
    for node in gm.graph.nodes:
        entry = saved.get(node.name)
        if entry:
            if entry.get("origin"):
                node.meta[ORIGIN] = entry["origin"]
            if entry.get("pass"):
                node.meta[PASS] = entry["pass"]
