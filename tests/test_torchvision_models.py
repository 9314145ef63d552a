"""Capture and inspect every torchvision classification model.

Each model is captured on a small input where it allows one, and the captured graph must compute
what the model computes (fp32 tolerances of :func:`fxforge.verify.compare_outputs`); inspect must
count exactly the model's parameters. The very large models (see ``ON_META``) are built on the
``meta`` device instead: building and running them on 2 CPU cores would cost more than the rest of
the file together, so for them the test asserts capture and inspect totals, not numerics.
"""

from __future__ import annotations

import pytest
import torch

from fxforge.capture import capture
from fxforge.inputs import InputSpec, make_inputs
from fxforge.inspect import inspect_graph
from fxforge.models import load_model, torchvision_classification_models
from fxforge.verify import compare_outputs

pytest.importorskip("torchvision")

# Smallest square input each model accepts; 64x64 for every other model (all convnets and swin pad).
INPUT_SIZE = {
    "inception_v3": 75,  # its stem needs 75x75
    "maxvit_t": 224,  # window partitioning needs a multiple of 7 * 32 = 224
    "vit_b_16": 224,  # ViTs assert the configured image size
    "vit_b_32": 224,
    "vit_h_14": 224,
    "vit_l_16": 224,
    "vit_l_32": 224,
}
DEFAULT_SIZE = 64

# Built on the meta device: more than 150M parameters, 10-25 s each to build and run on a CPU core
# (measured: vit_h_14 632M params 23 s, regnet_y_128gf 645M 13 s, vit_l_16 304M 9 s, vit_l_32 307M 5 s,
# convnext_large 198M 5 s; every other model takes under 4 s).
ON_META = {"vit_h_14", "vit_l_16", "vit_l_32", "regnet_y_128gf", "convnext_large"}

MODELS = torchvision_classification_models()


@pytest.fixture(autouse=True)
def _fixed_seed() -> None:
    torch.manual_seed(0)  # every test draws the same random tensors, run alone or in any order


def test_the_model_list_is_complete():
    assert len(MODELS) >= 80
    assert {"resnet18", "vit_b_16", "swin_t", "maxvit_t", "inception_v3", "regnet_y_128gf"} <= set(MODELS)
    assert set(MODELS) >= ON_META | set(INPUT_SIZE)


@pytest.mark.parametrize("name", MODELS)
def test_capture_and_inspect(name: str):
    on_meta = name in ON_META
    device = "meta" if on_meta else "cpu"
    loaded = load_model(f"torchvision:{name}", device="meta" if on_meta else None)
    model = loaded.module
    size = INPUT_SIZE.get(name, DEFAULT_SIZE)
    inputs = make_inputs([InputSpec((1, 3, size, size))], seed=0, device=device)

    # check=False: the comparison below is this test's own, independent of capture's check.
    captured = capture(loaded, inputs, check=False)
    record = captured.record
    assert record.method == "symbolic_trace", record.attempts
    assert record.leaves == [] and record.wrapped == [], "torchvision models trace without help"

    report = inspect_graph(captured, include_code=False)
    assert report.totals["params"] == sum(p.numel() for p in model.parameters())
    assert report.totals["flops"] > 0
    assert report.totals["nodes"] == len(report.nodes) == len(captured.graph_module.graph.nodes)
    output = next(n for n in report.nodes if n.op == "output")
    assert output.shape == [1, 1000]

    if on_meta:
        assert all(p.device.type == "meta" for p in model.parameters())
        return  # no data on the meta device: capture and inspect totals only
    with torch.no_grad():
        expected = model(*inputs)
        actual = captured.graph_module(*inputs)
    assert torch.isfinite(expected).all()
    comparison = compare_outputs(expected, actual)
    assert comparison.ok, comparison.problems


@pytest.mark.parametrize("name", MODELS)
def test_published_figures(name: str):
    """Parameters and MACs equal the figures torchvision publishes with each model's weights.

    On the meta device (no weights, no arithmetic), at the resolution the figures were measured at. The
    published GFLOPS are multiply-adds rounded to 3 decimals.
    """
    import torchvision

    loaded = load_model(f"torchvision:{name}", device="meta")
    params = sum(p.numel() for p in loaded.module.parameters())
    weights = list(torchvision.models.get_model_weights(name))
    # Some models publish several weights with other image sizes (and so other position embeddings).
    matching = [w for w in weights if w.meta["num_params"] == params]
    if name == "inception_v3":
        assert not matching  # fxforge builds it without the auxiliary classifier
    else:
        assert matching, f"{params} parameters, published {[w.meta['num_params'] for w in weights]}"
    meta = (matching or weights)[0].meta
    size = (matching or weights)[0].transforms().crop_size[0]
    inputs = make_inputs([InputSpec((1, 3, size, size))], device="meta")
    report = inspect_graph(capture(loaded, inputs), include_code=False)
    assert report.totals["params"] == params
    published = meta["_ops"]
    assert abs(report.totals["macs"] / 1e9 - published) <= 0.0005 + 0.002 * published, (report.totals, published)


def test_capture_check_on_a_real_model():
    """capture's own check (on, by default) passes and records the batch-size check too."""
    loaded = load_model("torchvision:mobilenet_v3_small")
    captured = capture(loaded, make_inputs([InputSpec((1, 3, 64, 64))]), check_batch=2)
    assert [c.batch for c in captured.record.checks] == [None, 2]
    assert captured.record.ok, captured.record.checks


def test_resnet18_published_numbers():
    """torchvision's published figures for resnet18: 11,689,512 parameters and 1.814 GMACs at 224x224."""
    loaded = load_model("torchvision:resnet18")
    assert loaded.default_inputs == [InputSpec((1, 3, 224, 224))]
    captured = capture(loaded, make_inputs(loaded.default_inputs), check=False)
    totals = inspect_graph(captured, include_code=False).totals
    assert totals["params"] == 11_689_512
    assert totals["param_bytes"] == 11_689_512 * 4
    assert abs(totals["macs"] - 1.814e9) / 1.814e9 < 0.01
    assert totals["flops"] == 2 * totals["macs"]


def test_an_aten_output_states_the_batch_its_model_pt2_runs(tmp_path):
    """QA: resnet18 exported at batch 1 records the batch range [1, 2] and a guard ``x.size()[0] == 1``; optimize's
    note said "model.pt2 runs batch sizes up to 2 only" for a file that refuses batch 2."""
    import fxforge

    captured = fxforge.prepare("torchvision:resnet18", ["1x3x64x64"], method="export")
    result = fxforge.optimize(captured, ["fold_bn"], output_dir=tmp_path / "out")
    notes = [note for note in result.notes if note.startswith("model.pt2 runs")]
    assert notes and notes[0].startswith("model.pt2 runs batch 1 only"), notes
    program = torch.export.load(str(tmp_path / "out" / "model.pt2")).module()
    assert program(torch.randn(1, 3, 64, 64)).shape == (1, 1000)
    with pytest.raises(Exception, match="Guard failed"):
        program(torch.randn(2, 3, 64, 64))


def test_a_segmentation_models_ordered_dict_output_stays_one(tmp_path):
    """torchvision's segmentation models return an OrderedDict, which torch.fx turns into a dict: the captured
    graph, the rewritten one and its model.pt2 returned a dict, and verify warned on fxforge's own output that the
    type differs from the model's (QA)."""
    import collections

    import fxforge

    captured = fxforge.prepare("torchvision:lraspp_mobilenet_v3_large", ["1x3x64x64"])
    x = torch.randn(1, 3, 64, 64)
    assert type(captured.graph_module(x)) is collections.OrderedDict
    result = fxforge.optimize(captured, ["fold_bn", "dead_code"], output_dir=tmp_path / "out")
    rewritten = result.captured.graph_module
    assert type(rewritten(x)) is collections.OrderedDict
    assert "model.pt2" in result.files
    program = torch.export.load(str(tmp_path / "out" / "model.pt2")).module()
    assert type(program(x)) is collections.OrderedDict
    # the package of Python source too (it raised NameError: 'collections' was never imported)
    package = tmp_path / "out" / "optimized_model"
    code = (
        f"import sys, torch; sys.path.insert(0, {str(package.parent)!r}); from optimized_model import OptimizedModel; "
        "print(type(OptimizedModel()(torch.randn(1, 3, 64, 64))).__name__)"
    )
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "OrderedDict", done.stderr[-800:]
    report = fxforge.verify(captured.original, tmp_path / "out", [x])
    assert report.ok and not report.warnings, report


def test_a_transformers_model_output_stays_one(tmp_path):
    """QA: GPT-Neo and HF MobileNetV2, captured by symbolic tracing, returned a plain dict from the graph, model.pt2
    and the package (``out.last_hidden_state`` failed), and verify warned that the type differs. A ModelOutput is
    an OrderedDict subclass built from its fields: it is rebuilt as the OrderedDict is."""
    import subprocess
    import sys

    import fxforge

    pytest.importorskip("transformers")
    (tmp_path / "hf_output.py").write_text(
        "import torch\nfrom transformers.modeling_outputs import BaseModelOutputWithPooling\n\n"
        "example_inputs = ['2x8']\n\n\nclass Net(torch.nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.linear = torch.nn.Linear(8, 8)\n\n    def forward(self, x):\n"
        "        hidden = self.linear(x)\n"
        "        return BaseModelOutputWithPooling(last_hidden_state=hidden, pooler_output=hidden.mean(0))\n"
    )
    captured = fxforge.prepare(f"{tmp_path / 'hf_output.py'}:Net")
    x = torch.randn(2, 8)
    output = captured.graph_module(x)
    assert type(output).__name__ == "BaseModelOutputWithPooling" and output.pooler_output.shape == (8,)
    result = fxforge.optimize(captured, ["dead_code"], output_dir=tmp_path / "out")
    assert type(result.captured.graph_module(x)).__name__ == "BaseModelOutputWithPooling"
    code = (
        f"import sys, torch; sys.path.insert(0, {str(tmp_path / 'out')!r}); "
        "from optimized_model import OptimizedModel; print(type(OptimizedModel()(torch.randn(2, 8))).__name__)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "BaseModelOutputWithPooling", done.stderr[-800:]
    report = fxforge.verify(captured.original, captured.graph_module, [x])
    assert report.ok and not report.warnings, report
