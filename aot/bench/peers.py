"""The systems a user would pick instead of ``aot``, built for ``aot bench``.

Each builder takes ``(model, example, target)`` and returns a callable taking the
example's tensors and returning torch tensors (conversions to and from NumPy are
part of the timed call: users hand these systems torch tensors). A builder raises
``PeerMissing`` when its package is not installed (the row says so and how to
install it: ``pip install -e '.[bench]'``), anything else when it cannot run the
model (the row gives the first line).

- ``inductor-freezing``: ``torch.compile`` with inductor's ``freezing`` (weights
  folded as constants; the mode recommended for CPU inference);
- ``aotinductor``: ``torch.export`` -> ``torch._inductor.aoti_compile_and_package``
  -> ``aoti_load_package`` (PyTorch's own ahead-of-time artifact);
- ``onnxruntime``: ``torch.onnx.export(..., dynamo=True)`` -> ONNX Runtime with all
  graph optimisations, CPU (or CUDA) execution provider, intra-op threads =
  torch's thread count;
- ``openvino``: ``openvino.convert_model`` -> ``compile_model`` on ``CPU`` with
  ``INFERENCE_PRECISION_HINT=f32`` (it defaults to bf16 on CPUs that have it, which
  is not a like-for-like fp32 comparison), latency hint, torch's thread count.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

import torch

__all__ = ["PEERS", "PeerMissing", "build_peer"]


class PeerMissing(RuntimeError):
    """The peer's package is not installed."""


def _need(module: str, package: str):
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise PeerMissing(f"{package} is not installed (pip install -e '.[bench]'): {e}") from None


def _numpy(example):
    return [x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x for x in example]


def _inductor_freezing(model, example, target):
    import torch._inductor.config as inductor_config

    fn = torch.compile(model)
    with inductor_config.patch(freezing=True), torch.no_grad():
        fn(*example)  # compiles on the first call, frozen
    return fn


def _aotinductor(model, example, target):
    import torch._inductor as inductor

    if not hasattr(inductor, "aoti_compile_and_package"):
        raise PeerMissing(f"torch {torch.__version__} has no aoti_compile_and_package")
    with torch.no_grad(), _scratch("aot-bench-aoti-") as d:
        ep = torch.export.export(model, tuple(example))
        path = os.path.join(d, "model.pt2")
        inductor.aoti_compile_and_package(ep, package_path=path)
        return inductor.aoti_load_package(path)  # unpacks it: the package can go


@contextlib.contextmanager
def _scratch(prefix: str):
    """A temporary folder, removed on leaving the block (a model file is hundreds of MB)."""
    d = tempfile.mkdtemp(prefix=prefix)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def _onnx_file(model, example):
    """The model exported to ONNX (weights beside it), for sessions made in the block."""
    _need("onnxscript", "onnxscript")
    with _scratch("aot-bench-onnx-") as d:
        path = os.path.join(d, "model.onnx")
        with torch.no_grad():
            torch.onnx.export(model, tuple(example), path, dynamo=True, external_data=True)
        yield path


def _onnxruntime(model, example, target):
    ort = _need("onnxruntime", "onnxruntime")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = torch.get_num_threads()
    providers = ["CPUExecutionProvider"]
    if target == "cuda":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise PeerMissing("this onnxruntime has no CUDAExecutionProvider "
                              "(pip install onnxruntime-gpu)")
        providers = ["CUDAExecutionProvider"]
    with _onnx_file(model, example) as path:  # the session holds what it read
        sess = ort.InferenceSession(path, opts, providers=providers)
    names = [i.name for i in sess.get_inputs()]

    def run(*args):
        outs = sess.run(None, dict(zip(names, _numpy(args))))
        outs = [torch.from_numpy(o) for o in outs]
        if target == "cuda":
            outs = [o.cuda() for o in outs]
        return outs[0] if len(outs) == 1 else tuple(outs)
    return run


def _openvino(model, example, target):
    ov = _need("openvino", "openvino")
    if target != "cpu":
        raise PeerMissing("OpenVINO is benchmarked on the CPU only")
    with torch.no_grad():
        ov_model = ov.convert_model(model, example_input=tuple(example))
    compiled = ov.Core().compile_model(ov_model, "CPU", {
        "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_NUM_THREADS": torch.get_num_threads()})
    request = compiled.create_infer_request()

    def run(*args):
        res = request.infer(_numpy(args))
        outs = [torch.from_numpy(res[o].copy()) for o in compiled.outputs]
        return outs[0] if len(outs) == 1 else tuple(outs)
    return run


PEERS = {"inductor-freezing": _inductor_freezing, "aotinductor": _aotinductor,
         "onnxruntime": _onnxruntime, "openvino": _openvino}


def build_peer(system: str, model, example, target: str):
    """A callable running ``model`` through peer ``system``."""
    return PEERS[system](model, example, target)
