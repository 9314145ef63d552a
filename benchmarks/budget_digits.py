"""``optimize --auto`` under a real accuracy budget: torchvision resnet18 and mobilenet_v2 trained here on real data.

``peers.py`` has random weights and no real data, so its budget column is judged on random inputs, where a random
net's near-uniform logits make top-1 agreement a lottery. This script trains the torchvision architectures (10
classes) on scikit-learn's handwritten digits, the one labelled image set this machine has (8x8 images, upscaled to
224x224 with bilinear interpolation and repeated over 3 channels so that the nets run at their usual size), and runs
the same row as ``peers.py`` (every peer alone, ``--auto`` exact, ``--auto`` under a budget, interleaved) with the
budget judged on the 450 held-out digits: by default ``--max-drop 0.01`` (top-1 accuracy on their labels at most
one point below the float model's), or with ``--budget agreement=0.99`` the stricter ``--min-agreement 0.99`` (top-1
agreement with the float model, which bounds the drop by 1 point: a sample can only be lost where the two
disagree). ``--auto`` calibrates int8 on other digits than the held-out ones that judge it: its
``--calibration-data`` is ``--calibration-size`` digits drawn (seeded) from the training set, as a user would
calibrate on training data and judge on a validation set (``--calibration-size 0`` calibrates on the judging digits,
in-sample, as this script did before 2026-11-27).

After the row, the written budget artifact is loaded back with ``fxforge.load_model`` and its top-1 accuracy on the
held-out digits is measured next to the float model's.

Training: Adam (lr 1e-3), batches of 32, ``--epochs`` passes over the 1,347 training digits, seeded; the weights are
kept in ``--cache`` (``torch.save`` of the state dict, read back with ``weights_only=True``) so a second run skips it.

    .venv/bin/python benchmarks/budget_digits.py [--models resnet18,mobilenet_v2] [--batches 1,8] [--epochs 3]
        [--cache DIR] [--calibration-size 450] [--budget-seconds 40] [--budget drop=0.01|agreement=0.99]
        [--results FILE] [--json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torchvision
from torch import nn
from torch.nn import functional as F

import fxforge
from fxforge.auto import Budget
from fxforge.machine import cached_peak, describe

HERE = Path(__file__).resolve().parent
SIZE = 224


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


peers = _load("fxforge_bench_peers", HERE / "peers.py")
digits = _load("fxforge_examples_digits", HERE.parent / "examples" / "digits.py")


def digits_224() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The digits' train/test split (examples/digits.py) as 3x224x224 images, normalised to mean 0, std ~1."""
    x_train, y_train, x_test, y_test = digits.split()

    def grow(x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
        return ((x - 0.3) / 0.4).expand(-1, 3, -1, -1).contiguous()

    return grow(x_train), y_train, grow(x_test), y_test


def train(name: str, x: torch.Tensor, y: torch.Tensor, epochs: int, cache: Path) -> tuple[nn.Module, float]:
    """The torchvision architecture with 10 classes, trained on (x, y), or read from ``cache``; and seconds spent."""
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(num_classes=10)
    path = cache / f"{name}-digits-{SIZE}-e{epochs}.pt"
    if path.exists():
        model.load_state_dict(torch.load(path, weights_only=True))
        return model.eval(), 0.0
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    for epoch in range(epochs):
        order = torch.randperm(len(y), generator=generator)
        for first in range(0, len(y), 32):
            batch = order[first : first + 32]
            loss = F.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"  {name}: epoch {epoch + 1}/{epochs}, last loss {loss.item():.3f}", file=sys.stderr, flush=True)
    cache.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    return model.eval(), time.perf_counter() - start


def top1(module: Any, x: torch.Tensor, y: torch.Tensor, batch: int) -> float:
    """Top-1 accuracy of ``module`` on (x, y), run at the batch size it was built for (a compiled artifact may be
    specialised to it); a last partial batch is padded and the padding's predictions dropped."""
    correct = 0
    with torch.no_grad():
        for first in range(0, len(y), batch):
            chunk = x[first : first + batch]
            real = len(chunk)
            if real < batch:
                chunk = torch.cat([chunk, chunk[:1].expand(batch - real, -1, -1, -1)])
            output = module(chunk)
            logits = output[0] if isinstance(output, (tuple, list)) else output
            correct += int((logits[:real].argmax(1) == y[first : first + real]).sum())
    return correct / len(y)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,mobilenet_v2")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "fxforge-digits-weights"))
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument(
        "--calibration-size",
        type=int,
        default=450,
        help="training digits int8 is calibrated on (0: the held-out digits that judge it, in-sample)",
    )
    parser.add_argument("--budget-seconds", type=float, default=40.0)
    parser.add_argument("--results", default=None, help="JSON lines: each row appended as soon as it is measured")
    parser.add_argument(
        "--budget",
        default="drop=0.01",
        help="drop=0.01: top-1 accuracy on the held-out labels may fall by at most one point (--max-drop); "
        "agreement=0.99: top-1 agreement with float (--min-agreement)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    # what peers.run_one reads besides these
    args.quick, args.threads, args.budget_models = True, None, None

    threads = torch.get_num_threads()
    machine = describe(cached_peak(threads))
    print(f"machine: {machine}", file=sys.stderr, flush=True)
    x_train, y_train, x_test, y_test = digits_224()
    source = f"the {len(y_test)} held-out digits (scikit-learn), labelled"
    results = []
    with tempfile.TemporaryDirectory(prefix="fxforge-digits-") as scratch:
        workdir = Path(scratch)
        for name in args.models.split(","):
            model, train_s = train(name, x_train, y_train, args.epochs, Path(args.cache))
            float_top1 = top1(model, x_test, y_test, 64)
            print(f"{name}: float top-1 {float_top1:.4f} on {source}", file=sys.stderr, flush=True)
            trained = peers.Trained(
                model, (x_test, y_test), source, _budget(args), _calibration(x_train, args.calibration_size)
            )
            for batch in (int(b) for b in args.batches.split(",")):
                result = peers.run_one(name, batch, args, workdir, trained)
                budget_dir = workdir / f"{name}-b{batch}" / "auto-budget"
                accuracy: dict[str, Any] = {"float_top1": float_top1, "train_s": round(train_s, 1)}
                if budget_dir.exists():
                    artifact = fxforge.load_model(str(budget_dir), trust_pickle=True).module  # written by us
                    accuracy["budget_top1"] = top1(artifact, x_test, y_test, batch)
                    accuracy["drop_points"] = 100 * (float_top1 - accuracy["budget_top1"])
                result["digits"] = accuracy
                results.append(result)
                if args.results:
                    with open(args.results, "a") as file:
                        file.write(json.dumps({"machine": machine, "result": result}, default=str) + "\n")
    if args.json:
        print(json.dumps({"machine": machine, "results": results}, indent=2, default=str))
        return 0
    print(f"Machine: {machine}\n")
    print(markdown(results))
    return 0


def _calibration(x_train: torch.Tensor, size: int) -> torch.Tensor | None:
    """``size`` training digits, drawn with a fixed seed, for ``--calibration-data``; None for 0 (in-sample)."""
    if size <= 0:
        return None
    order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(1))
    return x_train[order[:size]].clone()


def _budget(args: argparse.Namespace) -> Budget:
    key, _, value = args.budget.partition("=")
    if key == "drop":
        return Budget(max_drop=float(value))
    if key == "agreement":
        return Budget(min_agreement=float(value))
    raise SystemExit(f"--budget: drop=X or agreement=X, not {args.budget!r}")


COLUMNS = (
    "model",
    "batch",
    "eager ms",
    "best exact peer",
    "of peak",
    "auto/best (95% CI)",
    "budget chose",
    "budget/best (95% CI)",
    "float top-1",
    "budget top-1",
    "drop (points)",
)


def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for result in results:
        accuracy = result["digits"]
        row = [
            result["model"],
            str(result["batch"]),
            f"{result['columns']['eager']['median_ms']:.2f}",
            result["best_peer"] or "-",
            peers._best_peak(result),
            peers._auto_cell(result, "auto"),
            peers._chosen(result, "auto-budget"),
            peers._auto_cell(result, "auto-budget"),
            f"{accuracy['float_top1']:.2%}",
            f"{accuracy['budget_top1']:.2%}" if "budget_top1" in accuracy else "-",
            f"{accuracy['drop_points']:.1f}" if "drop_points" in accuracy else "-",
        ]
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "best exact peer: the fastest of eager, eager+cl, fx, jit, compile, ort (peers.py); auto/best: --auto with no "
        "budget; budget: --auto under --budget (default --max-drop 0.01: at most one point of top-1 on the held-out "
        "labels) judged on the held-out digits (int8 calibrated on training digits unless --calibration-size 0), "
        "loaded back with fxforge.load_model; auto/best and budget/best: the median of the per-round ratios (the "
        "best exact peer's time over the artifact's in the same round) with its 95% bootstrap interval; top-1 on the "
        "held-out digits; drop: float top-1 minus the budget artifact's.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
