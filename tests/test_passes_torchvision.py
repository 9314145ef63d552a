"""Every exact pass, as one verified pipeline, on one torchvision classification model of each architecture.

Each registered exact pass runs on the captured graph (with randomised BatchNorm statistics: the
defaults make BN the identity and hide folding bugs), then ``verify`` must find the result equal to
the model on fresh random inputs. Per pass, the postcondition is checked on every model: after
``fold_bn`` no BatchNorm that directly follows a single-use conv/linear is left, after
``remove_dropout`` no dropout is left. Passes that find nothing to do on a model (no BN in a ViT,
no dropout in a ResNet) must report ``changed=False`` and leave the graph computing the same thing.

One model per family of blocks: the other sizes of a family (resnet101, efficientnet_b7, regnet_y_32gf...) are the
same blocks at other widths and depths, and built with random weights they took most of the suite's time (vit_b_16
alone 30-60 s). Every torchvision classification model runs the same exact passes, verified, in
``benchmarks/zoo.py --corpus torchvision``; a new architecture fails ``test_every_architecture_has_a_representative``
until it gets one here.
"""

from __future__ import annotations

import pytest
import torch

from fxforge.capture import capture
from fxforge.graphs import node_kind
from fxforge.inputs import InputSpec, make_inputs
from fxforge.models import load_model, torchvision_classification_models
from fxforge.passes import PASSES, all_passes
from fxforge.pipeline import Pipeline
from fxforge.verify import verify
from model_helpers import randomize_batchnorm
from test_torchvision_models import DEFAULT_SIZE, INPUT_SIZE, ON_META

pytest.importorskip("torchvision")

# The exact passes, in the order `lint --fix` runs them; passes not registered yet are skipped.
EXACT = [
    "remove_dropout",
    "remove_identity",
    "fold_bn",
    "merge_convs",
    "cse",
    "merge_parallel_linears",
    "fold_constants",
    "dead_code",
]
# The smallest model of each family of blocks, by name prefix; two where a family has two kinds of block (resnet18's
# basic blocks, resnet50's bottlenecks) or a variant with batch norm (vgg11_bn: fold_bn's case).
REPRESENTATIVES = {
    "alexnet": ["alexnet"],
    "convnext_": ["convnext_tiny"],
    "densenet": ["densenet121"],
    "efficientnet_b": ["efficientnet_b0"],
    "efficientnet_v2_": ["efficientnet_v2_s"],
    "googlenet": ["googlenet"],
    "inception_v3": ["inception_v3"],
    "maxvit_": ["maxvit_t"],
    "mnasnet": ["mnasnet0_5"],
    "mobilenet_v2": ["mobilenet_v2"],
    "mobilenet_v3_": ["mobilenet_v3_small", "mobilenet_v3_large"],
    "regnet_x_": ["regnet_x_400mf"],
    "regnet_y_": ["regnet_y_400mf"],
    "resnet": ["resnet18", "resnet50"],
    "resnext": ["resnext50_32x4d"],
    "shufflenet_v2_": ["shufflenet_v2_x0_5"],
    "squeezenet": ["squeezenet1_0", "squeezenet1_1"],
    "swin_v2_": ["swin_v2_t"],
    "swin_": ["swin_t"],
    "vgg": ["vgg11", "vgg11_bn"],
    "vit_": ["vit_b_32"],
    "wide_resnet": [],  # resnet50's bottleneck blocks, wider
}
MODELS = [name for names in REPRESENTATIVES.values() for name in names]


def _foldable_bn(gm) -> list[str]:
    left = []
    for node in gm.graph.nodes:
        if node_kind(gm, node) == "batch_norm" and node.args and hasattr(node.args[0], "op"):
            producer = node.args[0]
            if node_kind(gm, producer) in ("conv", "linear") and len(producer.users) == 1:
                left.append(node.name)
    return left


def test_every_architecture_has_a_representative():
    available = torchvision_classification_models()
    assert set(MODELS) <= set(available) - ON_META
    without = [name for name in available if not name.startswith(tuple(REPRESENTATIVES))]
    assert without == [], f"new torchvision architectures: add one of each to REPRESENTATIVES: {without}"


@pytest.mark.parametrize("name", MODELS)
def test_exact_passes_preserve_outputs(name: str):
    all_passes()
    passes = [p for p in EXACT if p in PASSES]
    loaded = load_model(f"torchvision:{name}")
    randomize_batchnorm(loaded.module, seed=1)
    size = INPUT_SIZE.get(name, DEFAULT_SIZE)
    inputs = make_inputs([InputSpec((1, 3, size, size))], seed=0)
    captured = capture(loaded, inputs, check=False)
    result = Pipeline(passes, lint_between=False).run(captured)
    gm = result.graph_module

    by_name = {step.result.name: step.result for step in result.steps}
    if "fold_bn" in by_name:
        had_bn = any(node_kind(captured.graph_module, n) == "batch_norm" for n in captured.graph_module.graph.nodes)
        assert by_name["fold_bn"].changed == bool(had_bn and _foldable_bn(captured.graph_module))
        assert _foldable_bn(gm) == [], by_name["fold_bn"].skipped
    if "remove_dropout" in by_name:
        assert not any(node_kind(gm, n) == "dropout" for n in gm.graph.nodes)

    check = verify(captured, gm, seeds=(1,))
    assert check.ok, check.divergence.describe() if check.divergence else check.problems
    # The user's model is untouched: its BN modules are still there and still used.
    assert any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in loaded.module.modules()) == any(
        node_kind(captured.graph_module, n) == "batch_norm" for n in captured.graph_module.graph.nodes
    )
