"""A model with an ATen op IREE 3.13 cannot lower: ``torch.special.i0``.

Measured with ``aot.compile(..., fallback="none")``: ``aten.special_i0.default`` —
"IREE's torch lowering does not know this op (left as torch.operator)". Under
``fallback="auto"`` it runs as an ATen kernel call between two compiled linears.
"""

from __future__ import annotations

import torch
from torch import nn


class Unlowerable(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.special.i0(self.a(x)))


def unlowerable_model(seed: int = 0):
    torch.manual_seed(seed)
    return Unlowerable().eval(), (torch.randn(2, 16),)
