"""Makes the README's pictures (docs/images/*.png): a report and a diff of resnet18, shot in headless Chromium."""

from __future__ import annotations

import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import fxforge  # noqa: E402
from browser_helpers import PageRecord, browser, open_page  # noqa: E402


def main() -> None:
    warnings.simplefilter("ignore")
    captured = fxforge.prepare("torchvision:resnet18", ["1x3x64x64"])
    work = Path(tempfile.mkdtemp())
    fxforge.report(captured, work / "report.html", passes=["fold_bn"], spec="torchvision:resnet18")
    fxforge.diff_html(
        captured,
        fxforge.optimize(captured, ["fold_bn"], verify=True),
        work / "diff.html",
        title="torchvision:resnet18 after fold_bn",
        depth=3,
    )
    with browser() as context:
        page = open_page(context, work / "report.html", PageRecord())
        page.set_viewport_size({"width": 1400, "height": 1000})
        page.screenshot(path=str(ROOT / "docs" / "images" / "report.png"))
        page = open_page(context, work / "diff.html", PageRecord())
        page.evaluate("window.fxgraph.select('layer1_0_conv1')")
        page.wait_for_timeout(500)
        page.screenshot(path=str(ROOT / "docs" / "images" / "diff.png"))


if __name__ == "__main__":
    main()
