"""Kernel-level comparisons behind the prepacked ATen regions (``aot/fallback/prepack.py``).

For each case, interleaved calls, median of ``--runs``:

- ResNet18 (batch 1) convolutions: ATen's ``conv2d`` as eager calls it, against
  ``mkldnn._convolution_pointwise`` on a weight packed once (NHWC input), per layer and
  summed over the 20 convolutions;
- BERT attention (1x4x128x32): ``softmax(q @ k^T / c) @ v`` written out, against
  ``scaled_dot_product_attention``;
- quantized 3x3 convolutions (+ReLU): ATen's ``quantized.conv2d_relu`` (x86 engine),
  against oneDNN's ``onednn.qconv2d_pointwise`` on a weight packed once;
- the quantized ResNet18's 20 convolutions (x86 qconfig, their own inputs):
  ``quantized.conv2d[_relu]`` on weights packed by the x86 engine (as eager) against the
  same op on weights packed by oneDNN (what an artifact compiled under the onednn engine runs);
- MobileNetV2 (batch 1, torchvision, random weights) compiled with the defaults (one
  prepacked ATen region): each oneDNN convolution timed inside the model's calls, the same
  calls alone on their own inputs (weights and outputs hot in cache), and ONNX Runtime's
  convolutions as its profiler times them inside its own run. This is the measurement
  behind issue 15's closing note: how much of the gap to ONNX Runtime is the kernels
  and how much is memory placement.

    python benchmarks/kernels.py [--runs 50] [--only resnet18,attention,int8,mobilenet]
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import time

import torch

from aot import timing


def _interleaved(fns: dict, runs: int) -> dict:
    return timing.medians(timing.interleaved(fns, runs, warmup=3))


def resnet18_convs(runs: int) -> None:
    from aot.models.resnet18 import resnet18
    model, (x,) = resnet18(batch=1)
    inputs = {}
    def keep(m, i, o):
        inputs.setdefault(m, i[0])  # returns None: the output is left as it is
    hooks = [c.register_forward_hook(keep) for c in model.modules()
             if isinstance(c, torch.nn.Conv2d)]
    model(x)
    for h in hooks:
        h.remove()
    tot = {"aten": 0.0, "packed": 0.0}
    for c, xi in inputs.items():
        w = c.weight
        b = c.bias if c.bias is not None else torch.zeros(w.shape[0])
        p, s, d = list(c.padding), list(c.stride), list(c.dilation)
        xcl = xi.contiguous(memory_format=torch.channels_last)
        pw = torch.ops.mkldnn._reorder_convolution_weight(w, p, s, d, c.groups, list(xi.shape))
        t = _interleaved({
            "aten": lambda: torch.nn.functional.conv2d(xi, w, b, s, p, d, c.groups),
            "packed": lambda: torch.ops.mkldnn._convolution_pointwise(
                xcl, pw, b, p, s, d, c.groups, "none", [], ""),
        }, runs)
        for k in tot:
            tot[k] += t[k]
        print(f"  conv {tuple(w.shape)} on {tuple(xi.shape)}: aten {t['aten']:.3f} ms, "
              f"packed oneDNN {t['packed']:.3f} ms")
    print(f"ResNet18 convolutions, sum of medians: aten {tot['aten']:.2f} ms, "
          f"packed oneDNN {tot['packed']:.2f} ms ({tot['aten'] / tot['packed']:.2f}x)")


def attention(runs: int) -> None:
    b, h, s, d = 1, 4, 128, 32
    q, k, v = torch.randn(b, s, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)
    t = _interleaved({
        "written out": lambda: torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), -1) @ v,
        "sdpa": lambda: torch.ops.aten.scaled_dot_product_attention.default(
            q, k, v, None, 0.0, False, scale=1 / math.sqrt(d)),
    }, runs)
    print(f"BERT attention {b}x{h}x{s}x{d}: written out {t['written out'] * 1e3:.0f} us, "
          f"scaled_dot_product_attention {t['sdpa'] * 1e3:.0f} us")


def quantized_convs(runs: int) -> None:
    torch.backends.quantized.engine = "x86"
    for c, hw, oc in [(64, 56, 64), (128, 28, 128), (256, 14, 256), (512, 7, 512)]:
        xs, xz, os_, oz = 0.02, 3, 0.05, 2
        qx = torch.quantize_per_tensor(torch.rand(1, c, hw, hw), xs, xz, torch.quint8)
        qx = qx.contiguous(memory_format=torch.channels_last)
        ws = torch.rand(oc, dtype=torch.float64) * 0.01 + 0.001
        qw = torch.quantize_per_channel(torch.randn(oc, c, 3, 3) * 0.1, ws,
                                        torch.zeros(oc, dtype=torch.long), 0, torch.qint8)
        bias = torch.randn(oc)
        packed = torch.ops.quantized.conv2d_prepack(qw, bias, [1, 1], [1, 1], [1, 1], 1)
        opk = torch.ops.onednn.qconv_prepack(qw.int_repr(), ws.float(), xs, xz, [1, 1], [1, 1],
                                             [1, 1], 1, [1, c, hw, hw])
        xu, wz = qx.int_repr(), torch.zeros(oc, dtype=torch.long)
        t = _interleaved({
            "x86": lambda: torch.ops.quantized.conv2d_relu(qx, packed, os_, oz),
            "onednn": lambda: torch.ops.onednn.qconv2d_pointwise(
                xu, xs, xz, opk, ws.float(), wz, bias, [1, 1], [1, 1], [1, 1], 1, os_, oz,
                torch.uint8, "relu", [], ""),
        }, runs)
        print(f"int8 conv3x3+relu {c}->{oc} at {hw}x{hw}: quantized (x86 engine) "
              f"{t['x86']:.3f} ms, oneDNN qconv {t['onednn']:.3f} ms")


def resnet18_int8_convs(runs: int) -> None:
    try:
        from aot.models.quantized_resnet18 import quantized_resnet18
        model, (x,) = quantized_resnet18("x86")
    except ImportError as e:  # torchvision is a test dependency
        print(f"quantized ResNet18 convolutions: skipped ({e})")
        return
    if "onednn" not in torch.backends.quantized.supported_engines:
        print("quantized ResNet18 convolutions: skipped (no oneDNN quantized engine)")
        return
    seen = []
    hooks = [m.register_forward_hook(lambda m, i, o: seen.append((m, i[0])))
             for m in model.modules() if type(m).__module__.startswith("torch.ao.nn.quantized")
             and type(m).__name__ in ("Conv2d", "ConvReLU2d")]
    model(x)
    for h in hooks:
        h.remove()
    total = {"x86": 0.0, "onednn": 0.0}
    for m, inp in seen:
        op = (torch.ops.quantized.conv2d_relu if type(m).__name__ == "ConvReLU2d"
              else torch.ops.quantized.conv2d)
        packs = {}
        for engine in total:
            torch.backends.quantized.engine = engine
            packs[engine] = torch.ops.quantized.conv2d_prepack(
                m.weight(), m.bias(), list(m.stride), list(m.padding), list(m.dilation), m.groups)
        torch.backends.quantized.engine = "x86"
        t = _interleaved({e: (lambda p=p: op(inp, p, m.scale, m.zero_point))
                          for e, p in packs.items()}, runs)
        for e in total:
            total[e] += t[e]
    print(f"quantized ResNet18 convolutions, sum of medians: weights packed by the x86 engine "
          f"{total['x86']:.2f} ms, by oneDNN {total['onednn']:.2f} ms "
          f"({total['x86'] / total['onednn']:.2f}x)")


def mobilenet_v2_in_model(runs: int) -> None:
    import collections
    import torchvision
    import aot
    from aot.fallback import prepack
    torch.manual_seed(0)
    model, x = torchvision.models.mobilenet_v2().eval(), torch.randn(1, 3, 224, 224)
    ort = _onnxruntime_conv_ms(model, x, runs)  # first: torch's spinning threads would slow it
    compiled = aot.compile(model, (x,))
    in_model, calls = collections.defaultdict(list), {}
    plain = prepack.PackedConv.__call__

    def timed(self, env):  # this benchmark's own probe, never installed by aot
        args, _ = self.conv.bind(env)
        t = time.perf_counter()
        y = plain(self, env)
        in_model[id(self)].append(time.perf_counter() - t)
        calls.setdefault(id(self), (self, args, None if self.other_slot is None
                                    else env[self.other_slot]))
        return y
    prepack.PackedConv.__call__ = timed
    try:
        for _ in range(runs + 5):
            compiled(x)
    finally:
        prepack.PackedConv.__call__ = plain
    alone = 0.0
    for key, (pc, args, other) in calls.items():
        env = list(args) + ([] if other is None else [other])
        conv = _Rebound(pc, env)
        alone += _interleaved({"c": lambda: plain(conv, env)}, runs)["c"]
    inside = sum(statistics.median(v[5:]) for v in in_model.values()) * 1e3
    print(f"MobileNetV2 b1, {len(calls)} oneDNN convolutions (sum of medians): "
          f"inside the model {inside:.2f} ms, alone on the same inputs {alone:.2f} ms")
    if ort is not None:
        print(f"  ONNX Runtime's convolutions inside its own run: {ort:.2f} ms")


class _Rebound:
    """A PackedConv reading its operands from a fixed list: input, weight, bias[, other]."""

    def __init__(self, pc, env):
        self.__dict__.update(pc.__dict__)
        n = len(env) - (0 if pc.other_slot is None else 1)
        self.conv = type("Bound", (), {"bind": lambda _, e: (e[:n], None)})()
        self.other_slot = None if pc.other_slot is None else n


def _onnxruntime_conv_ms(model, x, runs: int) -> float | None:
    import collections
    import json
    import os
    import tempfile
    try:
        import onnxruntime as ort
    except ImportError:
        print("  (onnxruntime is not installed: pip install -e '.[bench]')")
        return None
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.onnx")
        torch.onnx.export(model, (x,), path, dynamo=True, verbose=False)
        so = ort.SessionOptions()
        so.intra_op_num_threads = torch.get_num_threads()
        so.enable_profiling, so.profile_file_prefix = True, os.path.join(d, "prof")
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        feed = {sess.get_inputs()[0].name: x.numpy()}
        for _ in range(runs):
            sess.run(None, feed)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    per_node = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") \
                and e["args"].get("op_name") == "Conv":
            per_node[e["name"]].append(e["dur"])
    return sum(statistics.median(v) for v in per_node.values()) / 1e3



CASES = {"resnet18": resnet18_convs, "attention": lambda runs: attention(runs * 10),
         "int8": lambda runs: (quantized_convs(runs), resnet18_int8_convs(runs)),
         "mobilenet": mobilenet_v2_in_model}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--only", default=",".join(CASES),
                   help="comma-separated cases: " + ", ".join(CASES))
    a = p.parse_args()
    torch.set_grad_enabled(False)
    print(f"machine: {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    for name in a.only.split(","):
        if name not in CASES:
            p.error(f"--only: unknown case {name!r} (cases: {', '.join(CASES)})")
        CASES[name](a.runs)


if __name__ == "__main__":
    main()
