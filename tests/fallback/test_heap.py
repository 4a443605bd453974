"""The C heap keeps ATen's freed memory between calls (``aot.fallback.heap``).

A model whose intermediates are over glibc's default mmap threshold (128 KiB) faults
fresh pages in on every eager call; once an artifact with kernel calls is loaded,
those pages are reused. Counted with ``getrusage``'s minor faults, which on Linux
count the calling process's faults (the test runs ATen on one thread so that every
fault is this thread's and none is a worker thread's first touch).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap

import pytest
import torch

import aot
from aot.errors import ArtifactError
from aot.fallback import heap
from aot.fallback.executor import ExecOptions
from aot.fallback.spec import KernelCallSpec
from aot.torch_tensor import TorchTensor

pytestmark = pytest.mark.skipif(not heap.available(), reason="the C library here is not glibc")


class Wide(torch.nn.Module):
    """Sixty-four 256 KiB intermediates live at once, freed together at the end. glibc
    serves them from its heap (its dynamic mmap threshold follows the largest freed
    mapping) and hands the freed 16 MiB back to the kernel (its dynamic trim threshold
    is twice that threshold): the next call faults every page in again."""

    def forward(self, x):
        ys = [torch.tanh(x * (1.0 + i / 64)) for i in range(64)]
        s = ys[0]
        for y in ys[1:]:
            s = s + y
        return s


def _result(shape) -> TorchTensor:
    strides = tuple(None for _ in shape) if any(isinstance(d, str) for d in shape) else \
        tuple(int(torch.empty(0).new_empty(shape, device="meta").stride(i))
              for i in range(len(shape)))
    return TorchTensor("float32", tuple(shape), strides)


def _spec(shape, members=()):
    return KernelCallSpec(key="call_0", op="aten::tanh", overload="default", operands=(),
                          results=(_result(shape),) if not members else (),
                          location=None, reason="test", inputs=(), members=members)


def test_planned_bytes_is_twice_the_largest_call():
    small, big = _spec((1024,)), _spec((1 << 22,))  # 4 KiB, 16 MiB
    group = _spec((), members=(big, big))  # 32 MiB of intermediates
    assert heap.planned_bytes([small, big], "local-task") == heap.MIN_BYTES
    assert heap.planned_bytes([small, group], "local-task") == 64 << 20
    assert heap.planned_bytes([_spec((1 << 24,))], "local-sync") == 128 << 20
    assert heap.planned_bytes([small], "cuda") == 0  # the caching allocator's job there
    assert heap.planned_bytes([], "local-task") == 0  # compiled code alone
    assert heap.planned_bytes([_spec(("s0", 8))], "local-task") == heap.CEILING
    assert heap.planned_bytes([], "local-task", host_program=True) == heap.CEILING
    assert heap.planned_bytes([], "cuda", host_program=True) == 0


def test_the_manifest_records_the_plan_and_the_report_says_it():
    x = torch.randn(256, 256)
    cm = aot.compile(Wide(), (x,), fallback="all")
    ex = cm.manifest["executor"]
    assert ex["retained_heap_bytes"] >= heap.MIN_BYTES
    assert "C heap keeps up to" in cm.report()
    assert heap.retained_bytes() >= ex["retained_heap_bytes"]  # loading it set the heap
    torch.testing.assert_close(cm(x), Wide()(x), rtol=0, atol=0)  # all in ATen: exact


@pytest.mark.parametrize("bad", [-1, 1.5, "64", True, heap.MAX_BYTES + 1])
def test_a_bad_heap_plan_is_refused_at_load(bad):
    with pytest.raises(ArtifactError, match="retained_heap_bytes"):
        ExecOptions.from_json({"retained_heap_bytes": bad})


def test_aot_leave_heap_leaves_it(monkeypatch):
    monkeypatch.setenv("AOT_LEAVE_HEAP", "1")
    before = heap.retained_bytes()
    assert not heap.retain(heap.CEILING)
    assert heap.retained_bytes() == before


def test_retain_only_ever_raises():
    before = heap.retained_bytes()
    assert heap.retain(heap.MIN_BYTES)  # at most what is set already: kept as it is
    assert heap.retained_bytes() == max(before, heap.MIN_BYTES)
    assert not heap.retain(0)


_CHILD = textwrap.dedent("""
    import ctypes, json, resource, statistics, torch
    torch.set_num_threads(1)
    import aot
    # glibc's static defaults (128 KiB each): freed memory goes back to the kernel, not
    # left to the dynamic thresholds' history in this process
    libc = ctypes.CDLL(None)
    assert libc.mallopt(-3, 128 << 10) and libc.mallopt(-1, 128 << 10)
    from tests.fallback.test_heap import Wide
    x = torch.randn(256, 256)
    m = Wide()
    def faults(f):  # the median over calls: a stray fault elsewhere in the process aside
        for _ in range(3):
            f(x)
        per_call = []
        for _ in range(11):
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            f(x)
            per_call.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        return statistics.median(per_call)
    before = faults(m)
    cm = aot.compile(m, (x,), fallback="all")
    print(json.dumps({"eager_before": before, "artifact": faults(cm),
                      "eager_after": faults(m)}))
""")


def test_calls_stop_faulting_fresh_pages_in():
    # a fresh process, its heap at glibc's static defaults: an earlier test's artifact
    # has set this one's heap already
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                         timeout=600, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    page_faults_per_tensor = (256 * 256 * 4) // resource.getpagesize()  # 256 KiB
    # before: the live intermediates' pages are fresh on every call
    assert got["eager_before"] > 32 * page_faults_per_tensor, got
    # after loading the artifact, its calls and eager's reuse the kept pages
    assert got["artifact"] < page_faults_per_tensor, got
    assert got["eager_after"] < page_faults_per_tensor, got
