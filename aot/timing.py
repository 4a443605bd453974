"""One timer: calls timed in blocks, several callables interleaved round by round with
the order rotating (a drift or a burst of other work hits all alike), and the medians
and spreads of their samples. The per-op costs (``aot.partition.cost``), the region race
(``aot.tuning.regions``), ``aot bench`` (``aot.bench``) and the scripts under
``benchmarks/`` all time with it.

Times are milliseconds of wall clock (``time.perf_counter``); ``sync`` (e.g.
``torch.cuda.synchronize``) runs before and after each timed call so that a device's
queued work is counted.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable, Iterable

__all__ = ["block", "interleaved", "median_ms", "medians", "spread", "rotated", "rotations",
           "rounds_while", "elsewhere"]


def _nothing() -> None:
    pass


def block(fn: Callable[[], object], calls: int, *, warm_s: float = 0.0,
          sync: Callable[[], None] = _nothing, per_call: int = 1,
          around: Callable[[], Callable[[], None]] | None = None) -> list[float]:
    """Untimed calls for ``warm_s`` seconds (one at least when ``warm_s`` > 0: the
    previous callable's threads settle, this one's caches and threads warm up), then
    ``calls`` timed samples of ``per_call`` calls each, in ms per call.

    ``around``: called before each timed sample, returns what to call after it (the
    bench measures the resident memory a call adds this way)."""
    t0 = time.perf_counter()
    while warm_s > 0:
        fn()
        sync()
        if time.perf_counter() - t0 >= warm_s:
            break
    out = []
    for _ in range(calls):
        after = around() if around is not None else None
        sync()
        t = time.perf_counter()
        for _ in range(per_call):
            fn()
        sync()
        out.append((time.perf_counter() - t) * 1e3 / per_call)
        if after is not None:
            after()
    return out


def rotated(names: list[str], r: int) -> list[str]:
    """``names`` in round ``r``'s order: rotated by one every round, so each follows each
    other one equally often."""
    k = r % len(names) if names else 0
    return names[k:] + names[:k]


def rotations(names: list[str], rounds: int) -> Iterable[list[str]]:
    """``names`` in the order of each of ``rounds`` rounds (``rotated``)."""
    for r in range(rounds):
        yield rotated(names, r)


def rounds_while(names, more: Callable[[str], bool]) -> Iterable[list[str]]:
    """Rounds of the ``names`` (read anew every round: an iterable that may shrink) for
    which ``more(name)`` holds, in rotating order, until it holds for none."""
    r = 0
    while True:
        active = [k for k in names if more(k)]
        if not active:
            return
        yield rotated(active, r)
        r += 1


def interleaved(fns: dict[str, Callable[[], object]], rounds: int, calls: int = 1, *,
                warmup: int = 0, warm_s: float = 0.0, sync: Callable[[], None] = _nothing,
                per_call: int = 1) -> dict[str, list[float]]:
    """``{name: samples in ms}``: ``warmup`` untimed calls of each, then ``rounds``
    rounds of one ``block`` each (``calls`` samples after ``warm_s`` of untimed calls),
    the order rotating every round."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
            sync()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for order in rotations(list(fns), rounds):
        for k in order:
            samples[k] += block(fns[k], calls, warm_s=warm_s, sync=sync, per_call=per_call)
    return samples


def median_ms(fn: Callable[[], object], runs: int, warmup: int = 1,
              sync: Callable[[], None] = _nothing) -> float:
    """The median of ``runs`` timed calls after ``warmup`` untimed ones, in ms."""
    return medians(interleaved({"fn": fn}, 1, runs, warmup=warmup, sync=sync))["fn"]


def medians(samples: dict[str, list[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in samples.items() if v}


def spread(v: list[float]) -> float:
    """Half the interquartile range (0 under four samples)."""
    if len(v) < 4:
        return 0.0
    q = statistics.quantiles(v, n=4)
    return (q[2] - q[0]) / 2


_STAT = "/proc/stat"
_BUSY = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal (a VM's host's share)


def _machine_busy_s() -> float | None:
    """CPU seconds the whole machine has been busy (every CPU, the hypervisor's steal
    included), from ``/proc/stat``; None where there is none (not Linux)."""
    try:
        with open(_STAT, "rb") as f:
            fields = f.readline().split()[1:]
        ticks = sum(int(fields[i]) for i in _BUSY if i < len(fields))
        return ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def elsewhere() -> Callable[[], float | None]:
    """Start watching the machine; the returned function gives the CPU seconds spent
    since outside this process (other processes, the kernel's work for them, a VM's
    steal), or None where that cannot be read. A timed call during which that stayed
    near zero ran on a machine otherwise idle: nothing else slowed it."""
    before, own = _machine_busy_s(), time.process_time()
    if before is None:
        return lambda: None

    def since() -> float | None:
        after = _machine_busy_s()
        if after is None:
            return None
        return max(0.0, (after - before) - (time.process_time() - own))
    return since
