"""Greedy generation speed: time to first token and decode tokens/s, per system.

    aot bench --generate 32:64 [--models llama_small] [--runs 5]
              [--systems eager,hf-static-compile,aot] [--out DIR]

Systems:
- ``eager``: ``model.generate(ids, do_sample=False)`` with its default (dynamic) cache;
- ``hf-static-compile``: the same with ``cache_implementation="static"`` and the model's
  forward under ``torch.compile`` (what Hugging Face recommends for speed; the default
  mode: CUDA graphs, its `reduce-overhead`, do not apply on a CPU);
- ``aot``: ``aot.compile_causal_lm(model, max_length=prompt + new)``.

Models: Llama configurations (random weights, nothing downloaded): ``llama_small`` (4
layers, hidden 512, 8 heads, 2 key/value heads, vocabulary 32000) and ``llama_tiny``.

Each system runs in its own worker process (thread pools of different systems slow each
other in one process); the coordinator builds them one after another, then asks each in
turn, round after round, for one timed ``generate`` of 1 new token (time to first token)
and one of ``--new`` tokens, after a 50 ms pause and one untimed call of 1 token (the
threads of the system timed before may still spin from its last call). Decode tokens/s:
``(new - 1) / (t_new - t_first)``. Medians
over the rounds; the tokens each system made are compared with eager's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODELS = {
    "llama_small": dict(vocab_size=32000, hidden_size=512, intermediate_size=1376,
                        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                        max_position_embeddings=2048),
    "llama_tiny": dict(vocab_size=4096, hidden_size=128, intermediate_size=256,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=512),
}


def _model(name: str):
    import torch
    import transformers as tf
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(tf.LlamaConfig(**MODELS[name])).eval()


def _worker(args) -> None:
    import torch
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", torch.get_num_threads())))
    model = _model(args.model)
    vocab = MODELS[args.model]["vocab_size"]
    ids = torch.randint(0, vocab, (1, args.prompt), generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    if args.system == "aot":
        import aot
        gen = aot.compile_causal_lm(model, max_length=args.prompt + args.new)
        run = lambda n: gen.generate(ids, max_new_tokens=n)  # noqa: E731
    else:
        if args.system == "hf-static-compile":
            model.generation_config.cache_implementation = "static"
            model.forward = torch.compile(model.forward, fullgraph=True)

        def run(n):
            with torch.no_grad():
                return model.generate(ids, do_sample=False, max_new_tokens=n,
                                      min_new_tokens=n, attention_mask=torch.ones_like(ids))
    tokens = run(args.new)  # warm-up (compiles torch.compile's graphs)
    run(1)
    build_s = time.perf_counter() - t0
    print(json.dumps({"ready": True, "build_s": build_s, "tokens": tokens[0].tolist()}),
          flush=True)
    for line in sys.stdin:
        n = int(line)
        t = time.perf_counter()
        run(n)
        print(json.dumps({"s": time.perf_counter() - t}), flush=True)


SYSTEMS = ("eager", "hf-static-compile", "aot")


SETTLE_S = 0.05  # the pause before each system's calls in a round


def run(model: str, prompt: int, new: int, rounds: int, systems, log=print) -> str:
    """The markdown table of one model's run (see the module docstring)."""
    if model not in MODELS:
        raise ValueError(f"no generation model {model!r}; choose one of {list(MODELS)}")
    systems = list(dict.fromkeys(systems))  # a system named twice runs once
    bad = [s for s in systems if s not in SYSTEMS]
    if bad:
        raise ValueError(f"no generation system {bad[0]!r}; choose from {list(SYSTEMS)}")
    procs, info = {}, {}
    try:
        for s in systems:  # built one after another: no compile competes with another
            log(f"{model}: building {s} in its own process ...")
            procs[s] = subprocess.Popen(
                [sys.executable, "-m", "aot.bench.generate", "--worker", s, "--model", model,
                 "--prompt", str(prompt), "--new", str(new)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            line = procs[s].stdout.readline()
            if not line:
                raise RuntimeError(f"the {s} worker died while building (exit "
                                   f"{procs[s].wait()})")
            info[s] = json.loads(line)
        times = {s: {"first": [], "all": []} for s in systems}
        for r in range(rounds):
            order = systems[r % len(systems):] + systems[:r % len(systems)]
            for s in order:
                # another system's threads may still spin from its last call: a pause,
                # then one untimed call, before this one's timed ones
                time.sleep(SETTLE_S)
                for key, n in ((None, 1), ("first", 1), ("all", new)):
                    procs[s].stdin.write(f"{n}\n")
                    procs[s].stdin.flush()
                    took = json.loads(procs[s].stdout.readline())["s"]
                    if key is not None:
                        times[s][key].append(took)
    finally:
        for proc in procs.values():
            if proc.stdin:
                proc.stdin.close()
            proc.wait()
    ref = info[systems[0]]["tokens"]
    lines = [f"model {model}, prompt {prompt}, {new} new tokens, batch 1, medians of "
             f"{rounds} rounds, each system in its own process",
             "", f"| system | time to first token ms | decode tokens/s | build s | "
             f"tokens as {systems[0]}'s |", "|---|---|---|---|---|"]
    for s in systems:
        first = statistics.median(times[s]["first"])
        full = statistics.median(times[s]["all"])
        rate = (new - 1) / max(full - first, 1e-9)
        lines.append(f"| {s} | {first * 1e3:.1f} | {rate:.1f} | {info[s]['build_s']:.1f} | "
                     f"{'yes' if info[s]['tokens'] == ref else 'NO'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description="a generation benchmark worker")
    p.add_argument("--worker", required=True, choices=SYSTEMS)
    p.add_argument("--model", required=True, choices=list(MODELS))
    p.add_argument("--prompt", type=int, required=True)
    p.add_argument("--new", type=int, required=True)
    args = p.parse_args()
    args.system = args.worker
    _worker(args)


if __name__ == "__main__":
    main()
