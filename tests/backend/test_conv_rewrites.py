"""Compiled 1x1 convolutions are a (subsample +) matmul over channels, kxk ones a matmul
over im2col columns (IREE's convolution forms are 2.5-150x slower), with eager's values
(float32 rtol 1e-5 / atol 1e-5: IREE's summation order); grouped and dilated ones keep
their form."""

import re

import pytest
import torch

import aot
from aot.importer import import_model
from aot.partition.partitioner import partition
from aot.backend.lower import lower
from aot.partition.placement import PlacementPolicy
from aot.toolchain.targets import get_target


@pytest.mark.parametrize("stride,groups,bias,hw", [
    (2, 1, True, (9, 9)), ((2, 1), 1, False, (8, 7)), (3, 2, True, (10, 11)), (2, 4, True, (1, 5)),
])
def test_strided_1x1_conv_gives_eagers_values(stride, groups, bias, hw):
    torch.manual_seed(0)
    m = torch.nn.Conv2d(8, 16, 1, stride=stride, groups=groups, bias=bias).eval()
    x = torch.randn(2, 8, *hw)
    cm = aot.compile(m, (x,), placement="coverage")
    assert [p["where"] for p in cm.manifest["placements"]] == ["compiled"]
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("k,stride,pad,bias,hw", [
    (3, 2, 1, True, (11, 10)), (7, 2, 3, True, (20, 19)), ((3, 5), (2, 1), (1, 2), False, (9, 8)),
    (3, 3, 0, True, (10, 10)), (3, 1, 1, True, (9, 8)), (5, 1, 0, False, (12, 12)),
    ((1, 3), 1, (0, 1), True, (7, 7)),
])
def test_kxk_conv_gives_eagers_values(k, stride, pad, bias, hw):
    torch.manual_seed(0)
    m = torch.nn.Conv2d(6, 10, k, stride=stride, padding=pad, bias=bias).eval()
    x = torch.randn(2, 6, *hw)
    cm = aot.compile(m, (x,), placement="coverage")
    assert {p["where"] for p in cm.manifest["placements"]} == {"compiled"}
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)


def test_the_compiled_form_is_a_subsample_and_a_matmul():
    m = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 1, stride=2), torch.nn.ReLU()).eval()
    p = lower(partition(import_model(m, (torch.randn(1, 8, 8, 8),)), get_target("cpu"),
                        PlacementPolicy("auto", (), "coverage")))
    assert p.mlir.count("torch.aten.slice.Tensor") == 2
    assert "torch.aten.conv2d" not in p.mlir and "torch.aten.matmul" in p.mlir


def test_a_strided_1x1_conv_in_aten_keeps_its_form():
    m = torch.nn.Conv2d(8, 16, 1, stride=2).eval()
    p = lower(partition(import_model(m, (torch.randn(1, 8, 8, 8),)), get_target("cpu"),
                        PlacementPolicy("auto", ("aten.conv2d",), "coverage")))
    assert "torch.aten.slice.Tensor" not in p.mlir


@pytest.mark.parametrize("hw", [(9, 9), (20, 20)])
def test_an_unstrided_kxk_conv_is_im2col_by_slices_and_a_matmul_without_named_kernels(
        monkeypatch, hw):
    monkeypatch.setattr("aot.backend.lower.named_kernels", lambda target: False)
    conv = torch.nn.Conv2d(4, 4, 3, padding=1)
    p = lower(partition(import_model(conv.eval(), (torch.randn(1, 4, *hw),)), get_target("cpu"),
                        PlacementPolicy("auto", (), "coverage")))
    assert "torch.aten.conv2d" not in p.mlir and "torch.aten.matmul" in p.mlir
    assert p.mlir.count("torch.aten.slice.Tensor") == 18  # 9 windows of the padded input: rows, cols
    assert "aot_cc.im2col" not in p.mlir


@pytest.mark.parametrize("hw,gathered", [((9, 9), True), ((32, 12), True), ((20, 20), False),
                                         ((6, 56), False)])
def test_an_unstrided_kxk_conv_on_the_cpu_gathers_its_columns_where_rows_are_whole_vectors(
        hw, gathered):
    """IREE's CPU backend: one copy (``linalg_kernels.im2col``) for output rows of whole
    16-lane vectors or at most 16 wide; a slice per tap for the others."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(4, 5, 3, padding=1).eval()
    x = torch.randn(1, 4, *hw)
    p = lower(partition(import_model(conv, (x,)), get_target("cpu"),
                        PlacementPolicy("auto", (), "coverage")))
    assert "torch.aten.conv2d" not in p.mlir and "torch.aten.matmul" in p.mlir
    assert (p.mlir.count("call @aot_cc.im2col_") == 1) == gathered
    assert p.mlir.count("torch.aten.slice.Tensor") == (0 if gathered else 18)
    cm = aot.compile(conv, (x,), placement="coverage")
    with torch.no_grad():
        torch.testing.assert_close(cm(x), conv(x), rtol=1e-5, atol=1e-5)


def test_im2col_is_one_function_per_signature_and_strided_kernels_keep_their_unfolds():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.Conv2d(3, 3, 3, padding=1),
                            torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)).eval()
    x = torch.randn(2, 3, 16, 16)
    p = lower(partition(import_model(m, (x,)), get_target("cpu"), PlacementPolicy("auto", (),
                        "coverage")))
    assert p.mlir.count("func.func private @aot_cc.im2col_") == 1
    assert p.mlir.count("call @aot_cc.im2col_") == 2
    assert p.mlir.count("torch.aten.unfold") == 2
    cm = aot.compile(m, (x,), placement="coverage")
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)


def test_im2col_eager_kernel_matches_slices():
    from aot.toolchain.linalg_kernels import im2col
    x = torch.randn(2, 3, 7, 9)
    cols = im2col(x, 3, 2, 1, 1)
    assert cols.shape == (2, 3, 3, 2, 5, 8) and cols.is_contiguous()
    for i in range(3):
        for j in range(2):
            assert torch.equal(cols[:, :, i, j], x[:, :, i:i + 5, j:j + 8])


def test_a_strided_kxk_conv_is_two_unfolds_a_transpose_and_a_matmul():
    """Strided windows as ``unfold`` views and one transposing copy (one IREE dispatch),
    not one strided slice per tap (49 for a 7x7 stem)."""
    conv = torch.nn.Conv2d(3, 8, 7, stride=2, padding=3)
    p = lower(partition(import_model(conv.eval(), (torch.randn(1, 3, 20, 19),)), get_target("cpu"),
                        PlacementPolicy("auto", (), "coverage")))
    assert p.mlir.count("torch.aten.unfold") == 2 and "torch.aten.stack" not in p.mlir
    assert "torch.aten.slice.Tensor" not in p.mlir and "torch.aten.matmul" in p.mlir


@pytest.mark.parametrize("k,hw,batch", [(4, (16, 16), 1), ((2, 3), (9, 13), 2), (16, (33, 32), 1)])
def test_a_patch_embedding_is_a_view_a_transpose_and_a_matmul(k, hw, batch):
    """Stride equal to the kernel (ViT's, Swin's stems): the windows do not overlap, so
    im2col is a view and one transposing copy, not a slice per tap (the rows and columns
    no window reads are sliced off first)."""
    torch.manual_seed(0)
    m = torch.nn.Conv2d(3, 8, k, stride=k).eval()
    x = torch.randn(batch, 3, *hw)
    imported = import_model(m, (x,))
    p = lower(partition(imported, get_target("cpu"), PlacementPolicy("auto", (), "coverage")))
    assert "torch.aten.stack" not in p.mlir and "torch.aten.permute" in p.mlir
    assert p.mlir.count("torch.aten.slice.Tensor") <= 2
    cm = aot.compile(m, (x,), placement="coverage")
    assert {p["where"] for p in cm.manifest["placements"]} == {"compiled"}
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)


def test_grouped_and_dilated_kxk_convs_keep_their_form():
    for conv in (torch.nn.Conv2d(4, 4, 3, padding=1, groups=2),
                 torch.nn.Conv2d(4, 4, 3, 2, dilation=2)):
        p = lower(partition(import_model(conv.eval(), (torch.randn(1, 4, 9, 9),)),
                            get_target("cpu"),
                            PlacementPolicy("auto", (), "coverage")))
        assert "torch.aten.conv2d" in p.mlir and "torch.aten.matmul" not in p.mlir


@pytest.fixture
def shifts(monkeypatch):
    """Depthwise convolutions as the targets without named kernels compile them
    (``linalg_kernels.named_kernels`` false: CUDA, StableHLO): shifted multiply-adds."""
    monkeypatch.setattr("aot.backend.lower.named_kernels", lambda target: False)
    monkeypatch.setattr("aot.toolchain.linalg_kernels.named_kernels", lambda target: False)


@pytest.mark.parametrize("k,stride,pad,bias,hw", [
    (3, 2, 1, False, (11, 10)), (5, 1, 2, True, (10, 10)), ((3, 1), (2, 1), (1, 0), True, (7, 9)),
    (5, 2, 2, True, (13, 12)), (3, 3, 0, False, (10, 11)), (3, 2, 0, True, (9, 9)),
    (7, 1, 3, True, (9, 10)), ((1, 5), 2, (0, 2), False, (6, 9)), (9, 2, 4, True, (20, 17)),
])
def test_depthwise_conv_as_named_channels_last_conv_gives_eagers_values(k, stride, pad, bias, hw):
    """On the CPU a strided or larger than 3x3 depthwise convolution is IREE's named
    channels-last one between permutations, in a dispatch region of its own."""
    torch.manual_seed(0)
    m = torch.nn.Conv2d(6, 6, k, stride=stride, padding=pad, groups=6, bias=bias).eval()
    x = torch.randn(2, 6, *hw)
    p = lower(partition(import_model(m, (x,)), get_target("cpu"), PlacementPolicy("auto", (),
                        "coverage")))
    assert "torch.aten.conv2d" not in p.mlir and "aot_cc" in p.mlir
    assert p.mlir.count("linalg.depthwise_conv_2d_nhwc_hwc") == 1
    assert p.mlir.count("flow.dispatch.region") == 1
    assert "util.optimization_barrier" not in p.mlir
    cm = aot.compile(m, (x,), placement="coverage")
    assert {pl["where"] for pl in cm.manifest["placements"]} == {"compiled"}
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)


def test_unstrided_3x3_and_half_precision_depthwise_convs_stay_shifted():
    for conv, x in ((torch.nn.Conv2d(6, 6, 3, padding=1, groups=6), torch.randn(1, 6, 9, 9)),
                    (torch.nn.Conv2d(6, 6, 5, 2, 2, groups=6).half(),
                     torch.randn(1, 6, 9, 9).half())):
        p = lower(partition(import_model(conv.eval(), (x,)), get_target("cpu"),
                            PlacementPolicy("auto", (), "coverage")))
        assert "aot_cc" not in p.mlir and "torch.aten.mul.Tensor" in p.mlir


def test_named_kernels_are_for_the_cpu_from_the_torch_dialect_only():
    import dataclasses

    from aot.toolchain.linalg_kernels import named_kernels
    cpu = get_target("cpu")
    assert named_kernels(cpu)
    assert not named_kernels(dataclasses.replace(cpu, via="stablehlo"))
    assert not named_kernels(get_target("cuda"))


def test_two_depthwise_convs_of_one_signature_share_one_kernel_function():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(6, 6, 5, padding=2, groups=6), torch.nn.ReLU(),
                            torch.nn.Conv2d(6, 6, 5, padding=2, groups=6),
                            torch.nn.Conv2d(6, 6, 3, 2, 1, groups=6)).eval()
    x = torch.randn(1, 6, 12, 12)
    p = lower(partition(import_model(m, (x,)), get_target("cpu"), PlacementPolicy("auto", (),
                        "coverage")))
    assert p.mlir.count("linalg.depthwise_conv_2d_nhwc_hwc") == 2
    assert p.mlir.count("call @aot_cc.depthwise_nhwc_") == 3
    cm = aot.compile(m, (x,), placement="coverage")
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)


def test_depthwise_convs_run_in_one_submission_without_host_waits():
    """The named convolution stays a dispatch of its own (not folded with its
    permutations into a generic convolution), and the program is one submission: no
    host round trip between the dispatches (an optimisation barrier made two per
    convolution)."""
    import dataclasses

    from aot.toolchain.iree_compile import try_compile
    m = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 5, padding=2, groups=8), torch.nn.Hardswish(),
                            torch.nn.Conv2d(8, 8, 3, 2, 1, groups=8), torch.nn.ReLU()).eval()
    x = torch.randn(1, 8, 12, 12)
    target = get_target("cpu")
    p = lower(partition(import_model(m, (x,)), target, PlacementPolicy("auto", (), "coverage")))
    stream, diag = try_compile(p.mlir, dataclasses.replace(
        target, flags=(*target.flags, "--compile-to=stream")))
    assert stream is not None, diag
    main = stream.decode().split("util.func public @main$async(", 1)[1].split("util.func", 1)[0]
    dispatches = re.findall(r"stream\.cmd\.dispatch @\S+::@(\S+?)[ (]", main)
    assert sum("depthwise_conv_2d_nhwc_hwc" in d for d in dispatches) == 2, dispatches
    assert main.count("stream.cmd.execute") == 1
    assert "stream.timepoint.await" not in main


@pytest.mark.parametrize("k,stride,pad,bias,hw", [
    (3, 1, 1, True, (9, 8)), (3, 2, 1, False, (11, 10)), (5, 1, 2, True, (10, 10)),
    ((3, 1), (2, 1), (1, 0), True, (7, 9)), (3, 1, 0, True, (6, 6)),
    (5, 2, 2, True, (13, 12)), (3, 3, 0, False, (10, 11)), (3, 2, 0, True, (9, 9)),
    (7, 1, 3, True, (9, 10)),
])
def test_depthwise_conv_as_shifted_multiply_adds_gives_eagers_values(k, stride, pad, bias, hw,
                                                                   shifts):
    torch.manual_seed(0)
    m = torch.nn.Conv2d(6, 6, k, stride=stride, padding=pad, groups=6, bias=bias).eval()
    x = torch.randn(2, 6, *hw)
    p = lower(partition(import_model(m, (x,)), get_target("cpu"), PlacementPolicy("auto", (),
                        "coverage")))
    assert "torch.aten.conv2d" not in p.mlir and "torch.aten.mul.Tensor" in p.mlir
    cm = aot.compile(m, (x,), placement="coverage")
    assert {pl["where"] for pl in cm.manifest["placements"]} == {"compiled"}
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act,k,stride,pad,hw", [
    (torch.nn.ReLU6, 3, 2, 1, (11, 10)), (torch.nn.ReLU6, 5, 2, 2, (13, 12)),
    (torch.nn.Hardswish, (3, 5), (2, 3), (1, 2), (9, 14)), (torch.nn.SiLU, 3, 2, 1, (11, 10)),
    (torch.nn.SiLU, 3, 3, 0, (10, 11)), (torch.nn.ReLU6, 3, 3, 0, (10, 11)),
])
def test_strided_depthwise_conv_after_an_activation_gives_eagers_values(act, k, stride, pad, hw,
                                                                     shifts):
    # the stride phases are split before the padding after a cheap activation (ReLU6,
    # hardswish: IREE may fuse it into the split), after it otherwise (SiLU)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 1), act(),
                            torch.nn.Conv2d(6, 6, k, stride, pad, groups=6)).eval()
    x = torch.randn(2, 3, *hw)
    p = lower(partition(import_model(m, (x,)), get_target("cpu"), PlacementPolicy("auto", (),
                        "coverage")))
    assert "torch.aten.conv2d" not in p.mlir and "torch.aten.permute" in p.mlir
    cm = aot.compile(m, (x,), placement="coverage")
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)


def test_strided_depthwise_taps_read_unit_stride_windows_of_the_phases(shifts):
    # a strided tap reads one stride phase of the padded input, not a strided slice
    conv = torch.nn.Conv2d(6, 6, 5, 2, 2, groups=6).eval()
    p = lower(partition(import_model(conv, (torch.randn(1, 6, 9, 9),)), get_target("cpu"),
                        PlacementPolicy("auto", (), "coverage")))
    assert "torch.aten.conv2d" not in p.mlir and "torch.aten.permute" in p.mlir
    steps = re.findall(r"torch.aten.slice.Tensor %\S+, %\S+, %\S+, %\S+, %(\S+) :", p.mlir)
    assert steps and {p.mlir.split(f"%{s} = torch.constant.int ")[1].split()[0]
                      for s in steps} == {"1"}


def test_depthwise_convs_with_a_channel_multiplier_or_large_kernel_keep_their_form(shifts):
    # a 7x7 kernel is shifted only for an output of at most 2.5 MiB (here 3.7 MiB)
    for conv, shape in ((torch.nn.Conv2d(4, 8, 3, padding=1, groups=4), (1, 4, 9, 9)),
                        (torch.nn.Conv2d(64, 64, 7, padding=3, groups=64), (1, 64, 120, 120)),
                        (torch.nn.Conv2d(4, 4, 9, padding=4, groups=4), (1, 4, 9, 9))):
        p = lower(partition(import_model(conv.eval(), (torch.randn(*shape),)), get_target("cpu"),
                            PlacementPolicy("auto", (), "coverage")))
        assert "torch.aten.conv2d" in p.mlir


@pytest.mark.parametrize("named", [False, True])
def test_emitted_nodes_carry_fake_values_of_the_programs_mode(named):
    """The rewrites work out values on meta tensors (``rewrite_nodes.shadow``); every node
    they emit still carries a fake tensor of the exported program's mode, with the
    sizes the op has."""
    from torch._subclasses.fake_tensor import FakeTensor

    from aot.forms.compiled_forms import emit
    from aot.toolchain.linalg_kernels import depthwise_nhwc
    m = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8),
                            torch.nn.Conv2d(8, 4, 3, padding=1)).eval()
    ep = torch.export.export(m, (torch.randn(1, 8, 9, 9),))
    g, env = torch.fx.Graph(), {}
    convs = 0
    for n in ep.graph.nodes:
        new = emit(n, g, env, named)
        convs += new is not None
        env[n] = new if new is not None else g.node_copy(n, lambda a: env[a])
        if new is not None:
            assert new.meta["val"] is n.meta["val"]
    assert convs == 2
    assert any(n.target is depthwise_nhwc for n in g.nodes) == named
    mode = next(n.meta["val"] for n in ep.graph.nodes if n.op == "placeholder").fake_mode
    emitted = [n for n in g.nodes if n.op == "call_function"]
    assert len(emitted) > (8 if named else 20)
    for n in emitted:
        val = n.meta["val"]
        assert isinstance(val, FakeTensor) and val.fake_mode is mode and val.device.type == "cpu"
        real = n.target(*[a.meta["val"] if isinstance(a, torch.fx.Node) else
                          [x.meta["val"] for x in a] if isinstance(a, list) and a and
                          isinstance(a[0], torch.fx.Node) else a for a in n.args])
        assert real.shape == val.shape and real.dtype == val.dtype
