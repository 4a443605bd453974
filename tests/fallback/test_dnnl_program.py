"""ATen groups run as oneDNN primitives of our own (``ExecOptions(onednn_primitives=True)``,
``aot.fallback.dnnl_program``), compared with eager PyTorch.

Tolerance: oneDNN sums in its own order, so values differ from eager's by float rounding
(rtol 1e-4, atol 1e-5 on these small networks)."""

import ctypes as C
import os
import re
import threading

import pytest
import torch

import aot
from aot.errors import ArtifactError
from aot.fallback import c_compiler, dnnl_api, dnnl_program, native_loop
from aot.fallback.executor import ExecOptions
from aot.runtime.module import CompiledModule
from aot.tuning.regions import _with_executor, aten_candidates

pytestmark = pytest.mark.skipif(not dnnl_api.available(),
                                reason="oneDNN's library (onednn-cpu-gomp, x86-64 Linux) is "
                                       "not installed")

TOL = dict(rtol=1e-4, atol=1e-5)


class Net(torch.nn.Module):
    """A MobileNet-like network: a stem, a depthwise convolution with SiLU, squeeze-
    excitation, a residual add and ReLU fused into a convolution, pooling with
    ceil_mode, arithmetic with numbers, a global mean, a linear with GELU; and a second
    result that is an intermediate."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.dw = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.se1 = torch.nn.Conv2d(16, 4, 1)
        self.se2 = torch.nn.Conv2d(4, 16, 1)
        self.pw = torch.nn.Conv2d(16, 16, 1)
        self.dil = torch.nn.Conv2d(16, 16, 3, padding=2, dilation=2)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = torch.nn.functional.hardswish(self.stem(x))
        y = torch.nn.functional.silu(self.dw(x))
        s = torch.nn.functional.hardsigmoid(
            self.se2(torch.relu(self.se1(torch.nn.functional.adaptive_avg_pool2d(y, 1)))))
        y = torch.relu(self.pw(y * s) + x)
        z = torch.clamp(self.dil(y), -1.0, 2.0)
        p = torch.nn.functional.max_pool2d(z, 3, 2, 1, ceil_mode=True) * 0.5 + 1.0
        p = torch.nn.functional.avg_pool2d(p, 2) - 0.25
        v = torch.nn.functional.gelu(self.fc(p.mean((2, 3))))
        return torch.tanh(v) / 3.0, y


def _module(m, xs):
    allm = aot.compile(m, xs, fallback="all")
    return CompiledModule(_with_executor(allm.artifact, ExecOptions(onednn_primitives=True)))


def _group(cm):
    return cm.host.functions[cm.manifest["kernel_calls"][0]["key"]].graph


def _check(cm, m, make, calls=3, tol=TOL):
    with torch.no_grad():
        for _ in range(calls):
            xs = make()
            got, ref = cm(*xs), m(*xs)
            got = got if isinstance(got, (tuple, list)) else (got,)
            ref = ref if isinstance(ref, (tuple, list)) else (ref,)
            for g, r in zip(got, ref):
                torch.testing.assert_close(g, r, **tol)


def test_group_runs_as_primitives_and_matches_eager():
    torch.manual_seed(0)
    m = Net().eval()
    make = lambda: (torch.randn(1, 3, 32, 32),)  # noqa: E731
    cm = _module(m, make())
    _check(cm, m, make)
    graph = _group(cm)
    assert graph.failed is None
    prog = graph.program
    # every op of this network has a primitive: convolutions with their activations,
    # the residual add and ReLU fused; the scaling, poolings and number arithmetic
    # alone or fused; only the flatten after the mean (a view) runs in ATen
    assert prog.n_aten <= 1, prog.n_aten
    assert 8 <= prog.n_primitives <= 14, prog.n_primitives


def test_fusions_take_the_activation_and_residual_into_the_convolution():
    torch.manual_seed(1)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv2d(8, 8, 3, padding=1)
            self.b = torch.nn.Conv2d(8, 8, 3, padding=1)

        def forward(self, x):
            return torch.relu(self.b(torch.relu(self.a(x))) + x)

    m = Block().eval()
    make = lambda: (torch.randn(1, 8, 16, 16),)  # noqa: E731
    cm = _module(m, make())
    _check(cm, m, make)
    # the input's reorder to NHWC, conv+relu, conv+add+relu: three primitives
    assert _group(cm).program.n_primitives == 3


def test_ops_without_a_primitive_run_in_aten_between_them():
    torch.manual_seed(2)

    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = torch.nn.Linear(32, 64)
            self.l2 = torch.nn.Linear(64, 32)
            self.l3 = torch.nn.Linear(32, 32)
            self.l4 = torch.nn.Linear(32, 32)
            self.norm = torch.nn.LayerNorm(32)

        def forward(self, x):
            h = self.l2(torch.nn.functional.gelu(self.l1(x))) + x
            h = self.norm(h)
            a = torch.softmax(self.l3(h) @ h.transpose(1, 2), dim=-1)
            h = torch.flip(a @ h, dims=[1]) + h
            return self.l4(h).cumsum(1)

    m = Mixed().eval()
    make = lambda: (torch.randn(2, 7, 32),)  # noqa: E731
    cm = _module(m, make())
    _check(cm, m, make)
    prog = _group(cm).program
    # linears (GELU and the residual fused), layer norm, both products, softmax and the
    # add after the flip are primitives; the transpose of a kept buffer is made once;
    # the rest runs in ATen
    assert sorted(prog.aten_ops) == ["aten::cumsum", "aten::flip"]
    assert prog.n_primitives >= 8 and prog.n_fixed_views == 1


def test_program_survives_save_and_load(tmp_path):
    torch.manual_seed(3)
    m = Net().eval()
    make = lambda: (torch.randn(1, 3, 32, 32),)  # noqa: E731
    cm = _module(m, make())
    path = os.path.join(tmp_path, "m.aot")
    cm.save(path)
    loaded = aot.load(path)
    assert loaded.exec_options.onednn_primitives
    _check(loaded, m, make)
    assert _group(loaded).program is not None


def test_inputs_in_another_layout_and_results_that_outlive_the_call():
    torch.manual_seed(4)
    m = Net().eval()
    cm = _module(m, (torch.randn(1, 3, 32, 32),))
    with torch.no_grad():
        x1 = torch.randn(1, 3, 32, 32).contiguous(memory_format=torch.channels_last)
        x2 = torch.randn(1, 32, 32, 3).permute(0, 3, 1, 2)
        first = cm(x1)
        second = cm(x2)
        # the first call's results are not overwritten by the second's
        for g, r in zip(first, m(x1)):
            torch.testing.assert_close(g, r, **TOL)
        for g, r in zip(second, m(x2)):
            torch.testing.assert_close(g, r, **TOL)


def test_threads_calling_one_program_get_their_own_answers():
    torch.manual_seed(5)
    m = Net().eval()
    cm = _module(m, (torch.randn(1, 3, 32, 32),))
    xs = [torch.randn(1, 3, 32, 32) for _ in range(4)]
    with torch.no_grad():
        cm(xs[0])
        want = [m(x) for x in xs]
    got, errors = [None] * len(xs), []

    def work(i):
        try:
            with torch.no_grad():
                for _ in range(20):
                    got[i] = cm(xs[i])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for g, w in zip(got, want):
        for a, b in zip(g, w):
            torch.testing.assert_close(a, b, **TOL)


def test_executor_entry_is_checked_on_load():
    assert ExecOptions.from_json({"onednn_primitives": True}).onednn_primitives
    assert "onednn_primitives" not in ExecOptions().to_json()  # older artifacts unchanged
    with pytest.raises(ArtifactError, match="onednn_primitives"):
        ExecOptions.from_json({"onednn_primitives": 1})


def test_programs_with_enough_kernels_get_the_candidate():
    from aot.partition.placement import PlacementPolicy
    from aot.passes.prepare import prepare
    from aot.stages import export
    from aot.toolchain.targets import get_target
    from aot.tuning.regions import GRAPH_MIN_KERNELS

    torch.manual_seed(6)
    deep = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                               *[torch.nn.Conv2d(8, 8, 3, padding=1)
                                 for _ in range(GRAPH_MIN_KERNELS - 1)]).eval()
    imported = export(deep, (torch.randn(1, 3, 32, 32),)).imported
    imported, _ = prepare(imported, PlacementPolicy())
    cands = aten_candidates(imported, get_target("cpu"))
    assert cands["aten-onednn-primitives"].manifest.executor["onednn_primitives"] is True
    # the candidate runs (traced NHWC): the input's reorder, one primitive per
    # convolution, ReLU fused
    cm = CompiledModule(cands["aten-onednn-primitives"])
    _check(cm, deep, lambda: (torch.randn(1, 3, 32, 32),), calls=2)
    assert _group(cm).program.n_primitives == GRAPH_MIN_KERNELS + 1


def test_library_enums_match_its_names():
    lib = dnnl_api.lib()
    assert lib.names_agree()


def test_canonical_strides_of_size_one_dimensions():
    # an NHWC tensor with a 1x1 image: ATen's strides for the 1-dims vary, the layout not
    assert dnnl_program._canonical((1, 8, 1, 1), (8, 1, 1, 1)) == (8, 1, 8, 8)
    assert dnnl_program._canonical((1, 8, 4, 4), (128, 1, 32, 8)) == (128, 1, 32, 8)
    assert dnnl_program._canonical((2, 3), (3, 1)) == (3, 1)
    assert dnnl_program._canonical((2, 3), (1, 2)) == (1, 2)  # not dense row-major: kept


def test_unknown_graph_input_is_a_value_error():
    g = torch._C.Graph()
    g.addInput()  # no traced type
    with pytest.raises(ValueError):
        dnnl_program.build(g)


def test_dead_values_buffers_serve_later_results():
    torch.manual_seed(7)
    m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1),
                                                  torch.nn.ReLU()) for _ in range(6)],
                            torch.nn.Conv2d(8, 4, 1)).eval()
    make = lambda: (torch.randn(1, 8, 16, 16),)  # noqa: E731
    cm = _module(m, make())
    _check(cm, m, make)
    prog = _group(cm).program
    storages = {t.untyped_storage().data_ptr() for t in prog.env
                if isinstance(t, torch.Tensor)}
    # seven convolutions (the last one's result is the output, fresh per call) and the
    # input's reorder: two buffers alternate between the intermediates, plus the copy
    assert prog.n_primitives == 8
    assert len(storages) <= 3, len(storages)


class Attention(torch.nn.Module):
    """Attention four ways: no mask (a residual and layer norm after), causal, a learned
    bias of lower rank (LeViT's, written out) and a boolean mask constant; then a mask
    that arrives with the input. Linear scale-and-shift norms (MobileBERT's ``NoNorm``)
    read constants of lower rank."""

    def __init__(self, d=32, heads=4, tokens=9):
        super().__init__()
        self.h = heads
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.norm = torch.nn.LayerNorm(d)
        self.bias = torch.nn.Parameter(torch.randn(heads, tokens, tokens))
        self.register_buffer("allowed", torch.rand(tokens, tokens) > 0.3)
        self.w = torch.nn.Parameter(torch.randn(d))
        self.b = torch.nn.Parameter(torch.randn(d))

    def heads(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.h, -1).permute(2, 0, 3, 1, 4).unbind(0)
        return q, k, v

    def merge(self, o):
        b, h, t, e = o.shape
        return self.proj(o.transpose(1, 2).reshape(b, t, h * e))

    def forward(self, x, mask):
        sdpa = torch.nn.functional.scaled_dot_product_attention
        q, k, v = self.heads(x)
        x = self.norm(x + self.merge(sdpa(q, k, v)))
        q, k, v = self.heads(x)
        x = x + self.merge(sdpa(q, k, v, is_causal=True))
        q, k, v = self.heads(x)
        a = torch.softmax(q @ k.transpose(-2, -1) * 0.3 + self.bias, dim=-1)
        x = x + self.merge(a @ v) * self.w + self.b
        q, k, v = self.heads(x)
        x = x + self.merge(sdpa(q, k, v, attn_mask=self.allowed, scale=0.2))
        q, k, v = self.heads(x)
        return self.merge(sdpa(q, k, v, attn_mask=mask))


def test_attention_and_normalization_run_as_primitives():
    torch.manual_seed(7)
    m = Attention().eval()
    make = lambda: (torch.randn(2, 9, 32), torch.randn(2, 1, 9, 9))  # noqa: E731
    cm = _module(m, make())
    _check(cm, m, make)
    prog = _group(cm).program
    # every product, softmax, attention, norm and scale-and-shift is a primitive; the
    # head splits and merges over kept buffers are views made once
    assert "aten::scaled_dot_product_attention" not in prog.aten_ops, prog.aten_ops
    assert not {"aten::matmul", "aten::softmax", "aten::layer_norm", "aten::mul",
                "aten::add"} & set(prog.aten_ops), prog.aten_ops
    assert prog.n_fixed_views >= 10, prog.n_fixed_views


def test_a_result_viewing_a_kept_buffer_is_copied_out():
    torch.manual_seed(8)

    class Tail(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(16, 16)
            self.b = torch.nn.Linear(16, 16)

        def forward(self, x):
            h = torch.relu(self.a(x))
            return self.b(h), h.view(-1)  # a view of an intermediate the program keeps

    m = Tail().eval()
    cm = _module(m, (torch.randn(4, 16),))
    x1, x2 = torch.randn(4, 16), torch.randn(4, 16)
    with torch.no_grad():
        first = cm(x1)
        keep = first[1].clone()
        cm(x2)  # must not write into the first call's results
        torch.testing.assert_close(first[1], keep, rtol=0, atol=0)
        torch.testing.assert_close(first[1], m(x1)[1], **TOL)
    assert _group(cm).failed is None and _group(cm).program.n_fixed_views == 1


def test_aten_ops_read_convolution_results_in_the_traced_layout():
    torch.manual_seed(9)

    class Unfold(torch.nn.Module):  # MobileViT's image-to-tokens step, in short
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(8, 16, 3, padding=1)
            self.norm = torch.nn.LayerNorm(16)
            self.fc = torch.nn.Linear(16, 16)

        def forward(self, x):
            y = self.conv(x)  # runs NHWC; this view (channels and rows merged) needs NCHW
            t = y.view(32, 32).transpose(0, 1).reshape(4, 16, 16)
            return self.fc(self.norm(t))

    m = Unfold().eval()
    make = lambda: (torch.randn(1, 8, 8, 8),)  # noqa: E731
    cm = _module(m, make())
    _check(cm, m, make)
    assert _group(cm).failed is None


def test_rms_norm_reductions_and_ops_oneDNN_lacks():
    torch.manual_seed(10)

    class Decoderish(torch.nn.Module):
        """T5's and Llama's RMS norm (a power, a mean kept as a dimension, a reciprocal
        square root, two products), the rotation of half the features (a negated slice:
        no oneDNN kernel for that view), a mean that drops its dimension, and a result
        computed from constants alone."""

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.rand(32) + 0.5)
            self.fc = torch.nn.Linear(32, 32)
            self.register_buffer("freq", torch.rand(32))

        def forward(self, x):
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            h = self.fc(self.w * h)
            rot = torch.cat((-h[..., 16:], h[..., :16]), dim=-1)
            h = h * 0.7 + rot * 0.3
            return h.mean(1), torch.cos(self.freq) * 2

    m = Decoderish().eval()
    make = lambda: (torch.randn(2, 6, 32),)  # noqa: E731
    cm = _module(m, make())
    _check(cm, m, make)
    g = _group(cm)
    assert g.failed is None
    # the norm (its mean over the last dimension included) is primitives; the negation
    # of a strided slice and the mean over a middle dimension have only oneDNN's
    # reference kernels, and the concatenation has none: they run in ATen
    assert sorted(g.program.aten_ops) == ["aten::cat", "aten::mean", "aten::neg"], \
        g.program.aten_ops
    with torch.no_grad():  # the constant result is a fresh tensor each call
        a, b = cm(*make())[1], cm(*make())[1]
    assert a.data_ptr() != b.data_ptr()


class SqueezeExcite(torch.nn.Module):
    """A stem (3 -> 16 channels), a depthwise convolution, squeeze-excitation scaling
    its result for a 1x1 projection to 8 channels (an EfficientNet block)."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.dw = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.se1 = torch.nn.Conv2d(16, 4, 1)
        self.se2 = torch.nn.Conv2d(4, 16, 1)
        self.project = torch.nn.Conv2d(16, 8, 1)

    def forward(self, x):
        x = torch.nn.functional.hardswish(self.stem(x))
        y = torch.nn.functional.silu(self.dw(x))
        s = torch.sigmoid(self.se2(torch.relu(self.se1(y.mean((2, 3), keepdim=True)))))
        return self.project(y * s) + 1.0


def _steps(prog, words):
    return [p.what for p in prog.primitives() if words in p.what]


def test_channel_scale_goes_into_the_projection_weights_at_batch_one():
    torch.manual_seed(7)
    m = SqueezeExcite().eval()
    make1 = lambda: (torch.randn(1, 3, 32, 32),)  # noqa: E731
    cm = _module(m, make1())
    _check(cm, m, make1)
    prog = _group(cm).program
    # 8 output channels x 16 < 16 x 16 pixels: the weights take the scales, per call,
    # and no product of the image is made
    assert prog.n_scaled_weights == 1 and "aten::mul" not in prog.aten_ops
    assert len(_steps(prog, "weights by channel")) == 1
    # the stem reads the NCHW image as it comes; its result is reordered to NHWC after
    assert len(_steps(prog, "result")) == 1
    # a batch of two has one set of scales per image: the product is made
    make2 = lambda: (torch.randn(2, 3, 32, 32),)  # noqa: E731
    cm2 = _module(m, make2())
    _check(cm2, m, make2)
    assert _group(cm2).program.n_scaled_weights == 0


def test_channel_scale_falls_back_to_the_product_when_the_weights_cannot_take_it(
        monkeypatch):
    def refuse(self, pd, w, scale):
        raise dnnl_api.DnnlError("no scaled reorder here")

    monkeypatch.setattr(dnnl_program._Builder, "_scaled_weights", refuse)
    torch.manual_seed(8)
    m = SqueezeExcite().eval()
    make = lambda: (torch.randn(1, 3, 32, 32),)  # noqa: E731
    cm = _module(m, make())
    _check(cm, m, make)
    graph = _group(cm)
    assert graph.failed is None and graph.program.n_scaled_weights == 0


class Mlp(torch.nn.Module):
    """Linears with a GELU, a residual add, a bias-like constant added after, a product
    of a strided view and one of a transposed input (neither dense)."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(32, 96)
        self.down = torch.nn.Linear(96, 32)
        self.out = torch.nn.Linear(32, 24, bias=False)
        self.shift = torch.nn.Parameter(torch.randn(24))

    def forward(self, x):
        y = self.down(torch.nn.functional.gelu(self.up(x))) + x
        return self.out(y) + self.shift, self.out(y[:, ::2]), self.up(x.transpose(0, 1))


def _checked(module, shape: tuple, seed: int, tol=TOL):
    """``module`` made with ``seed``, run as primitives on random inputs of ``shape``
    and checked against eager."""
    torch.manual_seed(seed)
    m = module().eval()
    make = lambda: (torch.randn(*shape),)  # noqa: E731
    cm = _module(m, make())
    _check(cm, m, make, tol=tol)
    return cm


def _checked_mlp(seed: int):
    return _checked(Mlp, (2, 7, 32), seed)


@pytest.mark.parametrize("replaced", [("",), ()], ids=["as-convolutions", "as-products"])
def test_linears_run_as_1x1_convolutions_over_their_rows(monkeypatch, replaced):
    # ("",): every linear whose operands allow it runs as a 1x1 convolution (on AVX2
    # only those oneDNN would run on its generic GEMM do); (): none does
    monkeypatch.setattr(dnnl_program, "_LINEAR_AS_CONV", replaced)
    monkeypatch.setattr(dnnl_program, "_TIME_LINEAR_FORMS", False)
    graph = _group(_checked_mlp(9))
    assert graph.failed is None
    # up and down (GELU and the residual fused), out on the dense result (the constant
    # added fused): three; the strided view and the transposed input stay products
    assert graph.program.n_linears_as_conv == (3 if replaced else 0)


def test_the_faster_linear_form_is_kept_once_timed(monkeypatch):
    # each form timed once per shape; the one measured slower is not used
    monkeypatch.setattr(dnnl_program, "_LINEAR_AS_CONV", ("",))
    monkeypatch.setattr(dnnl_program, "_FORMS_TIMED", {})
    picks = []

    def slower_conv(lib, forms):
        assert len(forms) == 2 and lib.implementation(forms[0][0]).startswith("brgconv")
        picks.append(forms)
        return 1  # the product

    monkeypatch.setattr(dnnl_program, "_faster", slower_conv)
    assert _group(_checked_mlp(10)).program.n_linears_as_conv == 0
    assert len(picks) == 3  # up, down, out: three shapes (with their post-ops)
    # timed for real: either form gives eager's answer, and the choice is remembered
    monkeypatch.undo()
    monkeypatch.setattr(dnnl_program, "_LINEAR_AS_CONV", ("",))
    monkeypatch.setattr(dnnl_program, "_FORMS_TIMED", {})
    cm = _checked_mlp(11)
    assert len(dnnl_program._FORMS_TIMED) == 3
    assert _group(cm).program.n_linears_as_conv == sum(dnnl_program._FORMS_TIMED.values())


class SequenceFirst(torch.nn.Module):
    """Linears on a ``[length, 1, features]`` sequence (torchvision's attention takes its
    input so): no bias with ReLU, a bias with a residual add, no bias and nothing after
    (a group output)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(32, 96, bias=False)
        self.b = torch.nn.Linear(96, 32)
        self.c = torch.nn.Linear(32, 16, bias=False)

    def forward(self, x):
        return self.c(self.b(torch.relu(self.a(x))) + x)


def _checked_sequence_first(seed: int):
    return _checked(SequenceFirst, (9, 1, 32), seed)


def test_a_linear_over_a_batch_runs_as_one_product_over_its_rows(monkeypatch):
    # described with its batch dimensions, oneDNN 3.2 would run 9 products of one row
    monkeypatch.setattr(dnnl_program, "_MKL_LINEARS", False)
    monkeypatch.setattr(dnnl_program, "_LINEAR_AS_CONV", ())
    program = _group(_checked_sequence_first(20)).program
    assert program.n_linears_over_rows == 3 and program.n_mkl_linears == 0


@pytest.mark.skipif(not dnnl_program.mkl_gemm.available(),
                    reason="this torch build exports no MKL packed GEMM")
@pytest.mark.parametrize("mkl", [True, False], ids=["mkl", "onednn"])
@pytest.mark.parametrize("checked", [_checked_mlp, _checked_sequence_first],
                         ids=["mlp", "sequence-first"])
def test_linears_run_on_mkls_packed_gemm_where_timed_faster(monkeypatch, mkl, checked):
    # the bias and post-ops after MKL's product: a bias with GELU, a bias with a residual
    # add, a constant added with no bias, ReLU with no bias, nothing at all
    monkeypatch.setattr(dnnl_program, "_LINEAR_AS_CONV", ())
    monkeypatch.setattr(dnnl_program, "_MKL_TIMED", {})
    timed = []

    def fastest(runs, handicaps=None):
        timed.append(len(runs))
        return 1 if mkl else 0
    monkeypatch.setattr(dnnl_program, "_fastest", fastest)
    program = _group(checked(21)).program
    assert timed == [2, 2, 2]  # each of the three linears over rows: oneDNN, MKL
    assert program.n_mkl_linears == (3 if mkl else 0)


@pytest.mark.skipif(not dnnl_program.mkl_gemm.available(),
                    reason="this torch build exports no MKL packed GEMM")
def test_the_linear_form_timed_for_real_is_remembered(monkeypatch):
    monkeypatch.setattr(dnnl_program, "_LINEAR_AS_CONV", ())
    monkeypatch.setattr(dnnl_program, "_MKL_TIMED", {})
    cm = _checked_sequence_first(22)
    assert len(dnnl_program._MKL_TIMED) == 3
    assert _group(cm).program.n_mkl_linears == sum(dnnl_program._MKL_TIMED.values())
    calls = []
    monkeypatch.setattr(dnnl_program, "_fastest", lambda runs, *_: calls.append(runs) or 0)
    _checked_sequence_first(23)  # the same shapes: not timed again
    assert calls == []


class RmsNorm(torch.nn.Module):
    """T5's and Llama's RMS norm between two linears: a mean of squares, its reciprocal
    square root as a factor per row, then the weight per feature."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 48), torch.nn.Linear(48, 16)
        self.weight = torch.nn.Parameter(torch.randn(48))

    def forward(self, x):
        h = self.a(x)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.b(self.weight * h)


@pytest.mark.parametrize("swap", [True, False], ids=["one-primitive", "two"])
def test_an_rms_norms_two_products_run_as_one_primitive(monkeypatch, swap):
    # oneDNN 3.2 has only reference code for the row's factor with the feature's fused
    # after it, a kernel for the other order
    monkeypatch.setattr(dnnl_program, "_SWAP_PRODUCTS", swap)
    monkeypatch.setattr(dnnl_program, "_RMS_NORM", False)  # (else one kernel of ours)
    # batch 1: with more, oneDNN has only reference code for either order
    cm = _checked(RmsNorm, (1, 5, 32), 25)
    whats = [p.what for p in _group(cm).program.primitives()]
    assert sum(w.startswith("aten::mul") for w in whats) == (1 if swap else 2)


# a stretch of primitives run by one C loop (``native_loop``): the very primitives the
# one-by-one steps run, in the same order, on the same buffers, so bit-identical
needs_loop = pytest.mark.skipif(not native_loop.available(),
                                reason="no C compiler here to build the primitive loop")


def _net_program(monkeypatch, loop: bool):
    monkeypatch.setattr(dnnl_program, "_NATIVE_LOOP", loop)
    torch.manual_seed(3)
    m = Net().eval()
    x = torch.randn(1, 3, 32, 32)
    cm = _module(m, (x,))
    with torch.no_grad():
        cm(x)  # the program is built at the first call: here, under the setting
    return m, cm


@needs_loop
def test_a_stretch_of_primitives_runs_as_one_loop_bit_identical(monkeypatch):
    m, looped = _net_program(monkeypatch, True)
    _, single = _net_program(monkeypatch, False)
    with torch.no_grad():
        for seed in range(3):
            torch.manual_seed(100 + seed)
            x = torch.randn(1, 3, 32, 32)
            got, one, ref = looped(x), single(x), m(x)
            for g, o, r in zip(got, one, ref):
                torch.testing.assert_close(g, o, rtol=0, atol=0)
                torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
    a, b = _group(looped).program, _group(single).program
    assert a.n_runs >= 1 and b.n_runs == 0
    assert len(a.steps) < len(b.steps)
    assert [p.what for p in a.primitives()] == [p.what for p in b.primitives()]
    # the primitives reading the input or writing a result stay steps of their own
    assert any(getattr(s, "fixed", None) is None and hasattr(s, "prim") for s in a.steps)


@needs_loop
def test_a_failing_primitive_in_the_loop_is_named(monkeypatch):
    _, cm = _net_program(monkeypatch, True)
    run = next(s for s in _group(cm).program.steps if isinstance(s, native_loop.Run))
    assert len(run.prims) >= 2
    # (the depthwise convolution may be a kernel of ours, if timed faster: not this one)
    i = next(i for i, p in enumerate(run.prims) if isinstance(p, dnnl_api.Primitive))
    run._handles[i] = None  # oneDNN refuses a null primitive: invalid arguments
    with pytest.raises(dnnl_api.DnnlError, match=re.escape(f"running {run.prims[i].what}")):
        run(None)


def test_without_a_compiler_the_loop_is_not_available(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert native_loop._loop.__wrapped__() is None


def test_without_the_loop_the_program_calls_primitives_one_by_one(monkeypatch):
    monkeypatch.setattr(native_loop, "available", lambda: False)
    m, cm = _net_program(monkeypatch, True)
    prog = _group(cm).program
    assert prog.n_runs == 0 and all(not isinstance(s, native_loop.Run) for s in prog.steps)
    with torch.no_grad():
        x = torch.randn(1, 3, 32, 32)
        for g, r in zip(cm(x), m(x)):
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


class BasicBlocks(torch.nn.Module):
    """Two ResNet basic blocks: 3x3 convolutions with ReLU, the residual added before
    ReLU; the second block downsamples (a strided 3x3 convolution and a 1x1 one on the
    shortcut: not Winograd's)."""

    def __init__(self):
        super().__init__()
        self.a1, self.a2 = (torch.nn.Conv2d(16, 16, 3, padding=1) for _ in range(2))
        self.b1 = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.b2 = torch.nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.down = torch.nn.Conv2d(16, 32, 1, stride=2)

    def forward(self, x):
        x = torch.relu(self.a2(torch.relu(self.a1(x))) + x)
        return torch.relu(self.b2(torch.relu(self.b1(x))) + self.down(x))


class _Decided(dict):
    """A ``_WINOGRAD_TIMED`` where every shape is already decided ``value``."""

    def __init__(self, value):
        super().__init__()
        self.value = value

    def __contains__(self, key):
        return True

    def __getitem__(self, key):
        return self.value


# Winograd's rounding: atol 1e-4 on these O(1) results (see tests/fallback/test_winograd.py)
WINO_TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not dnnl_program.winograd.available(), reason="no C compiler here")
@pytest.mark.parametrize("forced", [True, False], ids=["winograd", "onednn"])
def test_3x3_convolutions_run_as_winograd_where_chosen(monkeypatch, forced):
    monkeypatch.setattr(dnnl_program, "_WINOGRAD_TIMED", _Decided(forced))
    torch.manual_seed(31)
    m = BasicBlocks().eval()
    xs = (torch.randn(2, 16, 12, 10),)
    cm = _module(m, xs)
    _check(cm, m, lambda: (torch.randn(2, 16, 12, 10),), tol=WINO_TOL)
    prog = _group(cm).program
    # a1 (+ReLU), a2 (+residual, ReLU), b2 (no bias, +shortcut, ReLU); not b1 (stride 2)
    assert prog.n_winograd == (3 if forced else 0)
    convs = [p.what for p in prog.primitives() if p.what.startswith("a convolution")]
    assert len(convs) == (2 if forced else 5)


@pytest.mark.skipif(not dnnl_program.winograd.available(), reason="no C compiler here")
def test_winograd_is_timed_for_real_and_remembered(monkeypatch):
    timed = {}
    monkeypatch.setattr(dnnl_program, "_WINOGRAD_TIMED", timed)
    cm = _checked(BasicBlocks, (1, 16, 12, 10), 32, WINO_TOL)
    # three shapes with their post-ops: (16 -> 16, ReLU), (16 -> 16, add, ReLU), (32 -> 32)
    assert len(timed) == 3 and all(isinstance(v, bool) for v in timed.values())
    assert _group(cm).program.n_winograd == sum(timed.values())


def test_without_the_transforms_3x3_convolutions_stay_onednns(monkeypatch):
    monkeypatch.setattr(dnnl_program.winograd, "available", lambda: False)
    monkeypatch.setattr(dnnl_program, "_WINOGRAD_TIMED", _Decided(True))
    cm = _checked(BasicBlocks, (1, 16, 12, 10), 33)
    assert _group(cm).program.n_winograd == 0


class MBConvs(torch.nn.Module):
    """EfficientNet and MobileNetV2 blocks: an expansion with SiLU, a strided 3x3
    depthwise convolution with SiLU and a squeeze-excitation whose mean follows it; a
    5x5 depthwise convolution with ReLU6 and no mean (a residual add after it would be
    a binary post-op: not ours); one reading the group's input
    (its buffer changes per call) with hardswish, its result a group output."""

    def __init__(self):
        super().__init__()
        self.expand = torch.nn.Conv2d(16, 32, 1)
        self.dw = torch.nn.Conv2d(32, 32, 3, stride=2, padding=1, groups=32)
        self.se1, self.se2 = torch.nn.Conv2d(32, 8, 1), torch.nn.Conv2d(8, 32, 1)
        self.project = torch.nn.Conv2d(32, 16, 1)
        self.dw5 = torch.nn.Conv2d(16, 16, 5, padding=2, groups=16, bias=False)
        self.pw = torch.nn.Conv2d(16, 16, 1)
        self.dw_in = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)

    def forward(self, x):
        y = torch.nn.functional.silu(self.dw(torch.nn.functional.silu(self.expand(x))))
        s = torch.sigmoid(self.se2(torch.nn.functional.silu(self.se1(y.mean((2, 3), True)))))
        z = self.project(y * s)
        z = self.pw(torch.nn.functional.hardtanh(self.dw5(z), 0.0, 6.0))
        return z, torch.nn.functional.hardswish(self.dw_in(x))


DW_TOL = dict(rtol=1e-4, atol=1e-5)  # (tests/fallback/test_depthwise.py: 4e-6 of the max)
needs_dw = pytest.mark.skipif(not dnnl_program.depthwise.available(),
                              reason="no C compiler here")


@needs_dw
@pytest.mark.parametrize("forced", [True, False], ids=["ours", "onednn"])
def test_depthwise_convolutions_run_as_ours_where_chosen(monkeypatch, forced):
    monkeypatch.setattr(dnnl_program, "_DEPTHWISE_TIMED", _Decided(forced))
    cm = _checked(MBConvs, (2, 16, 14, 12), 41, DW_TOL)
    prog = _group(cm).program
    assert prog.n_depthwise == (3 if forced else 0)
    # the squeeze-excitation's mean comes from the depthwise convolution's rows
    assert prog.n_pooled == (1 if forced else 0)
    means = [p.what for p in prog.primitives() if p.what.startswith("a mean")]
    assert len(means) == (0 if forced else 1)
    dws = [p.what for p in prog.primitives() if p.what.startswith("a depthwise")]
    if forced and native_loop.available():  # the two on fixed buffers join the C loop
        assert len(dws) == 2


@needs_dw
def test_depthwise_is_timed_for_real_and_remembered(monkeypatch):
    timed = {}
    monkeypatch.setattr(dnnl_program, "_DEPTHWISE_TIMED", timed)
    cm = _checked(MBConvs, (1, 16, 14, 12), 42, DW_TOL)
    assert len(timed) == 3 and all(isinstance(v, bool) for v in timed.values())
    # (batch, channels, h, w, kernel, stride, bias, activation, mean after)
    assert sorted(k[4:6] + k[-1:] for k in timed) == [(3, 1, False), (3, 2, True),
                                                      (5, 1, False)]
    assert _group(cm).program.n_depthwise == sum(timed.values())


@needs_dw
def test_a_mean_not_right_after_its_depthwise_convolution_is_a_pooling(monkeypatch):
    class Apart(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dw = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
            self.pw, self.pw2 = torch.nn.Conv2d(16, 16, 1), torch.nn.Conv2d(16, 16, 1)

        def forward(self, x):
            y = torch.nn.functional.silu(self.dw(x))
            z = self.pw(y)  # planned between the depthwise convolution and the mean
            return self.pw2(z) * y.mean((2, 3), True)

    monkeypatch.setattr(dnnl_program, "_DEPTHWISE_TIMED", _Decided(True))
    cm = _checked(Apart, (1, 16, 9, 9), 43, DW_TOL)
    prog = _group(cm).program
    assert prog.n_depthwise == 1 and prog.n_pooled == 0


@needs_dw
def test_without_the_kernel_depthwise_convolutions_stay_onednns(monkeypatch):
    monkeypatch.setattr(dnnl_program.depthwise, "available", lambda: False)
    monkeypatch.setattr(dnnl_program, "_DEPTHWISE_TIMED", _Decided(True))
    cm = _checked(MBConvs, (1, 16, 14, 12), 44)
    assert _group(cm).program.n_depthwise == 0


@needs_dw
@needs_loop
def test_a_failing_kernel_in_the_loop_is_named(monkeypatch):
    monkeypatch.setattr(dnnl_program, "_DEPTHWISE_TIMED", _Decided(True))
    cm = _checked(MBConvs, (1, 16, 14, 12), 45, DW_TOL)
    run = next(s for s in _group(cm).program.steps if isinstance(s, native_loop.Run)
               and any(isinstance(p, native_loop.Kernel) for p in s.prims))
    i = next(i for i, p in enumerate(run.prims) if isinstance(p, native_loop.Kernel))
    failing = c_compiler.load("int aot_fails(const void *a) { return 7; }", ["-O2"], "a test")
    run._kernels[i] = C.cast(failing.aot_fails, C.c_void_p).value
    with pytest.raises(dnnl_api.DnnlError,
                       match=re.escape(f"running {run.prims[i].what} (status 7)")):
        run(None)


needs_att = pytest.mark.skipif(not dnnl_program.attention.available(),
                               reason="no C compiler here")


def _attention_program(monkeypatch, timed, seed):
    monkeypatch.setattr(dnnl_program, "_ATTENTION_TIMED", timed)
    torch.manual_seed(seed)
    m = Attention().eval()
    make = lambda: (torch.randn(2, 9, 32), torch.randn(2, 1, 9, 9))  # noqa: E731
    cm = _module(m, make())
    # (tests/fallback/test_attention.py: within 4e-6 of the largest value)
    _check(cm, m, make, tol=dict(rtol=1e-4, atol=2e-5))
    return _group(cm).program


@needs_att
@pytest.mark.parametrize("forced", [True, False], ids=["ours", "onednn"])
def test_attention_runs_as_one_kernel_where_chosen(monkeypatch, forced):
    prog = _attention_program(monkeypatch, _Decided(forced), 51)
    # the four scaled_dot_product_attention calls (no mask, causal, a boolean constant,
    # the input's mask: its buffer changes per call); the product and softmax written
    # out stay primitives
    assert prog.n_attention == (4 if forced else 0)
    scores = [p.what for p in prog.primitives() if p.what.startswith("the scores")]
    assert len(scores) == (0 if forced else 4)


@needs_att
def test_attention_is_timed_for_real_and_remembered(monkeypatch):
    timed = {}
    prog = _attention_program(monkeypatch, timed, 52)
    # (batch, heads, queries, keys, dims, value dims, mask): the last three masked
    assert sorted(timed) == [(2, 4, 9, 9, 8, 8, False), (2, 4, 9, 9, 8, 8, True)]
    assert prog.n_attention == 3 * timed[(2, 4, 9, 9, 8, 8, True)] + timed[
        (2, 4, 9, 9, 8, 8, False)]


def test_without_the_kernel_attention_stays_three_primitives(monkeypatch):
    monkeypatch.setattr(dnnl_program.attention, "available", lambda: False)
    prog = _attention_program(monkeypatch, _Decided(True), 53)
    assert prog.n_attention == 0


class RmsNorms(torch.nn.Module):
    """T5's norm (the weight times the normalized rows) after a linear, Llama's (the
    rows times the weight) on the input itself, a norm without weight whose rsqrt is
    read twice (not one kernel: the chain must be the only user)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(40, 40)
        self.w1, self.w2 = torch.nn.Parameter(torch.randn(40)), torch.nn.Parameter(
            torch.randn(40))

    def forward(self, x):
        y = self.lin(x)
        y = self.w1 * (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6))
        z = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)) * self.w2
        r = torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.lin(z) + y, y * r + r


@pytest.mark.skipif(not dnnl_program.rms_norm.available(), reason="no C compiler here")
@pytest.mark.parametrize("on", [True, False])
def test_rms_norms_run_as_one_kernel(monkeypatch, on):
    monkeypatch.setattr(dnnl_program, "_RMS_NORM", on)
    cm = _checked(RmsNorms, (2, 6, 40), 61, dict(rtol=1e-4, atol=1e-5))
    prog = _group(cm).program
    # the first two (one on the group's input: read where it arrives each call)
    assert prog.n_rms_norm == (2 if on else 0)
    assert not {"aten::pow", "aten::rsqrt", "aten::mean"} & set(prog.aten_ops)
