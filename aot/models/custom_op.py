"""A model using a custom op registered with ``torch.library`` (``aot_models::scaled_tanh``).

IREE has never heard of the op, so under ``fallback="auto"`` it becomes a kernel call
into this Python implementation while the linears around it are compiled.
"""

from __future__ import annotations

import torch
from torch import nn

if not hasattr(torch.ops.aot_models, "scaled_tanh"):
    _lib = torch.library.Library("aot_models", "FRAGMENT")
    _lib.define("scaled_tanh(Tensor x, float scale) -> Tensor")
    _lib.impl("scaled_tanh", lambda x, scale: torch.tanh(x) * scale, "CompositeExplicitAutograd")
    torch.library.register_fake("aot_models::scaled_tanh",
                                lambda x, scale: torch.empty_like(x), lib=_lib)


class CustomOpModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 64)
        self.b = nn.Linear(64, 10)

    def forward(self, x):
        h = torch.relu(self.a(x))
        return self.b(torch.ops.aot_models.scaled_tanh(h, 0.5))


def custom_op_model(seed: int = 0):
    torch.manual_seed(seed)
    return CustomOpModel().eval(), (torch.randn(4, 32),)
