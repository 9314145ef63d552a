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
