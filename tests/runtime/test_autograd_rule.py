"""The autograd rule: an artifact's outputs never carry autograd history, on every path.

Eager would give a result with a ``grad_fn`` for a ``requires_grad`` input; an
inference artifact returns plain tensors whatever path ran (compiled code, a
kernel call between compiled ops, one ATen region, the host program), with
eager's values.
"""

import pytest
import torch

import aot


class Mixed(torch.nn.Module):
    def forward(self, x):
        return torch.special.i0(x * 2) + 1


class DataDependent(torch.nn.Module):
    def forward(self, x):
        return x[x > 0] * 3


@pytest.mark.parametrize("model,kw", [
    (Mixed(), dict(placement="coverage")),          # compiled + a kernel call, VM
    (Mixed(), dict(fallback="all")),                 # one ATen group
    (Mixed(), dict()),                               # default placement (may be one region)
    (DataDependent(), dict()),                       # host program
], ids=["compiled+kernel_call", "all", "default", "host_program"])
def test_outputs_carry_no_autograd_history(model, kw):
    x = torch.randn(3, 4)
    cm = aot.compile(model, (x,), **kw)
    xg = x.clone().requires_grad_(True)
    out = cm(xg)
    assert out.grad_fn is None and not out.requires_grad
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-6)
    assert xg.grad is None and xg.requires_grad  # the caller's tensor is untouched
