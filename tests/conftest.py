"""Shared fixtures: a fixed seed per test, and the `gpu` marker's skip."""

import pytest
import torch


@pytest.fixture(autouse=True)
def seed_torch():
    torch.manual_seed(0)
    yield


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
