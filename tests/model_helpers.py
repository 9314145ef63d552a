"""Plain helpers shared by test files (import as ``from model_helpers import ...``)."""

from __future__ import annotations

import torch
from torch import nn

# capture method per graph dialect: torch-level graphs from symbolic_trace, ATen-level from torch.export
CAPTURE_METHOD = {"torch": "symbolic_trace", "aten": "export"}


def randomize_batchnorm(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every BatchNorm random running statistics and affine parameters.

    Default statistics (mean 0, var 1, gamma 1, beta 0) make BN the identity and hide folding bugs.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.running_mean is not None:
                n = module.num_features
                module.running_mean.copy_(torch.randn(n, generator=generator) * 0.5)
                module.running_var.copy_(torch.rand(n, generator=generator) + 0.5)
                if module.affine:
                    module.weight.copy_(torch.randn(n, generator=generator))
                    module.bias.copy_(torch.randn(n, generator=generator))
    return model


class ConvBnHead(nn.Module):
    """conv -> batch norm (random statistics) -> relu -> mean -> linear: the smallest model fold_bn rewrites."""

    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Linear(8, classes)
        randomize_batchnorm(self)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


def register_broken_scale_pass(name: str) -> str:
    """Register a deliberately wrong pass ``name``: it scales resnet's ``layer2.0.conv1`` output by 1.01 and
    marks the new node as the conv's, so verification must fail there and name it. Pop it from
    ``fxforge.passes.PASSES`` when done."""
    from fxforge.passes import PassResult, mark, register_pass

    @register_pass(name, summary="test only", guarantees="none (deliberately wrong)")
    def broken(gm, options):
        result = PassResult(name, gm)
        for node in list(gm.graph.nodes):
            if node.op == "call_module" and node.target == "layer2.0.conv1":
                with gm.graph.inserting_after(node):
                    scaled = gm.graph.call_function(torch.mul, (node, 1.01))
                node.replace_all_uses_with(scaled)
                scaled.args = (node, 1.01)
                mark(scaled, name, origin_of=node)
                result.note("scaled layer2.0.conv1", inserted=1)
        return result

    return name


class InplaceDropout(nn.Module):
    """A dropout written in place after a layer: torch.export records ``aten.dropout_`` (torchvision's EfficientNets
    and MobileNetV3 use ``inplace=True``)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.3, inplace=True)

    def forward(self, x):
        return self.drop(self.fc(x))


class Doubles(torch.nn.Module):
    """A Linear whose ``double`` keyword (fixed with --concrete / concrete_args) doubles its output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x, double=False):
        y = self.fc(x)
        return y * 2 if double else y


class GateLeaf(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent: capture keeps the module as a leaf, and no exported program can hold it
            return x * 2
        return x


class WithAGateLeaf(nn.Module):
    """A Linear and a :class:`GateLeaf`: captured by symbolic tracing, exported by nothing."""

    def __init__(self):
        super().__init__()
        self.a, self.g = nn.Linear(16, 16), GateLeaf()

    def forward(self, x):
        return self.g(self.a(x))
