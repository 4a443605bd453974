"""Kernel-call errors belong to the call that raised them, with many threads calling one module.

A custom op between compiled ops raises on some inputs with a message naming its
input; threads call one module concurrently, some with inputs that raise. Every
raising call must get ``KernelCallFailed`` carrying its own message, every other
call eager's answer (exact: the custom op runs in ATen, the compiled ops are a
multiply and an add), on each path: the VM on local-task and local-sync, the direct
call (a program that is one kernel call), the host program, and, where a CUDA
device is present, a module compiled for ``cuda`` (kernel calls on device memory).
"""

import threading

import pytest
import torch

import aot
from aot.artifact import CompiledArtifact
from aot.runtime.module import CompiledModule

_lib = torch.library.Library("aot_threads", "FRAGMENT")
_lib.define("checked_sqrt(Tensor x) -> Tensor")


def _checked_sqrt(x):
    if (x < 0).any():
        raise ValueError(f"negative input tagged {int(x[0].item())}")
    return x.sqrt()


_lib.impl("checked_sqrt", _checked_sqrt, "CompositeExplicitAutograd")
torch.library.register_fake("aot_threads::checked_sqrt", lambda x: torch.empty_like(x), lib=_lib)

THREADS, CALLS = 8, 40


class Between(torch.nn.Module):
    """compiled -> kernel call -> compiled"""

    def forward(self, x):
        return torch.ops.aot_threads.checked_sqrt(x * 1.0) + 1.0


class Alone(torch.nn.Module):
    """one kernel call: the runtime's direct path (no VM)"""

    def forward(self, x):
        return torch.ops.aot_threads.checked_sqrt(x)


HAS_CUDA = torch.cuda.is_available()


def _module(path):
    """``(eager model, compiled module, device)`` for one path."""
    x = torch.rand(16) + 1
    if path == "cuda":
        xc = x.cuda()
        return Between(), aot.compile(Between(), (xc,), target="cuda", placement="coverage"), "cuda"
    if path == "direct":
        return Alone(), aot.compile(Alone(), (x,), placement="coverage"), "cpu"
    if path == "all":
        return Between(), aot.compile(Between(), (x,), fallback="all"), "cpu"
    per_op = aot.compile(Between(), (x,), placement="coverage")
    if path == "vm-local-sync":
        art = CompiledArtifact(per_op.artifact.vmfb, {**per_op.manifest, "driver": "local-sync"},
                               per_op.artifact.constants)
        return Between(), CompiledModule(art), "cpu"
    return Between(), per_op, "cpu"


def _hammer(model, cm, device="cpu"):
    """``(errors delivered, mismatches)`` from THREADS x CALLS concurrent calls."""
    delivered, wrong = [0], []
    lock = threading.Lock()

    def worker(t):
        for c in range(CALLS):
            tag = t * 1000 + c
            x = torch.rand(16, device=device) + 1
            x[0] = tag + 1
            bad = (c % 3 == 0)
            if bad:
                x[0] = -(tag + 1)  # the message names -(tag + 1): this call's own
            try:
                got = cm(x)
            except aot.KernelCallFailed as e:
                with lock:
                    if not bad or f"tagged {-(tag + 1)}" not in str(e):
                        wrong.append((t, c, str(e)[:200]))
                    else:
                        delivered[0] += 1
                continue
            except Exception as e:  # noqa: BLE001 - any other type is a failure of the test
                with lock:
                    wrong.append((t, c, f"{type(e).__name__}: {e}"[:200]))
                continue
            with lock:
                if bad:
                    wrong.append((t, c, "no error"))
                elif not torch.equal(got, model(x)):
                    wrong.append((t, c, "wrong values"))

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return delivered[0], wrong


@pytest.mark.parametrize("path", [
    "vm-local-task", "vm-local-sync", "direct", "all",
    pytest.param("cuda", marks=[pytest.mark.gpu,
                                pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")]),
])
def test_kernel_call_errors_belong_to_their_call(path):
    model, cm, device = _module(path)
    delivered, wrong = _hammer(model, cm, device)
    assert wrong == []
    assert delivered == THREADS * len(range(0, CALLS, 3))
    x = torch.rand(16, device=device) + 1  # and the module keeps working
    torch.testing.assert_close(cm(x), model(x), rtol=0, atol=0)


class Rows(torch.nn.Module):
    """A view whose size follows a dynamic dimension, in a kernel call between compiled ops."""

    def forward(self, x):
        return torch.ops.aot_threads.checked_sqrt(x.view(x.shape[0], -1) * 1.0) + 1.0


@pytest.mark.parametrize("mode", ["auto", "all"])
def test_dynamic_sizes_belong_to_their_own_thread(mode):
    """Threads call one dynamic module at different batch sizes at once: each call's
    kernel calls evaluate their recorded sizes with that call's own binding."""
    from torch.export import Dim
    cm = aot.compile(Rows(), (torch.rand(4, 2, 3) + 1,), fallback=mode,
                     fallback_ops=["aten.view"] if mode == "auto" else (),
                     dynamic_shapes=({0: Dim("rows", min=2, max=64)},))
    wrong = []

    def worker(t):
        for c in range(CALLS):
            n = 2 + (t * 7 + c) % 63
            x = torch.rand(n, 2, 3) + 1
            try:
                got = cm(x)
            except Exception as e:  # noqa: BLE001 - any failure is the finding
                wrong.append(f"thread {t} rows {n}: {type(e).__name__}: {e}")
                continue
            if not torch.equal(got, x.view(n, -1).sqrt() + 1.0):
                wrong.append(f"thread {t} rows {n}: wrong values")
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not wrong, wrong[:3]
