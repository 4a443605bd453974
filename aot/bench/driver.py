"""Running the bench: every model, every system, timed in interleaved blocks, each
system in its own worker process (``isolated``) or all in this one (``in_process``)."""

from __future__ import annotations

import os
from typing import Callable

import torch

from .. import timing
from . import isolated, suite
from .suite import Row

__all__ = ["run_suite", "run_model", "run_model_in_process"]


def run_model(name: str, systems, runs: int, warmup: int, target: str,
              log: Callable[[str], None], min_seconds: float = 0.0,
              in_process: bool = False) -> list[Row]:
    """At least ``runs`` timed calls per system in interleaved blocks, more until every
    system ran ``min_seconds``: each system in its own worker process
    (``isolated``), or all in this one with ``in_process``."""
    if not in_process:
        return isolated.run_model_isolated(name, systems, runs, warmup, target, log, min_seconds)
    return run_model_in_process(name, systems, runs, warmup, target, log, min_seconds)


def run_model_in_process(name: str, systems, runs: int, warmup: int, target: str,
                         log: Callable[[str], None], min_seconds: float = 0.0) -> list[Row]:
    """``run_model`` with every system built and timed in this process (their thread
    pools share it: what one leaves spinning slows the next)."""
    model, example, batch = suite.load_model(name, target)
    rows, fns, counters = {}, {}, {}
    for s in systems:
        rows[s] = Row(name, s, target, batch, pid=os.getpid())
        log(f"{name}: building {s} ...")
        try:
            fn, secs, counter = suite._build(s, model, example, target)
        except Exception as e:  # a system that cannot run this model is a row, not a crash
            rows[s].skipped = suite._first_line(e)
            log(f"{name}: {s} skipped ({rows[s].skipped})")
            continue
        fns[s], counters[s] = fn, counter
        rows[s].choice = suite.choice(counter)
        rows[s].compile_s = round(secs, 2)
    sync = torch.cuda.synchronize if target == "cuda" else (lambda: None)
    samples = {s: [] for s in fns}
    peaks = {s: 0.0 for s in fns}
    calls = {s: None if counters[s] is None else 0 for s in fns}
    with torch.no_grad():
        want = model(*example)
        for s, fn in fns.items():
            rows[s].rel_err = suite._rel_err(fn(*example), want)
            if rows[s].rel_err > suite.REL_TOL:
                log(f"{name}: {s} differs from eager ({rows[s].rel_err:.1e} of the output's "
                    "magnitude)")
            for _ in range(warmup):
                fn(*example)
        log(f"{name}: timing {len(fns)} systems x {runs}+ runs in interleaved blocks, "
            "in this process ...")
        # a call runs slower right after IREE's worker threads ran: the order rotates
        for order in timing.rounds_while(
                fns, lambda s: suite.wants_more(samples[s], runs, min_seconds)):
            for s in order:
                xs, peak, n = suite.time_block(fns[s], example, sync, counters[s])
                samples[s] += xs
                peaks[s] = max(peaks[s], peak)
                if n is not None:
                    calls[s] += n
    return suite.finish_rows(rows, samples, peaks, calls)


def run_suite(models, systems, runs: int, warmup: int, target: str,
              log: Callable[[str], None] = print, min_seconds: float = 0.0,
              on_model: Callable[[list[Row]], None] | None = None,
              in_process: bool = False) -> list[Row]:
    """Time ``systems`` on ``models``, each system in its own worker process (all in this
    one with ``in_process``); ``on_model(rows so far)`` runs after each model (``aot
    bench`` writes its outputs there, so an interrupted run keeps what it measured)."""
    unknown = [m for m in models if m not in suite.BENCH_MODELS]
    if unknown:
        raise ValueError(f"unknown benchmark model(s) {unknown}; choose from {sorted(suite.BENCH_MODELS)}")
    bad = [s for s in systems if s not in suite.SYSTEMS]
    if bad:
        raise ValueError(f"unknown system(s) {bad}; choose from {list(suite.SYSTEMS)}")
    rows = []
    for m in models:
        try:
            rows += run_model(m, systems, runs, warmup, target, log, min_seconds,
                              in_process)
        except Exception as e:  # e.g. torchvision missing for the int8 model
            rows += [Row(m, s, target, 0, skipped=suite._first_line(e)) for s in systems]
            log(f"{m}: skipped ({suite._first_line(e)})")
        if on_model is not None:
            on_model(rows)
    return rows
