"""Region placement (measured end to end), host-held constants, channels-last ATen regions."""

import os
import time
import types

import pytest
import torch

import aot
from aot.fallback.executor import ExecOptions
from aot.tuning.regions import _with_executor, choice
from aot.runtime.module import CompiledModule


class ConvNet(torch.nn.Module):
    """Convolutions heavy enough to be measured (> 2 MFLOP), a residual add, a flatten."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(16)
        self.c2 = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.fc = torch.nn.Linear(16 * 8 * 8, 10)

    def forward(self, x):
        y = torch.relu(self.bn(self.c1(x)))
        y = torch.relu(self.c2(y) + x)
        y = torch.nn.functional.max_pool2d(y, 4)
        return self.fc(y.flatten(1))


@pytest.fixture(scope="module")
def convnet():
    torch.manual_seed(0)
    m = ConvNet().eval()
    with torch.no_grad():  # non-trivial batch-norm statistics
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
    return m, torch.randn(2, 16, 32, 32)


@pytest.fixture
def no_floor(monkeypatch):
    """IREE's program compiled and measured even where its measured floor says it cannot
    win (``regions.aten_far_ahead`` off): the tests using it are about that measurement."""
    monkeypatch.setattr("aot.tuning.regions.FLOOR_MARGIN", float("inf"))


def test_default_compile_measures_regions_and_keeps_the_fastest(convnet, no_floor):
    m, x = convnet
    cm = aot.compile(m, (x,))
    region = cm.manifest["region"]
    times = region["candidates_ms"]
    # on a CPU with oneDNN the channels-last candidate is the prepacked one
    assert {"iree", "aten"} < set(times) <= {"iree", "iree-sync", "iree-one-thread",
                                             "iree-coverage", "aten", "aten-prepacked",
                                             "aten-onednn-graph", "aten-channels-last"}
    assert region["chosen"] == choice(region)  # the fastest beyond the noise
    where = {p["where"] for p in cm.manifest["placements"]}
    if region["chosen"] not in ("iree", "iree-sync", "iree-one-thread", "iree-coverage"):
        assert where == {"kernel_call"}
        assert "one ATen region" in cm.report()
    assert "region placement, measured end to end" in cm.report()
    with torch.no_grad():  # batch norm folded into the convolution: float rounding only
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)


def test_regions_are_not_measured_under_explicit_options(convnet):
    m, x = convnet
    assert "region" not in aot.compile(m, (x,), placement="coverage").manifest
    assert "region" not in aot.compile(m, (x,), fallback_ops=["aten.relu"]).manifest


def test_channels_last_region_matches_eager(convnet):
    m, x = convnet
    allm = aot.compile(m, (x,), fallback="all")
    nhwc = CompiledModule(_with_executor(allm.artifact, ExecOptions("channels_last")))
    with torch.no_grad():
        ref = m(x)
        torch.testing.assert_close(allm(x), ref, rtol=0, atol=0)  # all-fallback: bit-exact
        for _ in range(2):  # second call: weights already converted (cached)
            # same values, NHWC convolution algorithms: float rounding only
            torch.testing.assert_close(nhwc(x), ref, rtol=1e-5, atol=1e-5)


def test_weights_read_only_by_kernel_calls_stay_on_the_host(tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Tanh()).eval()
    x = torch.randn(3, 512)
    cm = aot.compile(m, (x,), fallback_ops=["aten.linear"])
    table = cm.manifest["host_constants"]
    assert sorted(tuple(d["shape"]) for d in table.values()) == [(512,), (512, 512)]
    assert len(cm.artifact.vmfb) < 512 * 512 * 4  # the weight is not inside the module
    path = str(tmp_path / "m.aot")
    cm.save(path)
    loaded = aot.load(path)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), m(x), rtol=1e-6, atol=1e-6)
    # flipping one byte of a constant is caught by its checksum
    data = bytearray(open(path, "rb").read())
    data[data.index(cm.artifact.constants[:64]) + 7] ^= 0xFF
    bad = tmp_path / "bad.aot"
    bad.write_bytes(bytes(data))
    with pytest.raises(aot.ArtifactError, match="checksum"):
        aot.load(str(bad))


def test_per_op_placement_runs_on_the_local_sync_driver_too(convnet):
    """The ``iree-sync`` candidate: the same artifact, IREE dispatches on the calling thread."""
    m, x = convnet
    cm = aot.compile(m, (x,), fallback_ops=["aten.relu"])  # compiled code and kernel calls
    a = cm.artifact
    sync = CompiledModule(type(a)(a.vmfb, {**a.manifest, "driver": "local-sync"}, a.constants))
    assert sync.driver == "local-sync" and sync._direct is None
    with torch.no_grad():
        torch.testing.assert_close(sync(x), cm(x), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(sync(x), m(x), rtol=1e-4, atol=1e-4)
    assert sync.kernel_call_count >= 1


def test_heavy_kernel_calls_between_compiled_ops_are_also_timed_on_one_thread(
        monkeypatch, tmp_path, no_floor):
    """The ``iree-one-thread`` candidate: the per-op artifact with every kernel call,
    heavy ones too, on the calling thread alone; measured beside the others, and as
    right as they are."""
    from aot.partition.cost import Cost
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(Cost, "aten_wins", property(lambda self: True))  # convs in ATen,
    monkeypatch.setattr(Cost, "saving_ms", property(lambda self: 5.0))  # worth the hand-off
    torch.manual_seed(0)
    m, x = ConvNet().eval(), torch.randn(2, 16, 32, 32)
    cm = aot.compile(m, (x,), plan={"region": "iree-one-thread"})
    assert cm.manifest["region"]["chosen"] == "iree-one-thread"
    calls = [k["key"] for k in cm.manifest["kernel_calls"]]
    assert calls and sorted(cm.manifest["executor"]["one_thread_calls"]) == sorted(calls)
    assert any(p["where"] == "compiled" for p in cm.manifest["placements"])
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)
    region = aot.compile(m, (x,)).manifest["region"]  # measured with the others
    assert {"iree", "iree-sync", "iree-one-thread"} <= set(region["candidates_ms"])


def test_slow_candidates_skip_the_untimed_call_before_their_blocks():
    """A candidate whose call takes _SLOW_S or more is timed without an untimed call
    first, in shorter blocks (both would only add to the compile time); a fast one is
    warmed up by time."""
    from aot.tuning import regions

    calls = {"fast": 0, "slow": 0}

    def module(name):
        def call(*args, **kwargs):
            calls[name] += 1
        return call

    samples = {"fast": [], "slow": []}
    regions._round({"fast": module("fast"), "slow": module("slow")}, ["fast", "slow"], (), {},
                   lambda: None, samples, settled={"slow"})
    assert calls["slow"] == regions._BLOCK_SLOW and len(samples["slow"]) == regions._BLOCK_SLOW
    assert calls["fast"] > regions._BLOCK and len(samples["fast"]) == regions._BLOCK


def test_a_candidate_that_cannot_win_is_timed_no_more():
    """After two rounds, a candidate whose fastest call is OUT_OF_RACE times the best
    median is dropped; one that noise made slow on some calls stays."""
    from aot.tuning.regions import OUT_OF_RACE, _in_race

    samples = {"aten": [87.0, 88.0, 86.5, 90.0], "iree": [140.0, 150.0, 145.0, 160.0],
               "noisy": [89.0, 300.0, 95.0, 400.0]}
    assert _in_race(samples, list(samples)) == ["aten", "noisy"]
    samples["iree"][0] = 87.0 * OUT_OF_RACE - 0.1  # one call near enough: it stays
    assert _in_race(samples, list(samples)) == list(samples)


class _Cand(str):
    """A candidate name standing in for an artifact: the manifest its kernel calls are read from."""
    def __new__(cls, name, calls=0):
        self = super().__new__(cls, name)
        self.manifest = types.SimpleNamespace(
            kernel_calls=[{"key": f"k{i}"} for i in range(calls)], executor=None)
        return self


def _fake_modules(monkeypatch, regions, ms, calls, elsewhere_s=1.0):
    """Candidates that sleep ``ms``; while they are timed, the rest of the machine spends
    ``elsewhere_s`` of CPU (busy by default: every dropped candidate is rechecked)."""
    monkeypatch.setattr(regions.timing, "elsewhere", lambda: lambda: elsewhere_s)

    class Module:
        def __init__(self, name):
            self.name = str(name)

        def __call__(self, *args, **kwargs):
            calls[self.name] += 1
            time.sleep(ms[self.name] / 1e3)

        def close(self):
            pass
    monkeypatch.setattr(regions, "CompiledModule", Module)


def test_slow_programs_leave_the_race_from_their_first_sample(monkeypatch):
    """Where every candidate is slow, the last warm-up call is each one's first sample,
    and one that is already OUT_OF_RACE times the best is timed in no block: only the
    recheck's single call (ViT-B/16 spent 30 s timing six candidates of 330-710 ms)."""
    from aot.tuning import regions
    from aot.toolchain.targets import get_target

    ms = {"fast": 12.0, "slow": 30.0}
    calls = {k: 0 for k in ms}
    _fake_modules(monkeypatch, regions, ms, calls)
    monkeypatch.setattr(regions, "_SLOW_S", 0.01)
    stats = regions._time_candidates({k: k for k in ms}, ((), {}), get_target("cpu"))
    # one warm-up call each (nothing packs on it), which is the first sample; the slow
    # one is out of the race from it and gets only the recheck's call
    assert calls["slow"] == regions._WARMUP_SLOW + 1 and stats["slow"][2] == 2
    assert stats["slow"][0] > regions.OUT_OF_RACE * stats["fast"][0]
    # the sole candidate left in the race is timed to _SOLE_SAMPLES, not for every round
    assert stats["fast"][2] == regions._SOLE_SAMPLES
    assert stats["fast"][2] == calls["fast"] - regions._WARMUP_SLOW + 1


def test_a_slow_candidate_timed_on_an_idle_machine_is_not_rechecked(monkeypatch):
    """A slow candidate out of the race whose calls ran while nothing else used the
    machine was not slowed by anything: it is not called again (ViT-B/16 at batch 8
    spent 5 s rechecking three candidates of 1.5 s a call); the fast one is timed as
    before."""
    from aot.tuning import regions
    from aot.toolchain.targets import get_target

    ms = {"fast": 12.0, "slow": 30.0}
    calls = {k: 0 for k in ms}
    _fake_modules(monkeypatch, regions, ms, calls, elsewhere_s=0.0)
    monkeypatch.setattr(regions, "_SLOW_S", 0.01)
    stats = regions._time_candidates({k: k for k in ms}, ((), {}), get_target("cpu"))
    assert calls["slow"] == regions._WARMUP_SLOW and stats["slow"][2] == 1
    assert stats["fast"][2] == regions._SOLE_SAMPLES


def test_slow_candidates_timed_undisturbed_leave_the_race_at_a_smaller_lead():
    """A slow candidate with QUIET_SAMPLES calls that all ran on an idle machine, the
    fastest QUIET_LEAD over the best median, is out of the race; with fewer calls, a
    smaller lead, or a call that ran beside other work, it stays (OUT_OF_RACE rules)."""
    from aot.tuning.regions import QUIET_LEAD, QUIET_SAMPLES, _in_race

    best = [326.0, 330.0, 325.0]
    behind = [v * (1 + QUIET_LEAD) + 1 for v in (330.0, 340.0, 335.0)]
    near = [v * (1 + QUIET_LEAD / 2) for v in best]
    samples = {"tiled": best, "iree": behind, "one-thread": near}
    assert _in_race(samples, list(samples), {"iree", "one-thread"}) == ["tiled", "one-thread"]
    assert _in_race(samples, list(samples), {"one-thread"}) == list(samples)  # iree disturbed
    samples["iree"] = behind[:QUIET_SAMPLES - 1]
    assert _in_race(samples, list(samples), {"iree", "one-thread"}) == list(samples)


def test_a_busy_neighbour_shows_as_cpu_time_elsewhere():
    """``timing.elsewhere`` counts the CPU time other processes spend while we wait (the
    signal that decides whether a slow candidate is rechecked), and ``_quiet`` reads a
    busy neighbour as not quiet."""
    import subprocess
    import sys
    from aot import timing
    from aot.tuning.regions import _quiet

    if timing._machine_busy_s() is None:
        pytest.skip("no /proc/stat on this system: every dropped candidate is rechecked")
    spin = subprocess.Popen([sys.executable, "-c",
                             "import time\nt = time.time()\nwhile time.time() - t < 3: pass"])
    try:
        time.sleep(0.3)  # the child is spinning
        watch, t0 = timing.elsewhere(), time.perf_counter()
        time.sleep(0.5)
        spent = watch()
    finally:
        spin.kill()
        spin.wait()
    assert spent is not None and spent >= 0.3  # the child's 0.5 s on a CPU of its own
    assert not _quiet(spent, time.perf_counter() - t0)
    assert _quiet(0.0, 0.5) and not _quiet(None, 0.5)


def test_a_slow_candidate_that_packs_on_its_first_call_is_warmed_twice(monkeypatch):
    """A prepacking executor's first call packs the weights: it is warmed up as any
    candidate (two calls), so the packing call is never one of its samples."""
    from aot.tuning import regions
    from aot.toolchain.targets import get_target

    monkeypatch.setattr(regions, "_SLOW_S", 0.01)
    ms = {"iree": 20.0, "aten-prepacked": 15.0}
    calls = {k: 0 for k in ms}
    _fake_modules(monkeypatch, regions, ms, calls)
    cands = {"iree": _Cand("iree"), "aten-prepacked": _Cand("aten-prepacked")}
    cands["aten-prepacked"].manifest.executor = {"prepack": True}
    stats = regions._time_candidates(cands, ((), {}), get_target("cpu"))
    assert regions._WARMUP_CPU == 2 and regions._WARMUP_SLOW == 1
    # the last warm-up call is the first sample: iree warmed once, aten-prepacked twice
    assert stats["iree"][2] == calls["iree"] - regions._WARMUP_SLOW + 1
    assert stats["aten-prepacked"][2] == calls["aten-prepacked"] - regions._WARMUP_CPU + 1


def test_executor_variants_of_a_slow_per_op_artifact_far_out_of_the_race_are_not_run(monkeypatch):
    """iree-sync and iree-one-thread run the per-op artifact's code and kernel calls on
    other threads: where the per-op artifact is slow and, even less the most its hand-offs
    can cost, OUT_OF_RACE times another candidate, they are not run at all, and the region
    says why. Near the race (or with many kernel calls) they are timed as any candidate."""
    from aot.tuning import regions
    from aot.toolchain.targets import get_target

    monkeypatch.setattr(regions, "_SLOW_S", 0.01)
    ms = {"iree": 60.0, "iree-sync": 58.0, "iree-one-thread": 59.0, "aten": 20.0}
    calls = {k: 0 for k in ms}
    _fake_modules(monkeypatch, regions, ms, calls)
    cands = {k: _Cand(k, calls=3) for k in ms}
    not_timed = {}
    stats = regions._time_candidates(cands, ((), {}), get_target("cpu"), not_timed)
    assert set(stats) == {"iree", "aten"} and calls["iree-sync"] == calls["iree-one-thread"] == 0
    assert set(not_timed) == {"iree-sync", "iree-one-thread"}
    assert "3 kernel calls" in not_timed["iree-sync"]
    # 20 kernel calls could hide 40 ms of hand-offs: 60 - 40 is within the race
    calls.update({k: 0 for k in ms})
    cands = {k: _Cand(k, calls=20) for k in ms}
    not_timed = {}
    stats = regions._time_candidates(cands, ((), {}), get_target("cpu"), not_timed)
    assert set(stats) == set(ms) and not not_timed and calls["iree-sync"] >= regions._WARMUP_CPU


def test_a_slow_candidate_whose_heavy_ops_alone_outlast_a_measured_call_is_not_run(monkeypatch):
    """A candidate with a floor (its heavy ops measured alone) of FLOOR_MARGIN times a
    call already measured or more cannot win and is not run; the region says why. The
    candidate without a floor (a data-tiled variant) is warmed up first, the others from
    the lowest floor up; one whose floor is within reach runs as before (ViT-B/16 at
    batch 8 spent 5 s on three candidates of 1.4-2.0 s a call behind one of 0.9 s)."""
    from aot.tuning import regions
    from aot.toolchain.targets import get_target

    monkeypatch.setattr(regions, "_SLOW_S", 0.01)
    # iree's floor is far past the margin, so a sleep that overshoots on a loaded
    # machine (CI's 2 cores) cannot bring it back within reach; aten's is within it
    # since a 12 ms sleep never takes less than 12 ms
    ms = {"aten": 16.0, "iree": 100.0, "iree-tiled": 12.0}
    calls = {k: 0 for k in ms}
    order = []
    _fake_modules(monkeypatch, regions, ms, calls)
    real = regions.CompiledModule
    monkeypatch.setattr(regions, "CompiledModule", lambda name: order.append(str(name)) or real(name))
    floors = {"iree": 80.0, "aten": 12.0 * regions.FLOOR_MARGIN - 2.0}
    not_timed = {}
    stats = regions._time_candidates({k: _Cand(k) for k in ms}, ((), {}), get_target("cpu"),
                                     not_timed, floors)
    assert order == ["iree-tiled", "aten"] and calls["iree"] == 0
    assert set(stats) == {"iree-tiled", "aten"} and set(not_timed) == {"iree"}
    assert "heavy ops alone take at least" in not_timed["iree"] and "iree-tiled" in not_timed["iree"]
    # without floors, every candidate runs
    stats = regions._time_candidates({k: _Cand(k) for k in ms}, ((), {}), get_target("cpu"))
    assert set(stats) == set(ms)


def test_a_later_race_goes_on_from_candidates_already_timed(monkeypatch):
    """``aten_far_ahead`` times the ATen regions before the IREE compile; kept in a
    ``Race``, they are neither loaded, warmed up nor timed in the rounds again when
    ``choose_region`` adds the compiled candidate: their samples stand, the newcomer is
    timed as any candidate, and every module is closed at the end."""
    from aot.tuning import regions
    from aot.toolchain.targets import get_target

    ms = {"aten": 3.0, "aten-prepacked": 2.0, "iree": 6.0}
    calls = {k: 0 for k in ms}
    _fake_modules(monkeypatch, regions, ms, calls, elsewhere_s=0.0)
    loads, closed = [], []
    real = regions.CompiledModule

    def load(name):
        loads.append(str(name))
        m = real(name)
        m.close = lambda: closed.append(m.name)
        return m
    monkeypatch.setattr(regions, "CompiledModule", load)
    aten = {k: _Cand(k) for k in ("aten", "aten-prepacked")}
    race = regions.Race()
    first = regions._time_candidates(aten, ((), {}), get_target("cpu"), race=race, keep=True)
    assert set(race.mods) == set(aten) and not closed
    assert {k: len(v) for k, v in race.samples.items()} == {k: v[2] for k, v in first.items()}
    before = dict(calls)
    stats = regions._time_candidates({**aten, "iree": _Cand("iree")}, ((), {}),
                                     get_target("cpu"), race=race)
    assert loads == ["aten", "aten-prepacked", "iree"]  # each loaded once
    # nothing but the newcomer ran (no outcome here is close enough to measure again)
    assert all(calls[k] == before[k] for k in aten) and calls["iree"] > 0
    assert {k: stats[k][2] for k in aten} == {k: first[k][2] for k in aten}
    assert stats["aten-prepacked"][0] < stats["aten"][0] < stats["iree"][0]
    assert sorted(closed) == ["aten", "aten-prepacked", "iree"] and not race.mods


def test_executor_variants_wait_for_a_round_where_one_warm_up_call_cannot_decide(monkeypatch):
    """Where the other candidates' one warm-up call leaves a slow per-op artifact within
    reach (a first call slowed by something else), its executor variants are decided
    after the race's first round, on medians: out of the race by then, they never run."""
    from aot.tuning import regions
    from aot.toolchain.targets import get_target

    monkeypatch.setattr(regions, "_SLOW_S", 0.01)
    monkeypatch.setattr(regions.timing, "elsewhere", lambda: lambda: 1.0)
    ms = {"iree": [60.0], "iree-sync": [58.0], "iree-one-thread": [59.0],
          "aten": [45.0, 20.0]}  # aten's first call slowed, then its own 20 ms
    calls = {k: 0 for k in ms}

    class Module:
        def __init__(self, name):
            self.name = str(name)

        def __call__(self, *args, **kwargs):
            seq = ms[self.name]
            time.sleep(seq[min(calls[self.name], len(seq) - 1)] / 1e3)
            calls[self.name] += 1

        def close(self):
            pass
    monkeypatch.setattr(regions, "CompiledModule", Module)
    not_timed = {}
    stats = regions._time_candidates({k: _Cand(k, calls=3) for k in ms}, ((), {}),
                                     get_target("cpu"), not_timed)
    assert set(stats) == {"iree", "aten"} and calls["iree-sync"] == calls["iree-one-thread"] == 0
    assert set(not_timed) == {"iree-sync", "iree-one-thread"}


def test_a_dropped_candidate_that_runs_fast_again_is_measured_anew():
    """A candidate a burst of other work slowed in its first rounds is dropped, then
    rechecked with one block (one call where calls are slow): running fast again, its
    disturbed samples go and it is measured from there on; still slow, it keeps them all."""
    from aot.tuning import regions
    from aot.tuning.regions import _recheck

    times = {"aten": [5.0] * 50, "disturbed": [4.0] * 50, "slow": [30.0] * 50}

    def module(name):
        def call(*args, **kwargs):
            time.sleep(times[name].pop() / 1e3)
        return call
    mods = {k: module(k) for k in times}
    samples = {"aten": [5.0] * 6, "disturbed": [80.0] * 6, "slow": [30.0] * 6}
    _recheck(mods, ["aten"], (), {}, lambda: None, samples, settled=set())
    assert len(samples["disturbed"]) == regions._BLOCK and max(samples["disturbed"]) < 80.0
    assert len(samples["slow"]) == 6 + regions._BLOCK and samples["slow"][:6] == [30.0] * 6
    assert samples["aten"] == [5.0] * 6
    samples = {"aten": [5.0] * 6, "disturbed": [80.0] * 6, "slow": [30.0] * 6}
    _recheck(mods, ["aten"], (), {}, lambda: None, samples, settled=set(times))  # one call
    assert len(samples["disturbed"]) == 1 and samples["disturbed"][0] < 80.0
    assert len(samples["slow"]) == 7
    # a slow one timed on an idle machine is not called again; a disturbed one is
    samples = {"aten": [5.0] * 6, "disturbed": [80.0] * 6, "slow": [30.0] * 6}
    _recheck(mods, ["aten"], (), {}, lambda: None, samples, settled=set(times),
             quiet={"slow": True, "disturbed": False})
    assert samples["slow"] == [30.0] * 6
    assert len(samples["disturbed"]) == 1 and samples["disturbed"][0] < 80.0


def test_the_example_decides_and_the_range_end_settles_near_ties():
    from aot.tuning.regions import _decide, _settle_at_range_end

    def stats(**ms):
        return {k: (v, 0.01, 20) for k, v in ms.items()}
    # the small BERT encoder's shape of the problem: tiled IREE best at the example,
    # the ATen region best at the range's end: the example decides
    region = _decide(stats(iree=2.0, **{"iree-tiled": 1.08, "aten": 1.26}))
    _settle_at_range_end(region, stats(iree=2.0, **{"iree-tiled": 1.08, "aten": 1.26}),
                         stats(iree=56.7, **{"iree-tiled": 58.7, "aten": 35.0}))
    assert region["chosen"] == "iree-tiled"
    assert region["at_range_end_ms"]["aten"] == 35.0
    # a near-tie at the example (within 3%) goes to the one clearly faster at the end
    ex = stats(iree=1.00, aten=1.02)
    region = _decide(ex)
    assert region["chosen"] == "iree"
    _settle_at_range_end(region, ex, stats(iree=50.0, aten=30.0))
    assert region["chosen"] == "aten"
    # ... and stays put when the end is a near-tie too
    region = _decide(ex)
    _settle_at_range_end(region, ex, stats(iree=30.5, aten=30.0))
    assert region["chosen"] == "iree"


def _counting_compiles(monkeypatch) -> list:
    """The IREE compiles of programs with compiled ops from now on (not of probes or
    cost modules, nor an ATen region's module of kernel calls alone)."""
    from aot.tuning import compile as compile_mod
    runs, real = [], compile_mod.try_compile

    def counted(asm, *a, **k):
        if b"aten." in (asm if isinstance(asm, bytes) else asm.encode()):
            runs.append(1)
        return real(asm, *a, **k)
    monkeypatch.setattr(compile_mod, "try_compile", counted)
    return runs


def test_an_aten_region_far_ahead_of_every_compiled_plan_is_chosen_without_compiling_one(
        monkeypatch, tmp_path):
    """Where the heavy ops' measured floor (the least any compiled plan spends on them) is
    over ``FLOOR_MARGIN`` times the fastest ATen region, that region is the artifact and
    no IREE program is compiled; the report says why, with both numbers; a second
    compile reuses the decision."""
    from aot.tuning import compile as compile_mod
    from aot.partition.cost import Floor
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compile_mod, "compiled_floor", lambda *a: Floor(1000.0, 1.0, 3))
    runs = _counting_compiles(monkeypatch)
    torch.manual_seed(0)
    m, x = ConvNet().eval(), torch.randn(2, 16, 32, 32)
    cm = aot.compile(m, (x,))
    region = cm.manifest["region"]
    assert runs == []
    aten = {"aten", "aten-prepacked", "aten-onednn-graph", "aten-channels-last"}
    assert region["chosen"] in aten
    assert set(region["candidates_ms"]) <= aten
    assert region["compiled_floor_ms"] == 1000.0
    assert region["candidates_ms"][region["chosen"]] * 1.25 < 1000.0
    assert {p["where"] for p in cm.manifest["placements"]} == {"kernel_call"}
    assert "no IREE program was compiled" in cm.report()
    assert "1000.000 ms on its 3 heavy ops" in cm.report()
    with torch.no_grad():  # batch norm folded into the convolution: float rounding only
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)
    again = aot.compile(m, (x,)).manifest["region"]
    assert again["chosen"] == region["chosen"] and again["source"].startswith("reused")
    assert runs == []


def test_a_compiled_floor_near_the_aten_region_still_compiles_and_measures_iree(
        monkeypatch, tmp_path):
    """A floor within ``FLOOR_MARGIN`` of the fastest ATen region (here: under it) decides
    nothing: the per-op program is compiled and measured against the regions."""
    from aot.tuning import compile as compile_mod
    from aot.partition.cost import Floor
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compile_mod, "compiled_floor", lambda *a: Floor(1e-4, 0.0, 3))
    runs = _counting_compiles(monkeypatch)
    torch.manual_seed(0)
    m, x = ConvNet().eval(), torch.randn(2, 16, 32, 32)
    region = aot.compile(m, (x,)).manifest["region"]
    assert runs and "iree" in region["candidates_ms"] and "compiled_floor_ms" not in region


def test_the_compiled_floor_is_each_heavy_op_at_the_cheaper_of_iree_and_a_kernel_call(
        monkeypatch, tmp_path):
    """``cost.compiled_floor``: per heavy op with a measured cost, IREE's time or ATen's
    plus the crossings and the hand-off, whichever is less; ops without one add nothing."""
    from aot.partition.cost import CROSSING_MS, Cost, CostCache, compiled_floor, handoff_ms
    from aot.partition.signatures import op_signature
    from aot.partition.decisions import heavy_nodes
    from aot.toolchain.targets import get_target
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    m, x = ConvNet().eval(), torch.randn(2, 16, 32, 32)
    ep = torch.export.export(m, (x,)).run_decompositions({})
    nodes = heavy_nodes(ep)
    assert len(nodes) == 2  # the two convolutions (the linear is under MIN_FLOPS)
    target = get_target("cpu")
    cache = CostCache(target)
    assert compiled_floor(nodes, target, cache) is None  # nothing measured yet
    call = CROSSING_MS + handoff_ms(target)
    cache.put(op_signature(nodes[0]), Cost(1.0, 5.0))  # ATen's kernel, handed off
    assert compiled_floor(nodes, target, cache).compiled_ms == pytest.approx(1.0 + call)
    cache.put(op_signature(nodes[1]), Cost(4.0, 2.0))  # IREE's code
    floor = compiled_floor(nodes, target, cache)
    assert floor.ops == 2 and floor.aten_ms == 5.0
    assert floor.compiled_ms == pytest.approx(1.0 + call + 2.0)
    cache.put(op_signature(nodes[1]), Cost(1.0, None))  # IREE could not be measured
    assert compiled_floor(nodes, target, cache).compiled_ms == pytest.approx(2 * (1.0 + call))
    # without the hand-offs (kernel calls on the calling thread), and the prepacked
    # region's floor: each convolution at the faster of its kernels, 0 where unmeasured
    cache.put(op_signature(nodes[0]), Cost(1.0, 5.0, 0.5))
    cache.put(op_signature(nodes[1]), Cost(4.0, 2.0, 6.0))
    floor = compiled_floor(nodes, target, cache)
    assert floor.any_executor_ms == pytest.approx(1.0 + CROSSING_MS + 2.0)
    assert floor.packed_ms == pytest.approx(0.5 + 4.0)
    cache.put(op_signature(nodes[1]), Cost(4.0, 2.0))
    assert compiled_floor(nodes, target, cache).packed_ms == pytest.approx(0.5)


class _MLP(torch.nn.Module):
    """Matmuls carry it (``worth_tiling``), each over ``MIN_FLOPS``."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(128, 256), torch.nn.Linear(256, 128)

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x)))


@pytest.mark.parametrize("limit_gflop,per_op_compiled", [(0.001, False), (100.0, True)])
def test_a_large_program_worth_tiling_compiles_its_tiled_variant_alone(
        monkeypatch, tmp_path, limit_gflop, per_op_compiled):
    """A static program worth tiling with ``TILED_ALONE_GFLOP`` or more in heavy ops: one
    IREE program, the data-tiled one, raced against the ATen regions, no op cost
    measured in IREE (their ATen side is, for the ATen regions' floors, and not cached);
    the report says why the per-op placement was not compiled. Under it, both are
    compiled and the heavy ops measured."""
    from aot.tuning import compile as compile_mod
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compile_mod, "TILED_ALONE_GFLOP", limit_gflop)
    monkeypatch.setattr(compile_mod, "ATEN_FLOOR_GFLOP", limit_gflop)
    timed, real = [], compile_mod.measure_aten
    monkeypatch.setattr(compile_mod, "measure_aten",
                        lambda nodes, costs, t: (timed.append(len(nodes)), real(nodes, costs, t)))
    runs = _counting_compiles(monkeypatch)
    torch.manual_seed(0)
    m, x = _MLP().eval(), torch.randn(64, 128)
    cm = aot.compile(m, (x,))
    region = cm.manifest["region"]
    assert len(runs) == (2 if per_op_compiled else 1)
    assert timed == ([] if per_op_compiled else [2])  # the two linears, timed in ATen alone
    assert "iree-tiled" in region["candidates_ms"]
    assert ("iree" in region["candidates_ms"]) == per_op_compiled
    assert any(f.startswith("cost-") for f in os.listdir(tmp_path)) == per_op_compiled
    if not per_op_compiled:
        assert "per-op placement was not compiled" in region["not_timed"]["iree"]
        assert "per-op placement was not compiled" in cm.report()
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)


def test_a_large_program_whose_tiled_variant_fails_is_placed_per_op(monkeypatch, tmp_path):
    """The variant failing to compile alone: the program is placed and compiled as any
    other (the per-op placement, measured), and runs; the same variant is not compiled
    again beside it."""
    from aot.tuning import compile as compile_mod
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compile_mod, "TILED_ALONE_GFLOP", 0.001)
    tries = []
    monkeypatch.setattr(compile_mod, "_compile_variant", lambda *a: tries.append(a[0]) or {})
    torch.manual_seed(0)
    m, x = _MLP().eval(), torch.randn(64, 128)
    cm = aot.compile(m, (x,))
    region = cm.manifest["region"]
    assert "iree" in region["candidates_ms"] and "iree-tiled" not in region["candidates_ms"]
    assert tries == ["iree-tiled"]
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("packed_ms,compiles", [(1.0, False), (90.0, True)])
def test_a_prepacked_floor_far_under_the_compiled_one_times_the_aten_regions_first(
        monkeypatch, tmp_path, packed_ms, compiles):
    """The compiled floor under ATen's plain kernels' but over ``FLOOR_MARGIN`` times the
    prepacked region's: the ATen regions are timed first, and the one far ahead is the
    artifact, no IREE program compiled; with the prepacked floor near the compiled one,
    the program is compiled as before."""
    from aot.tuning import compile as compile_mod
    from aot.partition.cost import Floor
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compile_mod, "compiled_floor",
                        lambda *a: Floor(100.0, 200.0, 3, 100.0, packed_ms))
    runs = _counting_compiles(monkeypatch)
    torch.manual_seed(0)
    m, x = ConvNet().eval(), torch.randn(2, 16, 32, 32)
    cm = aot.compile(m, (x,))
    region = cm.manifest["region"]
    assert bool(runs) == compiles
    assert ("compiled_floor_ms" in region) == (not compiles)
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)
