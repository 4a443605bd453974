"""Each benchmarked system in its own worker process, timed round by round by a coordinator.

On a small machine the systems' thread pools (ONNX Runtime's, OpenVINO's, IREE's,
torch's OpenMP) interfere when they share a process, enough to make a system
several times slower beside the others than alone. So, per model:

- The coordinator (the process running ``aot bench``) starts one worker per system:
  a fresh interpreter, ``python -m aot.bench.isolated``, talking to it over a socket
  pair (POSIX) with ``multiprocessing.connection`` messages. It inherits no thread
  pool, CUDA context or imported state; unlike multiprocessing's ``spawn`` it does not
  re-run the caller's main module, so any script may call the suite. Workers start
  one after another, the next once the previous is built, so no compile competes with
  another for the cores.
- A worker loads the model (``suite.load_model``: the global seed set, then the
  factory; every worker gets the same weights, and the coordinator compares a digest
  of each worker's weights and example with the first one's), computes eager's output
  itself, builds its system (``suite._build``), measures its error against eager
  (``suite._rel_err``), makes ``warmup`` untimed calls, goes quiet (below) and answers
  ``ready`` with its pid, compile seconds, aot's choice, the error and the batch; or,
  when anything fails, ``error`` with the exception's first line. Then it blocks on its
  socket.
- Each round, in an order that rotates from one round to the next, the coordinator
  sends one worker at a time ``block``: the worker runs ``suite.time_block`` (untimed
  calls for ``WARM_S``, then ``BLOCK`` timed calls), goes quiet and answers with the
  samples, the peak resident memory a call added and the kernel calls made. Every
  other worker meanwhile sits in a blocking socket read, so exactly one process runs a
  model at any time, and each worker's peak memory is its own. The stopping rules are
  the in-process ones (``suite.wants_more``: ``runs`` samples, then ``min_seconds``,
  at most ``MAX_RUNS``). Then ``stop`` to each worker.

Quiet: thread pools spin-wait for a while after a call before they sleep (ONNX
Runtime's and OpenMP's spin by default). A worker answers only once its whole
process (all its threads; its main thread sleeps meanwhile) has used under
``QUIET_CPU`` of one core over a ``QUIET_WINDOW_S`` window, or after ``QUIET_MAX_S``
(the coordinator logs that). So the next worker starts on idle cores, and a worker
waiting on its socket costs no CPU.

Failures: a worker that fails to build, or whose system raises while timed, is a
skipped row with the first line of the error. A worker that dies (its socket closes;
the row gives its exit code) or gives no answer within ``BUILD_TIMEOUT_S`` while
building or ``BLOCK_TIMEOUT_S`` for a block is killed and its row skipped with the
reason; the other systems go on.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from typing import Callable

from .. import timing
from . import suite
from .suite import Row

__all__ = ["run_model_isolated", "BUILD_TIMEOUT_S", "BLOCK_TIMEOUT_S"]

BUILD_TIMEOUT_S = 3600.0  # loading, building, checking and warming one system
BLOCK_TIMEOUT_S = 600.0   # one block: WARM_S of untimed calls and BLOCK timed ones
QUIET_WINDOW_S = 0.005    # a worker is quiet when, over this long,
QUIET_CPU = 0.05          # its process used under this fraction of one core
QUIET_MAX_S = 2.0         # a worker answers after this long even if not quiet


class WorkerLost(RuntimeError):
    """A worker that cannot give a row: it failed, died or gave no answer in time."""


class _Worker:
    """The coordinator's end of one worker process and its socket."""

    def __init__(self, name: str, system: str, target: str, warmup: int, fault: str | None):
        self.system = system
        mine, theirs = socket.socketpair()
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aot.bench.isolated", str(theirs.fileno()), name, system,
             target, str(warmup), fault or ""],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env)
        theirs.close()  # the worker holds the only other end: its death closes the socket
        self.conn = Connection(mine.detach())

    def ask(self, msg: tuple | None, timeout: float, doing: str) -> dict:
        """Send ``msg`` (None: send nothing) and wait for the answer; ``WorkerLost``
        (the worker killed) when it dies or does not answer within ``timeout`` s."""
        try:
            if msg is not None:
                self.conn.send(msg)
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kill()
                    raise WorkerLost(f"worker gave no answer in {timeout:.0f} s while "
                                     f"{doing}; killed")
                if self.conn.poll(min(left, 1.0)):
                    return self.conn.recv()
                if self.proc.poll() is not None and not self.conn.poll(0):
                    break
        except (EOFError, OSError):
            pass
        try:
            code = self.proc.wait(5)
        except subprocess.TimeoutExpired:
            code = None
        self.kill()
        raise WorkerLost(f"worker died while {doing} (exit code {code})")

    def stop(self) -> None:
        """Ask the worker to exit; kill it if it does not within a few seconds."""
        if self.proc.poll() is None:
            try:
                self.conn.send(("stop",))
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.conn.close()


def run_model_isolated(name: str, systems, runs: int, warmup: int, target: str,
                       log: Callable[[str], None], min_seconds: float = 0.0, *,
                       faults: dict[str, str] | None = None,
                       build_timeout_s: float = BUILD_TIMEOUT_S,
                       block_timeout_s: float = BLOCK_TIMEOUT_S) -> list[Row]:
    """``driver.run_model`` with one worker process per system, interleaved round by round.

    ``faults`` is for tests: system -> ``build`` (its worker raises instead of
    building), ``exit`` or ``hang`` (its worker times eager's callable and exits, or
    hangs, on its first block)."""
    rows = {s: Row(name, s, target, 0) for s in systems}
    workers: dict[str, _Worker] = {}
    digests: dict[str, str] = {}
    samples: dict[str, list] = {}
    peaks: dict[str, float] = {}
    calls: dict[str, int | None] = {}
    try:
        for s in systems:
            log(f"{name}: building {s} in its own process ...")
            w = workers[s] = _Worker(name, s, target, warmup, (faults or {}).get(s))
            r = rows[s]
            try:
                msg = w.ask(None, build_timeout_s, "building")
                r.pid = msg["pid"]
                if "error" in msg:
                    raise WorkerLost(msg["error"])
                first = next(iter(digests.values()), msg["digest"])
                if msg["digest"] != first:
                    raise WorkerLost("its worker built other weights or inputs than the "
                                     "first worker (a model factory that is not deterministic)")
            except WorkerLost as e:
                workers.pop(s).stop()
                r.skipped = str(e)
                log(f"{name}: {s} skipped ({e})")
                continue
            digests[s] = msg["digest"]
            r.batch, r.compile_s, r.choice, r.rel_err = (
                msg["batch"], round(msg["compile_s"], 2), msg["choice"], msg["rel_err"])
            if r.rel_err > suite.REL_TOL:
                log(f"{name}: {s} differs from eager ({r.rel_err:.1e} of the output's "
                    "magnitude)")
            samples[s], peaks[s], calls[s] = [], 0.0, msg["calls"]
        log(f"{name}: timing {len(workers)} systems x {runs}+ runs, each in its own "
            "process, in interleaved blocks ...")
        loud: set[str] = set()
        for order in timing.rounds_while(
                workers, lambda s: suite.wants_more(samples[s], runs, min_seconds)):
            for s in order:
                if s not in workers:  # lost earlier in this round
                    continue
                try:
                    msg = workers[s].ask(("block",), block_timeout_s, "timing")
                    if "error" in msg:
                        raise WorkerLost(msg["error"])
                except WorkerLost as e:
                    workers.pop(s).stop()
                    rows[s].skipped = str(e)
                    log(f"{name}: {s} skipped ({e})")
                    continue
                samples[s] += msg["samples_ms"]
                peaks[s] = max(peaks[s], msg["peak_mb"])
                if msg["calls"] is not None:
                    calls[s] += msg["calls"]
                if not msg["quiet"] and s not in loud:
                    loud.add(s)
                    log(f"{name}: {s}'s threads were still busy {QUIET_MAX_S:.0f} s after "
                        "a block")
    finally:
        for w in workers.values():
            w.stop()
    batch = next((r.batch for r in rows.values() if r.batch), 0)
    for r in rows.values():
        r.batch = r.batch or batch
    return suite.finish_rows(rows, {s: samples[s] for s in workers}, peaks, calls)


def _worker_main(argv: list[str]) -> None:
    """A worker process (``python -m aot.bench.isolated FD MODEL SYSTEM TARGET WARMUP
    FAULT``): build, answer ``ready`` or ``error`` on socket ``FD``, then serve blocks."""
    fd, name, system, target, warmup, fault = argv
    conn, warmup, fault = Connection(int(fd)), int(warmup), fault or None
    try:
        _serve(conn, name, system, target, warmup, fault)
    except (KeyboardInterrupt, BrokenPipeError, EOFError):
        pass  # the coordinator was interrupted or went away
    finally:
        conn.close()


def _serve(conn, name, system, target, warmup, fault) -> None:
    import torch

    pid = os.getpid()
    try:
        if fault == "build":
            raise RuntimeError(f"injected build failure of {system} (test hook)")
        model, example, batch = suite.load_model(name, target)
        digest = _digest(model, example)
        with torch.no_grad():
            want = model(*example)
        if fault in ("exit", "hang"):
            fn, secs, counter = model, 0.0, None
        else:
            fn, secs, counter = suite._build(system, model, example, target)
        sync = torch.cuda.synchronize if target == "cuda" else (lambda: None)
        with torch.no_grad():
            rel_err = suite._rel_err(fn(*example), want)
            for _ in range(warmup):
                fn(*example)
            sync()
    except Exception as e:  # a system that cannot run this model is a row, not a crash
        conn.send({"pid": pid, "error": suite._first_line(e)})
        return
    del want
    _quiet()
    conn.send({"pid": pid, "digest": digest, "batch": batch, "compile_s": secs,
               "choice": suite.choice(counter), "rel_err": rel_err,
               "calls": None if counter is None else 0})
    with torch.no_grad():
        while True:
            msg = conn.recv()  # blocks: an idle worker sleeps here
            if msg[0] == "stop":
                return
            if fault == "exit":
                os._exit(3)
            if fault == "hang":
                time.sleep(3600)
            try:
                xs, peak, calls = suite.time_block(fn, example, sync, counter)
            except Exception as e:
                conn.send({"error": f"failed while timing: {suite._first_line(e)}"})
                return
            quiet = _quiet()
            conn.send({"samples_ms": xs, "peak_mb": peak, "calls": calls, "quiet": quiet})


def _quiet() -> bool:
    """Wait until this process's threads are idle: under ``QUIET_CPU`` of one core over
    ``QUIET_WINDOW_S`` while this thread sleeps. False after ``QUIET_MAX_S``."""
    end = time.perf_counter() + QUIET_MAX_S
    while True:
        c0, t0 = time.process_time(), time.perf_counter()
        time.sleep(QUIET_WINDOW_S)
        t1 = time.perf_counter()
        if time.process_time() - c0 < QUIET_CPU * (t1 - t0):
            return True
        if t1 >= end:
            return False


def _digest(model, example) -> str:
    """SHA-256 of the model's state (parameters and buffers) and the example's tensors."""
    import torch

    h = hashlib.sha256()
    items = list(model.state_dict().items()) + [(f"input{i}", x) for i, x in enumerate(example)]
    for key, t in items:
        h.update(key.encode())
        if not isinstance(t, torch.Tensor):
            h.update(repr(t).encode())
            continue
        t = t.detach()
        if t.is_quantized:
            t = t.dequantize()
        h.update(str(t.dtype).encode() + str(tuple(t.shape)).encode())
        h.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


if __name__ == "__main__":
    _worker_main(sys.argv[1:])
