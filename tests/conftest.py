"""Suite-wide settings: one intra-op thread per pytest-xdist worker (the CI machine has 2 cores),
and fixtures shared by many test files (plain helpers live in model_helpers.py: test files import
that by name, never ``conftest``, which is ambiguous once subfolders have conftests of their own)."""

from __future__ import annotations

import pytest
import torch

from model_helpers import randomize_batchnorm

torch.set_num_threads(1)


@pytest.fixture
def resnet18():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    return randomize_batchnorm(torchvision.models.resnet18().eval())
