"""Greedy generation speed: time to first token and decode tokens/s, per system.

    python benchmarks/generate.py [--model llama_small] [--prompt 32] [--new 64]
                                  [--rounds 5] [--systems eager,hf-static-compile,aot]

Systems:
- ``eager``: ``model.generate(ids, do_sample=False)`` with its default (dynamic) cache;
- ``hf-static-compile``: the same with ``cache_implementation="static"`` and the model's
  forward under ``torch.compile`` (what Hugging Face recommends for speed; the default
  mode: CUDA graphs, its `reduce-overhead`, do not apply on a CPU);
- ``aot``: ``aot.compile_causal_lm(model, max_length=prompt + new)``.

Each system runs in its own worker process (thread pools of different systems slow each
other in one process); the coordinator builds them one after another, then asks each in
turn, round after round, for one timed ``generate`` of 1 new token (time to first token)
and one of ``--new`` tokens. Decode tokens/s: ``(new - 1) / (t_new - t_first)``. Medians
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama_small", choices=list(MODELS))
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--systems", default="eager,aot")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.system = args.worker
        _worker(args)
        return
    systems = args.systems.split(",")
    procs, info = {}, {}
    for s in systems:  # built one after another: no compile competes with another
        procs[s] = subprocess.Popen(
            [sys.executable, __file__, "--worker", s, "--model", args.model,
             "--prompt", str(args.prompt), "--new", str(args.new)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        info[s] = json.loads(procs[s].stdout.readline())
        print(f"[generate] {s}: built in {info[s]['build_s']:.1f} s", file=sys.stderr)
    times = {s: {"first": [], "all": []} for s in systems}
    for r in range(args.rounds):
        order = systems[r % len(systems):] + systems[:r % len(systems)]
        for s in order:
            for key, n in (("first", 1), ("all", args.new)):
                procs[s].stdin.write(f"{n}\n")
                procs[s].stdin.flush()
                times[s][key].append(json.loads(procs[s].stdout.readline())["s"])
    for proc in procs.values():
        proc.stdin.close()
        proc.wait()
    ref = info[systems[0]]["tokens"]
    print(f"model {args.model}, prompt {args.prompt}, {args.new} new tokens, batch 1, "
          f"medians of {args.rounds} rounds")
    print("| system | time to first token ms | decode tokens/s | build s | tokens as "
          f"{systems[0]}'s |")
    print("|---|---|---|---|---|")
    for s in systems:
        first = statistics.median(times[s]["first"])
        full = statistics.median(times[s]["all"])
        rate = (args.new - 1) / max(full - first, 1e-9)
        print(f"| {s} | {first * 1e3:.1f} | {rate:.1f} | {info[s]['build_s']:.1f} | "
              f"{'yes' if info[s]['tokens'] == ref else 'NO'} |")


if __name__ == "__main__":
    main()
