"""``aot.passes.fold_bn``: eval-mode batch norms folded into the convolution or linear
before them, the program's results as eager's within float error."""

import pytest
import torch
from torch import nn

import aot
from aot.passes.fold_bn import fold_batch_norm

_BN = torch.ops.aten._native_batch_norm_legit_no_training.default


def _randomised(m: nn.Module) -> nn.Module:
    g = torch.Generator().manual_seed(0)
    for mod in m.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            c = mod.num_features
            mod.running_mean.copy_(torch.randn(c, generator=g))
            mod.running_var.copy_(torch.rand(c, generator=g) + 0.5)
            mod.weight.data.copy_(torch.randn(c, generator=g))
            mod.bias.data.copy_(torch.randn(c, generator=g))
    return m.eval()


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class LinearBN(nn.Module):
    """An MLP head: BatchNorm1d on the linear's 2-D output."""

    def __init__(self, bias=True):
        super().__init__()
        self.fc, self.bn = nn.Linear(16, 32, bias=bias), nn.BatchNorm1d(32)

    def forward(self, x):
        return self.bn(self.fc(x))


class LinearNorm(nn.Module):
    """LeViT's: the batch norm normalises a flattened view of the linear's output."""

    def __init__(self):
        super().__init__()
        self.linear, self.bn = nn.Linear(16, 24), nn.BatchNorm1d(24)

    def forward(self, x):
        y = self.linear(x)
        return self.bn(y.flatten(0, 1)).reshape_as(y)


class ChannelBN(nn.Module):
    """A batch norm over dim 1 of a 3-D linear output: not the linear's features."""

    def __init__(self):
        super().__init__()
        self.fc, self.bn = nn.Linear(16, 16), nn.BatchNorm1d(5)

    def forward(self, x):
        return self.bn(self.fc(x))


class SharedLinear(nn.Module):
    """The linear's output is read besides the batch norm: nothing to fold."""

    def __init__(self):
        super().__init__()
        self.fc, self.bn = nn.Linear(16, 32), nn.BatchNorm1d(32)

    def forward(self, x):
        y = self.fc(x)
        return self.bn(y) + y


class NormLinear(nn.Module):
    """LeViT's heads: a batch norm on the pooled features, then a linear."""

    def __init__(self, bias=True):
        super().__init__()
        self.bn, self.drop, self.fc = nn.BatchNorm1d(16), nn.Dropout(0.1), nn.Linear(16, 10, bias=bias)

    def forward(self, x):
        return self.fc(self.drop(self.bn(x)))


class NormRead(nn.Module):
    """The normalised features are read besides the linear: nothing to fold."""

    def __init__(self):
        super().__init__()
        self.bn, self.fc = nn.BatchNorm1d(16), nn.Linear(16, 16)

    def forward(self, x):
        y = self.bn(x)
        return self.fc(y) + y


class NormAsWeight(nn.Module):
    """The normalised tensor is a linear's weight, not its input: nothing to fold."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(16)

    def forward(self, x, w):
        return nn.functional.linear(w, self.bn(x), torch.ones(x.shape[0]))


CASES = [(ConvBN, (2, 3, 10, 10), True), (lambda: LinearBN(True), (6, 16), True),
         (lambda: LinearBN(False), (6, 16), True), (LinearNorm, (2, 7, 16), True),
         (ChannelBN, (2, 5, 16), False), (SharedLinear, (6, 16), False),
         (NormLinear, (6, 16), True), (lambda: NormLinear(False), (6, 16), False),
         (NormRead, (6, 16), False)]


def _bns(ep) -> int:
    return sum(n.target == _BN for n in ep.graph.nodes)


@pytest.mark.parametrize("make,shape,folds", CASES)
def test_a_batch_norm_folds_where_it_normalises_the_features_before_it(make, shape, folds):
    m = _randomised(make())
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    ep = torch.export.export(m, (x,)).run_decompositions({})
    assert _bns(ep) == 1
    folded = fold_batch_norm(ep)
    assert _bns(folded) == (0 if folds else 1)
    assert _bns(ep) == 1  # the program it was given is untouched
    with torch.no_grad():
        torch.testing.assert_close(folded.module()(x), m(x), rtol=1e-5, atol=1e-5)


def test_a_batch_norm_read_as_a_linear_weight_is_not_folded():
    m = _randomised(NormAsWeight())
    x, w = torch.randn(16, 16), torch.randn(3, 16)
    ep = torch.export.export(m, (x, w)).run_decompositions({})
    folded = fold_batch_norm(ep)
    assert _bns(folded) == 1
    with torch.no_grad():
        torch.testing.assert_close(folded.module()(x, w), m(x, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("make,shape", [(LinearNorm, (2, 7, 16)), (lambda: LinearBN(True), (6, 16)),
                                        (NormLinear, (6, 16))])
def test_a_compiled_linear_with_its_batch_norm_folded_is_eager_within_float_error(
        make, shape, tmp_path, monkeypatch):
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))
    m = _randomised(make())
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    cm = aot.compile(m, (x,), placement="coverage")
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)
    assert not cm.kernel_calls
