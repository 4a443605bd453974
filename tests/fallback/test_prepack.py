"""Prepacked CPU kernels in ATen regions: packed weights, fused activations / residual add."""

import pytest
import torch

import aot
from aot.fallback import prepack
from aot.fallback.executor import ExecOptions
from aot.errors import ArtifactError
from aot.toolchain.targets import get_target
from aot.tuning import linear_kernels
from aot.tuning.regions import _with_executor
from aot.runtime.module import CompiledModule

pytestmark = pytest.mark.skipif(not prepack.available(),
                                reason="this torch build has no oneDNN pointwise convolution")


class Block(torch.nn.Module):
    """conv -> relu, conv + residual -> relu, a conv feeding two readers, a linear."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.c3 = torch.nn.Conv2d(8, 8, 1)
        self.c4 = torch.nn.Conv2d(8, 4, 3, stride=2, padding=1, bias=False)
        self.fc = torch.nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        y = torch.relu(self.c2(y) + x)        # residual add, then relu
        z = self.c3(y)
        y = torch.relu(z) + z                  # z has two readers: not fused
        return self.fc(self.c4(y).flatten(1)), y


def _fusions(cm):
    fn = cm.host.functions[cm.manifest["kernel_calls"][0]["key"]]
    return fn.fused


def _prepacked(m, x, memory_format="contiguous"):
    """``m`` as one ATen region run by the prepacked executor."""
    allm = aot.compile(m, (x,), fallback="all")
    return CompiledModule(_with_executor(allm.artifact,
                                         ExecOptions(memory_format, prepack=True)))


def test_prepacked_region_matches_eager_and_fuses():
    torch.manual_seed(0)
    m = Block().eval()
    x = torch.randn(2, 8, 16, 16)
    packed = _prepacked(m, x, "channels_last")
    with torch.no_grad():
        ref = m(x)
        for _ in range(3):  # the first call packs the weights, later calls reuse them
            got = packed(x)
            # oneDNN / MKL accumulate in another order: float rounding only
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    plan = _fusions(packed)
    kinds = sorted(type(f).__name__ if f is not prepack.DEFERRED else "deferred"
                   for f in plan.values())
    # c1+relu, c2+add+relu, c3 alone, c4 alone, fc: 4 packed convs (2 absorbing 3 members)
    assert kinds.count("PackedConv") == 4
    assert kinds.count("deferred") == 3
    fused = [f for f in plan.values() if isinstance(f, prepack.PackedConv)]
    assert sorted((f.unary, f.other_slot is not None) for f in fused) == [
        ("none", False), ("none", False), ("relu", False), ("relu", True)]
    if hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        assert kinds.count("OneDnnLinear") == 1
    elif prepack._mkl_linear_available():
        assert kinds.count("PackedLinear") == 1


ACTIVATIONS = {  # module -> the oneDNN post-op it becomes
    "relu6": (torch.nn.ReLU6(), "hardtanh"),
    "hardtanh": (torch.nn.Hardtanh(-0.5, 2.0), "hardtanh"),
    "hardswish": (torch.nn.Hardswish(), "hardswish"),
    "hardsigmoid": (torch.nn.Hardsigmoid(), "hardsigmoid"),
    "silu": (torch.nn.SiLU(), "swish"),
    "sigmoid": (torch.nn.Sigmoid(), "sigmoid"),
    "tanh": (torch.nn.Tanh(), "tanh"),
    "gelu": (torch.nn.GELU(), "gelu"),
    "gelu_tanh": (torch.nn.GELU(approximate="tanh"), "gelu"),
    "leaky_relu": (torch.nn.LeakyReLU(0.2), "leaky_relu"),
}


class ConvAct(torch.nn.Module):
    """A depthwise conv + activation, a pointwise conv + activation, then a residual
    add followed by the activation (oneDNN fuses only relu after an add)."""

    def __init__(self, act):
        super().__init__()
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pw = torch.nn.Conv2d(8, 8, 1)
        self.c = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.act = act

    def forward(self, x):
        y = self.act(self.pw(self.act(self.dw(x))))
        return self.act(self.c(y) + x)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activations_fuse_into_packed_convolutions(name):
    act, attr = ACTIVATIONS[name]
    torch.manual_seed(0)
    m = ConvAct(act).eval()
    x = torch.randn(2, 8, 12, 12) * 3  # reaches both sides of the clamping activations
    packed = _prepacked(m, x, "channels_last")
    with torch.no_grad():
        ref = m(x)
        for _ in range(2):
            # oneDNN's post-ops compute the activation on the accumulator: rounding only
            torch.testing.assert_close(packed(x), ref, rtol=1e-4, atol=1e-4)
    fused = sorted((f.unary, f.other_slot is not None)
                   for f in _fusions(packed).values() if isinstance(f, prepack.PackedConv))
    # dw + act and pw + act fuse; c + add fuses, and the activation after the add only
    # where it is a relu (never here: none of these is aten::relu)
    assert fused == sorted([(attr, False), (attr, False), ("none", True)])


def test_row_major_groups_pack_convolutions_that_feed_one_another():
    torch.manual_seed(0)
    m = Block().eval()
    x = torch.randn(2, 8, 16, 16)
    packed = _prepacked(m, x)
    with torch.no_grad():
        for _ in range(2):
            for g, r in zip(packed(x), m(x)):
                torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)
                assert g.is_contiguous()  # what leaves the group is row-major again
    convs = [f for f in _fusions(packed).values() if isinstance(f, prepack.PackedConv)]
    # c1 -> c2 -> c3: c1's and c2's results are read only as the next convolution's
    # input, so they stay channels-last; c3's (read by a relu and an add) is made
    # row-major; c4, between an add and the linear, stays ATen's
    assert [(f.row_major, f.stride) for f in convs] == [(False, [1, 1]), (False, [1, 1]),
                                                        (True, [1, 1])]


class LoneConv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 16 * 16, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.c(x)).flatten(1))


def test_row_major_groups_leave_a_lone_convolution_to_aten():
    torch.manual_seed(0)
    m = LoneConv().eval()
    x = torch.randn(2, 8, 16, 16)
    packed = _prepacked(m, x)
    with torch.no_grad():
        torch.testing.assert_close(packed(x), m(x), rtol=1e-4, atol=1e-4)
    assert not any(isinstance(f, prepack.PackedConv) for f in _fusions(packed).values())


class Mlp(torch.nn.Module):
    """A transformer's MLP on a 3-D input: linear -> activation -> linear, and a linear
    whose result has a second reader (not fused)."""

    def __init__(self, act):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = (torch.nn.Linear(16, 64), torch.nn.Linear(64, 16),
                                        torch.nn.Linear(16, 16, bias=False))
        self.act = act

    def forward(self, x):
        h = self.fc3(self.fc2(self.act(self.fc1(x))))
        return self.act(h) + h


@pytest.mark.skipif(not hasattr(torch.ops.mkldnn, "_linear_pointwise"),
                    reason="this torch build has no oneDNN linear")
@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "silu", "relu6"])
def test_linears_run_on_onednn_with_their_activation_fused(name):
    act, attr = ACTIVATIONS[name]
    torch.manual_seed(0)
    m = Mlp(act).eval()
    x = torch.randn(2, 5, 16) * 2
    packed = _prepacked(m, x)
    with torch.no_grad():
        ref = m(x)
        for _ in range(2):
            # oneDNN accumulates in its own order and computes the activation on the
            # accumulator: rounding only
            torch.testing.assert_close(packed(x), ref, rtol=1e-4, atol=1e-4)
    plan = _fusions(packed)
    linears = sorted(f.unary for f in plan.values() if isinstance(f, prepack.OneDnnLinear))
    assert linears == sorted([attr, "none", "none"])
    assert sum(f is prepack.DEFERRED for f in plan.values()) == 1


class Attention(torch.nn.Module):
    def __init__(self, scale_by_mul=False):
        super().__init__()
        self.qkv = torch.nn.Linear(32, 96)
        self.scale_by_mul = scale_by_mul

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 4, 8).permute(2, 0, 3, 1, 4)
        sc = q @ k.transpose(-1, -2)
        sc = sc * 0.25 if self.scale_by_mul else sc / 8 ** 0.5
        return (torch.softmax(sc, dim=-1) @ v).transpose(1, 2).reshape(b, s, h)


@pytest.mark.parametrize("scale_by_mul", [False, True])
def test_written_out_attention_runs_as_one_fused_kernel(scale_by_mul):
    torch.manual_seed(0)
    m = Attention(scale_by_mul).eval()
    x = torch.randn(2, 16, 32)
    packed = _prepacked(m, x)
    with torch.no_grad():
        torch.testing.assert_close(packed(x), m(x), rtol=1e-5, atol=1e-5)
    plan = _fusions(packed)
    att = [f for f in plan.values() if isinstance(f, prepack.FusedAttention)]
    assert len(att) == 1 and att[0].scale == pytest.approx(0.25 if scale_by_mul else 8 ** -0.5)
    # transpose, q @ k^T, the scaling and the softmax are absorbed
    assert sum(f is prepack.DEFERRED for f in plan.values()) == 4


class BiasedAttention(torch.nn.Module):
    """LeViT's attention: k^T by a permute, the scores scaled and given a per-head bias."""

    def __init__(self, dv):
        super().__init__()
        self.dv = dv
        self.qkv = torch.nn.Linear(32, 4 * (16 + dv))
        self.bias = torch.nn.Parameter(torch.randn(4, 16, 16))

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 4, -1).split([8, 8, self.dv], dim=3)
        q, k, v = q.permute(0, 2, 1, 3), k.permute(0, 2, 3, 1), v.permute(0, 2, 1, 3)
        attn = (q @ k * 0.35 + self.bias).softmax(dim=-1)
        return (attn @ v).transpose(1, 2).reshape(b, n, 4 * self.dv)


@pytest.mark.parametrize("dv", [8, 16])
def test_attention_with_a_bias_and_a_permuted_k_fuses_where_flash_attention_runs(dv):
    torch.manual_seed(0)
    m = BiasedAttention(dv).eval()
    x = torch.randn(2, 16, 32)
    packed = _prepacked(m, x)
    with torch.no_grad():
        for _ in range(2):
            if dv == 8:  # flash attention: rounding only
                torch.testing.assert_close(packed(x), m(x), rtol=1e-5, atol=1e-5)
            else:  # v's head size is not q's: no fused kernel, the ops as written run
                assert torch.equal(packed(x), m(x))
    plan = _fusions(packed)
    att = [f for f in plan.values() if isinstance(f, prepack.FusedAttention)]
    assert len(att) == 1 and att[0].k_transposed and att[0].bias is not None
    assert att[0].scale == pytest.approx(0.35)
    # q @ k^T, the scaling, the bias add and the softmax are absorbed
    assert sum(f is prepack.DEFERRED for f in plan.values()) == 4


def test_attention_whose_scores_are_also_returned_is_not_fused():
    class Leaky(Attention):
        def forward(self, x):
            b, s, h = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, 4, 8).permute(2, 0, 3, 1, 4)
            p = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1)
            return p @ v, p
    m = Leaky().eval()
    x = torch.randn(1, 16, 32)
    packed = _prepacked(m, x)
    with torch.no_grad():
        for g, r in zip(packed(x), m(x)):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
    assert not any(isinstance(f, prepack.FusedAttention) for f in _fusions(packed).values())


class SqueezeExcite(torch.nn.Module):
    """torchvision's squeeze-excitation: pool, 1x1 conv + act, 1x1 conv + gate, scale."""

    def __init__(self, act, gate, bias=True):
        super().__init__()
        self.c = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc1 = torch.nn.Conv2d(8, 4, 1, bias=bias)
        self.fc2 = torch.nn.Conv2d(4, 8, 1)
        self.act, self.gate = act, gate

    def forward(self, x):
        y = self.c(x)
        s = self.gate(self.fc2(self.act(self.fc1(torch.nn.functional.adaptive_avg_pool2d(y, 1)))))
        return y * s


@pytest.mark.parametrize("act,gate,bias", [
    (torch.nn.SiLU(), torch.nn.Sigmoid(), True),          # EfficientNet
    (torch.nn.ReLU(), torch.nn.Hardsigmoid(), False),     # MobileNetV3 (bias-free here)
    (torch.nn.Identity(), torch.nn.Identity(), True),     # no activation to fuse
])
def test_squeeze_excitation_convolutions_run_as_matrix_vector_products(act, gate, bias):
    torch.manual_seed(0)
    m = SqueezeExcite(act, gate, bias).eval()
    x = torch.randn(3, 8, 10, 10)
    packed = _prepacked(m, x, "channels_last")
    with torch.no_grad():
        ref = m(x)
        for _ in range(2):  # the first call transposes the weights, later calls reuse them
            torch.testing.assert_close(packed(x), ref, rtol=1e-5, atol=1e-5)
    plan = _fusions(packed)
    mv = [f for f in plan.values() if isinstance(f, prepack.MatvecConv)]
    assert len(mv) == 2  # fc1 and fc2; the 3x3 conv on the 10x10 input stays oneDNN's
    assert sum(isinstance(f, prepack.PackedConv) for f in plan.values()) == 1
    fused = sorted(f.unary for f in mv)
    names = {torch.nn.SiLU: "swish", torch.nn.Sigmoid: "sigmoid", torch.nn.ReLU: "relu",
             torch.nn.Hardsigmoid: "hardsigmoid", torch.nn.Identity: "none"}
    assert fused == sorted([names[type(act)], names[type(gate)]])


needs_both_linears = pytest.mark.skipif(
    not (prepack.onednn_linear_available() and prepack.mkl_linear_available()),
    reason="this torch build lacks oneDNN's or MKL's linear")


@needs_both_linears
@pytest.mark.parametrize("name", ["gelu", "relu6"])
def test_linears_listed_for_mkl_run_there_with_their_activation_after(name):
    act, _ = ACTIVATIONS[name]
    torch.manual_seed(0)
    m = Mlp(act).eval()
    x = torch.randn(2, 5, 16) * 2
    allm = aot.compile(m, (x,), fallback="all")
    sigs = sorted(linear_kernels.sites(
        _with_executor(allm.artifact, ExecOptions(prepack=True))))
    # rows x in x out, the bias, the activation fused into the first linear
    assert sigs == sorted([f"10x16x64+bias+{ACTIVATIONS[name][1]}"
                           + (",0,6" if name == "relu6" else "/none" if name == "gelu" else ""),
                           "10x64x16+bias", "10x16x16"])
    on_mkl = sigs[:2]
    packed = CompiledModule(_with_executor(
        allm.artifact, ExecOptions(prepack=True, mkl_linears=tuple(on_mkl))))
    with torch.no_grad():
        ref = m(x)
        for _ in range(2):  # MKL accumulates in its own order: rounding only
            torch.testing.assert_close(packed(x), ref, rtol=1e-4, atol=1e-4)
    plan = _fusions(packed)
    kinds = {f.signature: type(f).__name__ for f in plan.values()
             if isinstance(f, (prepack.OneDnnLinear, prepack.PackedLinear))}
    assert kinds == {s: "PackedLinear" if s in on_mkl else "OneDnnLinear" for s in sigs}
    assert sum(f is prepack.DEFERRED for f in plan.values()) == 1  # the activation, still fused


@needs_both_linears
def test_kernel_choice_is_measured_once_per_machine_and_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    m = Mlp(torch.nn.GELU()).eval()
    x = torch.randn(2, 5, 16)
    allm = aot.compile(m, (x,), fallback="all")
    cand = _with_executor(allm.artifact, ExecOptions(prepack=True))
    # MKL twice as fast on the 64 -> 16 product, slower on the others
    fake = {(64, 16): {"onednn": 2.0, "mkl": 1.0}}
    calls = []

    def timed(batch, k, n, bias, post_op):
        calls.append((batch, k, n))
        return fake.get((k, n), {"onednn": 1.0, "mkl": 1.5})
    monkeypatch.setattr(linear_kernels, "timed", timed)
    chosen = linear_kernels.chosen({"aten-prepacked": cand}, get_target("cpu"))["aten-prepacked"]
    assert chosen.manifest.executor["mkl_linears"] == ["10x64x16+bias"]
    assert sorted(calls) == [(10, 16, 16), (10, 16, 64), (10, 64, 16)]
    # a second compile reuses the times (nothing timed), so it makes the same choice;
    # a candidate already chosen is left as it is
    calls.clear()
    again = linear_kernels.choose(cand, get_target("cpu"))
    assert again.manifest.executor["mkl_linears"] == ["10x64x16+bias"] and not calls
    assert linear_kernels.chosen({"aten-prepacked": chosen}, get_target("cpu"))["aten-prepacked"] \
        is chosen
    with torch.no_grad():
        torch.testing.assert_close(CompiledModule(chosen)(x), m(x), rtol=1e-4, atol=1e-4)


class Pointwise(torch.nn.Module):
    """1x1 convolutions: one with ReLU6 after it, one with a residual add, one strided
    (no linear over its pixels) and one without a bias."""

    def __init__(self):
        super().__init__()
        self.expand = torch.nn.Conv2d(8, 32, 1)
        self.project = torch.nn.Conv2d(32, 8, 1)
        self.down = torch.nn.Conv2d(8, 16, 1, stride=2)
        self.plain = torch.nn.Conv2d(16, 4, 1, bias=False)

    def forward(self, x):
        y = self.project(torch.nn.functional.hardtanh(self.expand(x), 0.0, 6.0)) + x
        return self.plain(self.down(y))


@needs_both_linears
def test_one_by_one_convolutions_listed_for_mkl_run_there_with_add_and_activation_after():
    torch.manual_seed(0)
    m = Pointwise().eval()
    x = torch.randn(2, 8, 12, 12)
    allm = aot.compile(m, (x,), fallback="all")
    cand = _with_executor(allm.artifact, ExecOptions("channels_last", prepack=True))
    sigs = sorted(linear_kernels.sites(cand))
    # rows (2 x 12 x 12 pixels, or 2 x 6 x 6 after the stride) x in x out, the bias, the
    # add and the activation each kernel runs; the strided one is none
    assert sigs == ["conv1x1:288x32x8+bias+add", "conv1x1:288x8x32+bias+hardtanh,0,6",
                    "conv1x1:72x16x4"]
    packed = CompiledModule(_with_executor(
        allm.artifact, ExecOptions("channels_last", prepack=True, mkl_linears=tuple(sigs))))
    with torch.no_grad():
        ref = m(x)
        for _ in range(2):  # MKL accumulates in its own order: rounding only
            torch.testing.assert_close(packed(x), ref, rtol=1e-4, atol=1e-4)
    kinds = sorted(type(f).__name__ for f in _fusions(packed).values()
                   if isinstance(f, prepack.PackedConv))
    assert kinds == ["MklConv1x1"] * 3 + ["PackedConv"]


@needs_both_linears
def test_one_by_one_convolutions_are_timed_with_what_they_fuse(tmp_path, monkeypatch):
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    m = Pointwise().eval()
    x = torch.randn(2, 8, 12, 12)
    allm = aot.compile(m, (x,), fallback="all")
    cand = _with_executor(allm.artifact, ExecOptions("channels_last", prepack=True))
    calls, real = [], linear_kernels.timed_conv1x1

    def timed_conv1x1(n, c, h, w, o, bias, add, post_op):
        calls.append((n, c, h, w, o, bias, add, post_op and post_op.attr))
        return {"onednn": 1.0, "mkl": 0.5 if add else 2.0}
    monkeypatch.setattr(linear_kernels, "timed_conv1x1", timed_conv1x1)
    chosen = linear_kernels.choose(cand, get_target("cpu"))
    assert chosen.manifest.executor["mkl_linears"] == ["conv1x1:288x32x8+bias+add"]
    assert sorted(calls) == [(2, 8, 12, 12, 32, True, False, "hardtanh"),
                             (2, 16, 6, 6, 4, False, False, None),
                             (2, 32, 12, 12, 8, True, True, None)]
    with torch.no_grad():
        torch.testing.assert_close(CompiledModule(chosen)(x), m(x), rtol=1e-4, atol=1e-4)
    # the real timer runs both kernels, with the add and the activation
    relu = prepack.PostOp("relu", [], "", lambda y, s, a: torch.relu_(y))
    times = real(1, 8, 4, 4, 8, True, True, relu)
    assert set(times) == {"onednn", "mkl"} and min(times.values()) > 0


def test_executor_mkl_linears_must_be_a_list_of_signatures():
    assert ExecOptions.from_json({"mkl_linears": ["8x16x16+bias"]}).mkl_linears \
        == ("8x16x16+bias",)
    assert "mkl_linears" not in ExecOptions(prepack=True).to_json()
    for bad in ("8x16x16", [3], ["x" * 201]):
        with pytest.raises(ArtifactError, match="mkl_linears should be a list"):
            ExecOptions.from_json({"mkl_linears": bad})
