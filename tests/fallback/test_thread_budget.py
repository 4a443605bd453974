"""One thread budget: light kernel calls between compiled dispatches run on the calling
thread alone (``aot.partition.threads``); heavy ones, and every call of a program with no
compiled code, keep torch's threads. Results equal eager's exactly (elementwise ATen
ops run the same kernels on one thread), and the caller's thread count is restored."""

import threading

import pytest
import torch

import aot
from aot.errors import ArtifactError
from aot.runtime.module import CompiledModule
from aot.artifact import CompiledArtifact

_lib = torch.library.Library("aot_budget", "FRAGMENT")
_lib.define("threads_seen(Tensor x) -> Tensor")
SEEN: list[int] = []


def _threads_seen(x):
    SEEN.append(torch.get_num_threads())
    return x * 2


_lib.impl("threads_seen", _threads_seen, "CompositeExplicitAutograd")
torch.library.register_fake("aot_budget::threads_seen", lambda x: torch.empty_like(x), lib=_lib)


class Mixed(torch.nn.Module):
    """compiled linear -> light kernel call (hardswish, forced out) -> compiled linear ->
    heavy kernel call (a custom op: its cost is unknown, so it keeps the threads)"""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)

    def forward(self, x):
        return torch.ops.aot_budget.threads_seen(self.b(torch.nn.functional.hardswish(self.a(x))))


def _compiled():
    m, x = Mixed().eval(), torch.randn(8, 64)
    cm = aot.compile(m, (x,), placement="coverage", fallback_ops=["aten.hardswish"])
    return m, x, cm


def _ops_by_key(manifest):
    return {k["key"]: k["op"] for k in manifest["kernel_calls"]}


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="torch runs one thread here")
def test_light_calls_run_on_one_thread_heavy_ones_keep_the_budget():
    m, x, cm = _compiled()
    ops = _ops_by_key(cm.manifest)
    light = cm.manifest["executor"]["one_thread_calls"]
    assert [ops[k] for k in light] == ["aten::hardswish"]
    assert "aot_budget::threads_seen" in ops.values()
    n = torch.get_num_threads()
    SEEN.clear()
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=0, atol=0)
    assert SEEN[0] == n  # the custom op ran with torch's threads (the eager call appended [1])
    assert torch.get_num_threads() == n


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="torch runs one thread here")
def test_a_one_thread_call_leaves_other_threads_alone():
    """The setting is the calling thread's: calls from many threads at once leave each
    thread's count as it was, and torch's process-wide count (what a new thread takes)
    is untouched."""
    _, x, cm = _compiled()
    n = torch.get_num_threads()
    counts, errors = [], []

    def worker():
        try:
            before = torch.get_num_threads()
            for _ in range(20):
                cm(x)
            counts.append((before, torch.get_num_threads()))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(counts) == 4
    assert all(before == after == n for before, after in counts), counts
    fresh = []
    t = threading.Thread(target=lambda: fresh.append(torch.get_num_threads()))
    t.start()
    t.join()
    assert fresh == [n] and torch.get_num_threads() == n


def test_a_program_with_no_compiled_code_keeps_the_budget():
    m, x = Mixed().eval(), torch.randn(8, 64)
    cm = aot.compile(m, (x,), fallback="all")
    assert cm.manifest["executor"]["one_thread_calls"] == []


def test_one_thread_calls_naming_no_kernel_call_is_refused():
    _, _, cm = _compiled()
    a = cm.artifact
    bad = {**a.manifest, "executor": {**a.manifest["executor"], "one_thread_calls": ["call_99"]}}
    with pytest.raises(ArtifactError, match="one_thread_calls names"):
        CompiledModule(CompiledArtifact(a.vmfb, bad, a.constants))
    bad = {**a.manifest, "executor": {**a.manifest["executor"], "one_thread_calls": "call_0"}}
    with pytest.raises(ArtifactError, match="one_thread_calls should be"):
        CompiledModule(CompiledArtifact(a.vmfb, bad, a.constants))


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="torch runs one thread here")
def test_the_wrapper_runs_one_thread_and_restores():
    from aot.fallback.omp_threads import available, on_this_thread_alone
    if not available():
        pytest.skip("torch's threading here is not OpenMP: calls keep torch's threads")
    n = torch.get_num_threads()
    seen = on_this_thread_alone(lambda: torch.get_num_threads())()
    assert seen == 1 and torch.get_num_threads() == n

    def boom():
        raise ValueError("x")
    with pytest.raises(ValueError):
        on_this_thread_alone(boom)()
    assert torch.get_num_threads() == n
