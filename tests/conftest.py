"""Suite-wide settings: one intra-op thread per pytest-xdist worker (the CI machine has 2 cores),
and helpers shared by many test files."""

from __future__ import annotations

import pytest
import torch
from torch import nn

torch.set_num_threads(1)


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


@pytest.fixture
def resnet18():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    return randomize_batchnorm(torchvision.models.resnet18().eval())
