"""The benchmark suite behind ``aot bench``: models x systems, side by side, in one run.

Systems (each skipped with its reason where it cannot run the model):

- ``eager``: the model as PyTorch runs it;
- ``eager-heap``: the same, with the C heap keeping freed memory as an artifact's
  process does (``aot.fallback.heap``): which share of aot's speed is the heap's, and
  what a user gets from eager who sets glibc's thresholds (``GLIBC_TUNABLES``) alike;
- ``inductor``: ``torch.compile(model)`` (default mode);
- ``inductor-freezing``, ``aotinductor``, ``onnxruntime``, ``openvino`` (f32): the
  peers a user would pick instead (``benchmarks/peers.py``; ``pip install -e
  '.[bench]'`` installs them; a missing one is a skipped row naming the package);
- ``iree-default``: IREE alone with its default flags, no ATen fallback (what an
  export -> IREE flow such as iree-turbine gives you);
- ``aot``: this project, ``aot.compile(model, args)`` with no options;
- ``aot-coverage``: ``aot.compile(model, args, placement="coverage")``: everything
  IREE can lower runs compiled (how fast IREE's own code is);
- ``aot-stablehlo``: ``placement="coverage"`` through the StableHLO path
  (``via="stablehlo"``: torch-mlir lowers to StableHLO, IREE compiles that), to set
  beside ``aot-coverage`` (the same through the Torch dialect);
- ``aot-dynamic``: the defaults with the batch dimension dynamic (``dynamic_batch``),
  timed at the example's batch; the summary compares it with ``aot`` (one artifact per
  shape) in the same run. The sweep over batch sizes is ``benchmarks/dynamic_sweep.py``.

Models: the bundled ones (ResNet18, its int8 version, a small BERT, the custom-op
model), torchvision's zoo at batch 1 and 8 (``aot/models/zoo.py``), and real-world
architectures with random weights, nothing downloaded: Hugging Face models built
from their configs (``aot/models/hf.py``: BERT-base, DistilBERT, T5-small's encoder, a
small Llama) and timm models (``aot/models/timm_zoo.py``). ``MODEL_SETS`` names groups.

Processes: each system is built and timed in its own worker process, and a
coordinator (this process) interleaves them round by round, one worker running at a
time while the others sleep on their pipes (``aot.bench.isolated``): the thread
pools of ONNX Runtime, OpenVINO, IREE and torch's OpenMP would otherwise share the
cores and slow whichever system runs next. ``in_process=True`` (``aot bench
--in-process``) builds and times all systems in this process instead, to reproduce
that interference.

Timing, in either layout: in rounds; per round each system gets one block, untimed
calls for at least ``WARM_S`` (one call at least: threads wake, caches refill, and
a program is slower than its steady state for a few calls after a pause), then
``BLOCK`` timed calls. The order of the systems rotates from one round to the next,
so slow drifts of the machine, and what one system leaves behind for the next, hit
all alike. After ``runs`` timed calls, systems that have not yet run
``min_seconds`` in total go on (up to ``MAX_RUNS``), still interleaved with each
other (fast models get hundreds of samples).

Checks: every system's output is compared with eager's once after building: the
row gives the largest difference relative to the output's largest magnitude, and a
system beyond ``REL_TOL`` is marked wrong (timed all the same). Denormals are left
as each system leaves them (nothing here sets flush-to-zero; ``aot/models/zoo.py`` says
which models' eager activations contain any).

Per row: median and spread (10th-90th percentile) of latency, throughput, speed
relative to eager, compile time, peak resident memory while running, and
kernel-call crossings per inference. Peak memory is the resident memory a call adds
on top of what was resident before it (Linux ``VmHWM`` reset per call; CUDA memory
that IREE allocates is not counted). Outputs: Markdown table (its header names the
machine and the process layout), JSON, PNG chart.
Benchmarks are never timed assertions in tests.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from .. import timing

__all__ = ["BENCH_MODELS", "MODEL_SETS", "SYSTEMS", "Row",
           "machine_info", "write_outputs"]

SYSTEMS = ("eager", "eager-heap", "inductor", "inductor-freezing", "aotinductor", "onnxruntime", "openvino",
           "iree-default", "aot", "aot-coverage", "aot-stablehlo", "aot-dynamic")
# ``aot-dynamic``: the defaults with every input's batch dimension dynamic (DYNAMIC_BATCH),
# timed at the example's batch: the price of one artifact for every batch size
DYNAMIC_BATCH = (1, 32)
DEFAULT_SYSTEMS = ("eager", "eager-heap", "inductor", "iree-default", "aot")
QUICK_MODELS = ("resnet18_b1", "custom_op")
QUICK_SYSTEMS = ("eager", "iree-default", "aot")
PEER_SYSTEMS = ("eager", "eager-heap", "inductor-freezing", "aotinductor", "onnxruntime", "openvino", "aot")
WARM_S = 0.02  # untimed calls before each block, at least this long: ONNX Runtime's,
# OpenVINO's, IREE's and OpenMP's worker threads spin for a while after a call, on the
# cores the next system needs, and a program is slower than its steady state after a pause
BLOCK = 3      # timed calls per system per round
REL_TOL = 1e-3  # largest |system - eager| / largest |eager| a row may show and still be right


def _resnet18(batch):
    def make():
        from aot.models.resnet18 import resnet18
        return resnet18(batch=batch)
    return make


def _int8():
    from aot.models.quantized_resnet18 import quantized_resnet18
    return quantized_resnet18("x86", batch=1)


def _bert():
    from aot.models.bert import bert_encoder
    return bert_encoder(seq=128)


def _custom_op():
    from aot.models.custom_op import custom_op_model
    return custom_op_model()


def _vision(name, batch):
    def make():
        from aot.models.zoo import vision_model
        return vision_model(name, batch)
    return make


def _bert_base(batch):
    def make():
        from aot.models.zoo import bert_base
        return bert_base(batch)
    return make


def _hf(name, batch):
    def make():
        from aot.models.hf import hf_model
        return hf_model(name, batch)
    return make


def _timm(name, batch):
    def make():
        from aot.models.timm_zoo import timm_model
        return timm_model(name, batch)
    return make


BENCH_MODELS: dict[str, Callable] = {
    "resnet18_b1": _resnet18(1), "resnet18_b8": _resnet18(8), "resnet18_int8": _int8,
    "bert": _bert, "custom_op": _custom_op,
}
DEFAULT_MODELS = tuple(BENCH_MODELS)
_ZOO = ("resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0",
        "vit_b_16", "convnext_tiny")
for _name in _ZOO:
    for _b in (1, 8):
        BENCH_MODELS.setdefault(f"{_name}_b{_b}", _vision(_name, _b))
for _b in (1, 8):
    BENCH_MODELS[f"bert_base_b{_b}"] = _bert_base(_b)
# Hugging Face models from their configs (aot/models/hf.py; BERT-base itself, beside the
# bundled encoder at its width) and timm models (aot/models/timm_zoo.py), random weights
_HF = {"hf_bert_base": "bert_base", "distilbert": "distilbert", "t5_small_enc": "t5_small_enc",
       "llama_small": "llama_small", "mobilebert": "mobilebert"}
_TIMM = ("mobilevit_s", "convnext_atto", "efficientformer_l1", "deit_tiny", "levit_128")
for _name, _hf_name in _HF.items():
    BENCH_MODELS[f"{_name}_b1"] = _hf(_hf_name, 1)
for _name in _TIMM:
    BENCH_MODELS[f"timm_{_name}_b1"] = _timm(_name, 1)
# named model sets for ``--models``: the zoo of issue 15 at batch 1 and 8; real-world
# architectures from transformers and timm at batch 1
MODEL_SETS = {"quick": QUICK_MODELS, "default": DEFAULT_MODELS,
              "zoo_b1": tuple(f"{m}_b1" for m in _ZOO) + ("bert_base_b1",),
              "zoo_b8": tuple(f"{m}_b8" for m in _ZOO) + ("bert_base_b8",),
              "hf": tuple(f"{m}_b1" for m in _HF), "timm": tuple(f"timm_{m}_b1" for m in _TIMM)}
MODEL_SETS["zoo"] = MODEL_SETS["zoo_b1"] + MODEL_SETS["zoo_b8"]
MODEL_SETS["real"] = MODEL_SETS["hf"] + MODEL_SETS["timm"]
SYSTEM_SETS = {"quick": QUICK_SYSTEMS, "default": DEFAULT_SYSTEMS, "peers": PEER_SYSTEMS,
               "all": SYSTEMS}


def expand(names: list[str], sets: dict) -> list[str]:
    """Names with set names (``zoo``, ``peers``, ...) replaced by their members."""
    out = []
    for n in names:
        out += list(sets.get(n, (n,)))
    return list(dict.fromkeys(out))


@dataclass
class Row:
    model: str
    system: str
    target: str
    batch: int
    rel_err: float | None = None
    choice: str | None = None  # aot: the region or variant its compile chose
    median_ms: float | None = None
    p10_ms: float | None = None
    p90_ms: float | None = None
    throughput_per_s: float | None = None
    speed_vs_eager: float | None = None
    compile_s: float | None = None
    peak_rss_mb: float | None = None
    kernel_calls_per_run: float | None = None
    skipped: str | None = None
    samples_ms: list = field(default_factory=list)
    pid: int | None = None  # the process that built and timed it


def machine_info(target: str) -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "target": target}
    try:
        from importlib.metadata import version
        info["iree"] = version("iree-base-runtime")
    except Exception:
        info["iree"] = "unknown"
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _reset_peak_rss() -> None:
    try:  # Linux: "5" resets the peak resident set size (VmHWM) of this process
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _status_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _build(system: str, model, example, target: str):
    """``(callable, compile_seconds, kernel-call counter or None)``; raises to skip."""
    import aot

    from .peers import PEERS, build_peer
    t0 = time.perf_counter()
    if system == "eager":
        return model, 0.0, None
    if system == "eager-heap":
        from aot.fallback import heap
        if not heap.retain(heap.CEILING):
            raise RuntimeError("the C library here is not glibc: no heap to keep")
        return model, 0.0, None
    if system == "inductor":
        fn = torch.compile(model)
        with torch.no_grad():
            fn(*example)  # compiles on the first call
        return fn, time.perf_counter() - t0, None
    if system in PEERS:
        return build_peer(system, model, example, target), time.perf_counter() - t0, None
    if system == "iree-default":
        cm = aot.compile(model, example, target=target, fallback="none", profile="iree-default")
    elif system == "aot-coverage":
        cm = aot.compile(model, example, target=target, placement="coverage")
    elif system == "aot-stablehlo":
        cm = aot.compile(model, example, target=target, placement="coverage", via="stablehlo")
    elif system == "aot-dynamic":
        args, dyn = dynamic_batch(example)
        cm = aot.compile(model, args, target=target, dynamic_shapes=dyn)
    else:
        cm = aot.compile(model, example, target=target)
    return cm, time.perf_counter() - t0, cm


def dynamic_batch(example: tuple, lo: int = DYNAMIC_BATCH[0], hi: int = DYNAMIC_BATCH[1]):
    """``(args, dynamic_shapes)``: dimension 0 of every tensor input one ``batch`` Dim in
    ``lo..hi``; the example as it is (an example of batch 1 is exported at 2 by the
    importer and measured at 1)."""
    from torch.export import Dim

    batch = Dim("batch", min=lo, max=hi)
    return example, tuple({0: batch} if isinstance(x, torch.Tensor) else None for x in example)


def _rel_err(got, want) -> float:
    """Largest |got - want| over the largest |want|, over all output tensors."""
    g = [t for t in torch.utils._pytree.tree_leaves(got) if isinstance(t, torch.Tensor)]
    w = [t for t in torch.utils._pytree.tree_leaves(want) if isinstance(t, torch.Tensor)]
    if len(g) != len(w) or any(a.shape != b.shape for a, b in zip(g, w)):
        return float("inf")
    scale = max((b.abs().max().item() for b in w if b.numel()), default=0.0) or 1.0
    diff = max(((a.cpu().double() - b.cpu().double()).abs().max().item()
                for a, b in zip(g, w) if a.numel()), default=0.0)
    return diff / scale


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:160]


MAX_RUNS = 2000


def load_model(name: str, target: str):
    """``(model, example, batch)`` of benchmark model ``name``, on ``target``'s device.
    The global seed is set first, so every process that loads the model gets the same
    weights even from a factory that does not seed itself."""
    torch.manual_seed(0)
    model, example = BENCH_MODELS[name]()
    if target == "cuda":
        model = model.cuda()
        example = tuple(x.cuda() if isinstance(x, torch.Tensor) else x for x in example)
    batch = next((x.shape[0] for x in example if isinstance(x, torch.Tensor)), 1)
    return model, example, batch


def choice(counter) -> str | None:
    """What an aot build chose (its region or variant, else ``per-op``), to read its row by."""
    if counter is None:
        return None
    m = counter.manifest
    return (m.get("region") or m.get("variant") or {}).get("chosen") or "per-op"


def wants_more(samples: list, runs: int, min_seconds: float) -> bool:
    """The stopping rule: a system goes on until it has ``runs`` samples and, unless it
    reached ``MAX_RUNS``, ``min_seconds`` of timed calls (fast models get many samples,
    a slow baseline is not run for minutes)."""
    return len(samples) < runs or (len(samples) < MAX_RUNS and sum(samples) < min_seconds * 1e3)


def time_block(fn, example, sync, counter=None) -> tuple[list[float], float, int | None]:
    """One block: untimed calls for ``WARM_S``, then ``BLOCK`` timed calls.

    ``(samples in ms, peak resident memory a call added in MB, kernel calls the timed
    calls made, None without a counter)``."""
    counted, peak = None, 0.0

    def around():
        nonlocal counted
        if counted is None and counter is not None:  # the timed calls' kernel calls only
            counted = counter.kernel_call_count
        _reset_peak_rss()
        before = _status_mb("VmRSS") or 0.0

        def after():  # memory the call itself needed on top of what was resident before it
            nonlocal peak
            peak = max(peak, (_status_mb("VmHWM") or before) - before)
        return after
    # untimed calls first: threads wake up, caches refill
    samples = timing.block(lambda: fn(*example), BLOCK, warm_s=WARM_S, sync=sync, around=around)
    calls = counter.kernel_call_count - counted if counter is not None else None
    return samples, peak, calls


def finish_rows(rows: dict, samples: dict, peaks: dict, calls: dict) -> list[Row]:
    """Fill each timed row's statistics from its samples; speed relative to eager's row.

    ``calls[s]``: kernel calls over all timed calls, or None for a system without a
    counter (0 per run then, except inductor's, which nothing counts)."""
    for s, xs in samples.items():
        r, xs = rows[s], sorted(samples[s])
        r.samples_ms = [round(x, 4) for x in samples[s]]
        r.median_ms = statistics.median(xs)
        r.p10_ms, r.p90_ms = xs[int(0.1 * (len(xs) - 1))], xs[int(round(0.9 * (len(xs) - 1)))]
        r.throughput_per_s = r.batch / (r.median_ms / 1e3)
        r.peak_rss_mb = round(peaks[s], 1)
        if calls.get(s) is not None:
            r.kernel_calls_per_run = calls[s] / len(xs)
        elif s != "inductor":
            r.kernel_calls_per_run = 0.0
    eager = rows.get("eager")
    for r in rows.values():
        if eager and eager.median_ms and r.median_ms:
            r.speed_vs_eager = eager.median_ms / r.median_ms
    return list(rows.values())


def _fmt(v, spec):
    return "—" if v is None else format(v, spec)


def _times(v) -> str:
    return "—" if v is None else f"{v:.2f}x"


def _geomean(xs: list[float]) -> float | None:
    import math
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _right(r: Row) -> bool:
    return r.median_ms is not None and r.rel_err is not None and r.rel_err <= REL_TOL


def summary(rows: list[Row]) -> str:
    """Per model: the fastest correct peer, and ``aot`` (and ``aot-coverage``) against it
    and against eager; geomeans over the models every one of them ran."""
    ours = ("aot", "aot-coverage", "aot-stablehlo", "aot-dynamic")
    lines = ["| model | fastest peer | peer ms | aot ms | aot vs peer | aot-coverage vs eager |",
             "|---|---|---|---|---|---|"]
    vs_peer, cov = [], []
    for m in dict.fromkeys(r.model for r in rows):
        mine = {r.system: r for r in rows if r.model == m}
        peers = [r for s, r in mine.items() if s not in ours and s != "eager" and _right(r)]
        best = min(peers, key=lambda r: r.median_ms, default=None)
        a, c = mine.get("aot"), mine.get("aot-coverage")
        ratio = best.median_ms / a.median_ms if best and a and _right(a) else None
        cvs = c.speed_vs_eager if c and _right(c) else None
        if ratio:
            vs_peer.append(ratio)
        if cvs:
            cov.append(cvs)
        lines.append(f"| {m} | {best.system if best else '—'} | "
                     f"{_fmt(best.median_ms if best else None, '.2f')} | "
                     f"{_fmt(a.median_ms if a else None, '.2f')} | {_times(ratio)} | {_times(cvs)} |")
    g, gc = _geomean(vs_peer), _geomean(cov)
    lines.append(f"| **geomean** | | | | {_times(g)} | {_times(gc)} |")
    return ("aot against the fastest peer that gave eager's answer (> 1: aot is faster); "
            "aot-coverage against eager:\n\n" + "\n".join(lines) + "\n")


def markdown(rows: list[Row], info: dict, runs: int) -> str:
    """The table, with a header naming the machine and how the rows were measured.
    ``info["in_process"]`` (else: whether a row was timed in this process) says whether
    the systems shared one process."""
    in_process = info.get("in_process")
    if in_process is None:
        in_process = any(r.pid == os.getpid() for r in rows)
    layout = ("All systems ran in one process (--in-process: their thread pools share it)"
              if in_process else
              "Each system ran in its own worker process, one process at a time")
    head = (f"Machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']} "
            f"({info['torch_threads']} threads), IREE {info['iree']}"
            + (f", GPU {info['gpu']}" if "gpu" in info else "") + f"; target {info['target']}. "
            f"{layout}, interleaved round by round (the order rotating every round): per "
            f"round, {WARM_S * 1e3:.0f} ms of untimed calls, then a block of {BLOCK} timed "
            f"ones. Median and 10th–90th percentile of at least {runs} runs (runs per row "
            "in the table). Denormals: left as each system leaves them (no flush-to-zero "
            "set). Error: largest |system - eager| over the largest |eager|; "
            f"beyond {REL_TOL:g} the row is marked ✗.\n\n")
    lines = ["| model | system | median ms | p10–p90 ms | runs | items/s | speed vs eager "
             "| compile s | peak RSS added MB | kernel calls/run | error |", "|" + "---|" * 11]
    for r in rows:
        if r.skipped:
            lines.append(f"| {r.model} | {r.system} | skipped: {r.skipped} | | | | | | | | |")
            continue
        err = "—" if r.rel_err is None else f"{r.rel_err:.1e}" + ("" if _right(r) else " ✗")
        lines.append(
            f"| {r.model} | {r.system}{f' ({r.choice})' if r.choice else ''} | "
            f"{_fmt(r.median_ms, '.2f')} | "
            f"{_fmt(r.p10_ms, '.2f')}–{_fmt(r.p90_ms, '.2f')} | {len(r.samples_ms)} | "
            f"{_fmt(r.throughput_per_s, '.1f')} | "
            f"{_fmt(r.speed_vs_eager, '.2f')}x | {_fmt(r.compile_s, '.1f')} | "
            f"{_fmt(r.peak_rss_mb, '.0f')} | {_fmt(r.kernel_calls_per_run, '.0f')} | {err} |")
    body = head + "\n".join(lines) + "\n"
    peers = {r.system for r in rows} - {"eager", "aot", "aot-coverage", "aot-stablehlo", "aot-dynamic"}
    if any(r.system in ("aot", "aot-coverage") for r in rows) and peers:
        body += "\n" + summary(rows)
    if any(r.system == "aot-dynamic" for r in rows):
        body += "\n" + dynamic_summary(rows)
    return body


def dynamic_summary(rows: list[Row]) -> str:
    """Per model: the dynamic-batch artifact against the static one, same run."""
    lines = ["| model | aot ms (static) | aot-dynamic ms | dynamic vs static | within 10% |"
             " compile s static / dynamic |", "|---|---|---|---|---|---|"]
    for m in dict.fromkeys(r.model for r in rows):
        mine = {r.system: r for r in rows if r.model == m}
        a, d = mine.get("aot"), mine.get("aot-dynamic")
        if not (a and d and _right(a) and _right(d)):
            continue
        ratio = a.median_ms / d.median_ms
        lines.append(f"| {m} | {a.median_ms:.2f} ({a.choice}) | {d.median_ms:.2f} ({d.choice}) | "
                     f"{_times(ratio)} | {'yes' if ratio >= 1 / 1.1 else 'no'} | "
                     f"{_fmt(a.compile_s, '.1f')} / {_fmt(d.compile_s, '.1f')} |")
    return (f"aot-dynamic (batch {DYNAMIC_BATCH[0]}..{DYNAMIC_BATCH[1]}, one artifact) against "
            "aot (static, one artifact per shape) at the example's shape (> 1: the dynamic one "
            "is faster):\n\n" + "\n".join(lines) + "\n")


def plot(rows: list[Row], path: str, info: dict) -> bool:
    """Bar chart of speed vs eager per model and system; False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    models = list(dict.fromkeys(r.model for r in rows))
    systems = list(dict.fromkeys(r.system for r in rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(models)), 4))
    width = 0.8 / max(1, len(systems))
    for j, s in enumerate(systems):
        vals = [next((r.speed_vs_eager or 0.0 for r in rows if r.model == m and r.system == s), 0.0)
                for m in models]
        ax.bar([i + j * width for i in range(len(models))], vals, width, label=s)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks([i + width * (len(systems) - 1) / 2 for i in range(len(models))], models)
    ax.set_ylabel("speed vs eager (higher is faster)")
    ax.set_title(f"{info['cpu']} ({info['cores']} cores), target {info['target']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_outputs(rows: list[Row], info: dict, runs: int, out_dir: str) -> dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = {"markdown": os.path.join(out_dir, "bench.md"),
             "json": os.path.join(out_dir, "bench.json"),
             "png": os.path.join(out_dir, "bench.png")}
    with open(paths["markdown"], "w") as f:
        f.write(markdown(rows, info, runs))
    with open(paths["json"], "w") as f:
        json.dump({"machine": info, "runs": runs, "rows": [asdict(r) for r in rows]}, f, indent=1)
    if not plot(rows, paths["png"], info):
        del paths["png"]
    return paths
