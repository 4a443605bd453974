"""The ``aot`` command: compile, run, report, sign, demo.

    aot compile PATH_OR_MODULE:FACTORY --input-shape 1,3,224,224 -o m.aot
    aot run m.aot [--sha256 HEX] [--verify key.pub [--signature m.aot.sig]]
    aot report m.aot [--sha256 HEX] [--verify key.pub [--signature m.aot.sig]]
    aot keygen key.pem              (key.pem + key.pub, for aot sign / --verify)
    aot sign m.aot --key key.pem    (writes m.aot.sig; pip install 'aot[signing]')
    aot demo
    aot bench [--quick] [--in-process] [--generate PROMPT:NEW]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import statistics
import sys
import time

from .stage_names import EMIT

__all__ = ["main"]


def _load_factory(spec: str):
    """``pkg.mod:factory`` or ``path/to/file.py:factory`` or a bundled model name."""
    if ":" not in spec:
        from aot import models
        return lambda: models.get(spec)
    where, name = spec.rsplit(":", 1)
    if where.endswith(".py") or os.sep in where:
        if not os.path.exists(where):
            raise SystemExit(f"aot: no such file {where!r}")
        mspec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(where))[0], where)
        mod = importlib.util.module_from_spec(mspec)
        mspec.loader.exec_module(mod)
    else:
        try:
            mod = importlib.import_module(where)
        except ImportError as e:
            raise SystemExit(f"aot: cannot import {where!r}: {e}")
    try:
        return getattr(mod, name)
    except AttributeError:
        raise SystemExit(f"aot: {where!r} has no attribute {name!r}")


def _parse_shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(","))
    except ValueError:
        raise SystemExit(f"aot: --input-shape {text!r} should be comma-separated ints, e.g. 1,3,224,224")


def parse_dynamic(specs: list[str], model, n_inputs: int):
    """``--dynamic`` entries as ``torch.export``'s ``dynamic_shapes`` (a tuple per input).

    Each entry is ``INPUT:DIM=NAME[:MIN..MAX]``: INPUT is a positional index or the name
    of ``forward``'s parameter, DIM a dimension index, NAME the symbol (entries with the
    same NAME share it); the range goes on the NAME's first entry.
    """
    import inspect
    from torch.export import Dim
    if not specs:
        return None
    try:
        params = [p for p in inspect.signature(model.forward).parameters]
    except (TypeError, ValueError):
        params = []
    per_input: list[dict] = [{} for _ in range(n_inputs)]
    dims: dict = {}
    for text in specs:
        bad = f"aot: --dynamic {text!r}: expected INPUT:DIM=NAME:MIN..MAX, e.g. x:0=batch:1..64"
        where, _, what = text.partition("=")
        inp, _, dim = where.partition(":")
        name, _, rng = what.partition(":")
        if not (inp and dim and name) or not dim.lstrip("-").isdigit() \
                or not name.isidentifier():
            raise SystemExit(bad)
        idx = int(inp) if inp.isdigit() else (params.index(inp) if inp in params else None)
        if idx is None or idx >= n_inputs:
            raise SystemExit(f"aot: --dynamic {text!r}: no input {inp!r} (inputs: "
                             f"{', '.join(params[:n_inputs]) or n_inputs} by name or index)")
        if rng:
            lo, sep, hi = rng.partition("..")
            if not sep or not lo.isdigit() or not hi.isdigit() or int(lo) > int(hi):
                raise SystemExit(bad)
            if name in dims:
                raise SystemExit(f"aot: --dynamic {text!r}: {name} already has a range")
            dims[name] = Dim(name, min=int(lo), max=int(hi))
        elif name not in dims:
            raise SystemExit(f"aot: --dynamic {text!r}: give {name}'s range on its first entry "
                             f"({name}:MIN..MAX)")
        per_input[idx][int(dim)] = dims[name]
    return tuple(d or None for d in per_input)


def _model_and_inputs(args):
    import torch
    made = _load_factory(args.model)()
    model, example = (made if isinstance(made, tuple) else (made, None))
    if args.input_shape:
        dtype = getattr(torch, args.input_dtype)
        gen = torch.Generator().manual_seed(0)
        example = tuple(
            torch.randn(_parse_shape(s), generator=gen).to(dtype) if dtype.is_floating_point
            else torch.randint(0, 100, _parse_shape(s), generator=gen, dtype=dtype)
            for s in args.input_shape)
    if example is None:
        raise SystemExit("aot: give --input-shape (the factory returned only a model)")
    if not isinstance(example, tuple):
        example = (example,)
    return model.eval(), example


def _step(msg: str):
    print(f"[aot] {msg}", file=sys.stderr, flush=True)


def cmd_compile(args) -> int:
    from . import progress
    from .errors import CompileFailed
    from .stages import Options, export
    from .torch_tensor import TorchTensor
    progress.show()

    if args.parameters and args.emit != "vmfb":
        raise CompileFailed("--parameters goes with --emit vmfb", stage="options")
    if args.emit == "vmfb" and not args.output:
        raise CompileFailed("--emit vmfb needs -o FILE.vmfb", stage="options")
    model, example = _model_and_inputs(args)
    options = Options.resolve(target=args.target, fallback=args.fallback,
                              fallback_ops=args.fallback_op, placement=args.placement,
                              plan=args.plan, strict=args.strict, extra_flags=args.flag,
                              via=args.via,
                              dynamic_shapes=parse_dynamic(args.dynamic, model, len(example)))
    target, policy = options.target, options.policy
    t0 = time.perf_counter()
    _step(f"exporting {type(model).__name__} ...")
    exported = export(model, example, None, options)
    if args.emit == "vmfb":
        _step(f"compiling every op for {target.name} (placement='coverage'; flags measured "
              "on this machine where it is the target) ...")
        data = exported.vmfb(args.parameters)
        with open(args.output, "wb") as f:
            f.write(data)
        n_in = sum(1 for leaf in exported.imported.flat_inputs if isinstance(leaf, TorchTensor))
        params = ""
        if args.parameters:
            params = f"--parameters=model={args.parameters} "
            _step(f"wrote {args.parameters} "
                  f"({os.path.getsize(args.parameters) / 1e6:.1f} MB of weights)")
        _step(f"wrote {args.output} ({len(data) / 1e6:.1f} MB) in "
              f"{time.perf_counter() - t0:.1f}s; run it with: iree-run-module "
              f"--module={args.output} {params}--device={target.driver} --function=main "
              + " ".join(f"--input=@in{i}.npy" for i in range(n_in)))
        return 0
    if args.emit == "stablehlo":
        _step("lowering to StableHLO through torch-mlir (ops it cannot lower become "
              "custom calls) ...")
        text = exported.stablehlo()
        if args.output:
            with open(args.output, "w") as f:
                f.write(text)
            _step(f"wrote {args.output} in {time.perf_counter() - t0:.1f}s")
        else:
            print(text)
        return 0
    if args.emit:  # the MLIR at that stage
        print(exported.emit(args.emit))
        return 0
    _step(f"partitioning for {target.name} (fallback={policy.fallback!r}) and compiling "
          f"with IREE ({target.backend}) ...")
    # the example inputs time the region candidates, as aot.compile does
    art = exported.compile()
    out = args.output or f"{exported.imported.name.lower()}.aot"
    art.save(out)
    n_kc = len(art.manifest.kernel_calls)
    _step(f"wrote {out} ({os.path.getsize(out) / 1e6:.1f} MB, {n_kc} kernel calls) "
          f"in {time.perf_counter() - t0:.1f}s")
    from .artifact import file_sha256
    print(f"sha256: {file_sha256(out)}")  # what `aot run --sha256` / aot.load(sha256=) pin
    if args.save_plan:
        with open(args.save_plan, "w") as f:
            json.dump(art.manifest.plan(), f, indent=1)
        _step(f"wrote the placement plan to {args.save_plan}")
    return 0


def _random_inputs(module):
    import torch
    from .fallback import static_values
    from .torch_tensor import TorchTensor
    import torch.utils._pytree as pytree
    gen = torch.Generator().manual_seed(0)
    leaves = []
    sizes = {sym: e["example"] for sym, e in module.symbols.items()}  # the example's sizes
    for spec in module.inputs:
        if isinstance(spec, TorchTensor):
            spec = spec.bind(sizes)
            dt = spec.torch_dtype
            t = (torch.randn(spec.shape, generator=gen).to(dt) if dt.is_floating_point
                 else torch.randint(0, 100, spec.shape, generator=gen, dtype=dt))
            leaves.append(t)
        else:
            leaves.append(static_values.decode(spec[1]))
    return pytree.tree_unflatten(leaves, module.in_spec)


def _integrity(args) -> dict:
    """``aot.load``'s integrity arguments from ``--sha256``, ``--verify``,
    ``--signature`` and ``--no-legacy``."""
    return {"sha256": args.sha256, "verify": args.verify, "signature": args.signature,
            "legacy": not args.no_legacy}


def cmd_run(args) -> int:
    import torch
    from .runtime import load
    cm = load(args.artifact, **_integrity(args))
    call_args, call_kwargs = _random_inputs(cm)
    if args.inputs:
        loaded = torch.load(args.inputs)
        call_args, call_kwargs = (loaded if isinstance(loaded, tuple) else (loaded,)), {}
    out = cm(*call_args, **call_kwargs)
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        cm(*call_args, **call_kwargs)
        times.append(time.perf_counter() - t0)
    import torch.utils._pytree as pytree
    for i, o in enumerate(pytree.tree_leaves(out)):
        print(f"output {i}: {str(o.dtype).replace('torch.', '')}{list(o.shape)} "
              f"mean={o.float().mean().item():.6g}")
    if times:
        print(f"latency: median {statistics.median(times) * 1e3:.2f} ms over {len(times)} runs "
              f"({cm.kernel_call_count // (len(times) + 1)} kernel calls per run)")
    if args.output:
        torch.save(out, args.output)
    return 0


def cmd_report(args) -> int:
    from .artifact import file_sha256
    from .reporting import format_report
    from .runtime.loading import read_artifact
    art = read_artifact(args.artifact, **_integrity(args))
    print(format_report(art.manifest))
    print(f"sha256: {file_sha256(args.artifact)}")
    return 0


def cmd_sign(args) -> int:
    from .artifact import file_sha256
    from .signing import sign
    sig = sign(args.artifact, args.key, args.signature)
    _step(f"signed {args.artifact} (sha256 {file_sha256(args.artifact)}); wrote {sig}")
    return 0


def cmd_keygen(args) -> int:
    from .signing import keygen
    private, public = keygen(args.private_key, args.public)
    _step(f"wrote the private key {private} (keep it secret: it signs) and the public key "
          f"{public} (give it to whoever loads: aot run --verify {public})")
    return 0


def _integrity_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("integrity (checked before the file is parsed; docs/security.md)")
    g.add_argument("--sha256", metavar="HEX",
                   help="refuse any file but the one with this SHA-256 (as `aot compile` "
                        "and `aot report` print it)")
    g.add_argument("--verify", metavar="PUBLIC.pem",
                   help="require a valid signature by this public key's private key "
                        "(`aot sign`; pip install 'aot[signing]')")
    g.add_argument("--signature", metavar="FILE",
                   help="the signature file for --verify (default: ARTIFACT.sig)")
    g.add_argument("--no-legacy", action="store_true",
                   help="refuse format versions 1 and 2 (no whole-file digest)")


def cmd_demo(args) -> int:
    import torch
    import aot
    from aot import models
    from aot import progress
    progress.show()
    name = args.model
    model, example = models.get(name)
    _step(f"demo: compiling bundled model {name!r} for cpu (first run probes op coverage; "
          "this takes a minute) ...")
    t0 = time.perf_counter()
    cm = aot.compile(model, example)
    _step(f"compiled in {time.perf_counter() - t0:.1f}s")
    path = args.output or f"{name}.aot"
    cm.save(path)
    cm2 = aot.load(path)
    with torch.no_grad():
        ref = model(*example)
    out = cm2(*example)
    err = (out - ref).abs().max().item()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    eager, ours = [], []
    for _ in range(5):
        t = time.perf_counter(); model(*example); eager.append(time.perf_counter() - t)
        t = time.perf_counter(); cm2(*example); ours.append(time.perf_counter() - t)
    print(cm2.report())
    print(f"\nsaved {path}; loaded and ran it: max |aot - eager| = {err:.2e} (matches eager)")
    print(f"latency (median of 5): eager {statistics.median(eager) * 1e3:.1f} ms, "
          f"aot {statistics.median(ours) * 1e3:.1f} ms")
    return 0


def cmd_bench(args) -> int:
    if args.generate:
        return _bench_generate(args)
    from aot.bench import driver, suite
    models = suite.expand(args.models.split(","), suite.MODEL_SETS) if args.models else list(
        suite.QUICK_MODELS if args.quick else suite.DEFAULT_MODELS)
    systems = suite.expand(args.systems.split(","), suite.SYSTEM_SETS) if args.systems else \
        list(suite.QUICK_SYSTEMS if args.quick else suite.DEFAULT_SYSTEMS)
    runs = args.runs or (5 if args.quick else 30)
    min_s = args.min_seconds if args.min_seconds is not None else (0.0 if args.quick else 3.0)
    info = suite.machine_info(args.target)
    info["in_process"] = args.in_process

    def partial(rows):  # an interrupted run keeps the models it finished
        suite.write_outputs(rows, info, runs, args.out)
        _step(f"{len({r.model for r in rows})} of {len(models)} model(s) done; "
              f"outputs so far in {args.out}")

    try:
        rows = driver.run_suite(models, systems, runs, warmup=2 if args.quick else 5,
                               target=args.target, log=_step, min_seconds=min_s,
                               on_model=partial, in_process=args.in_process)
    except ValueError as e:
        raise SystemExit(f"aot: {e}")
    paths = suite.write_outputs(rows, info, runs, args.out)
    print(suite.markdown(rows, info, runs))
    for kind, path in paths.items():
        _step(f"wrote {kind}: {path}")
    if "png" not in paths:
        _step("no PNG chart: install matplotlib (pip install -e '.[bench]')")
    return 0


def _bench_generate(args) -> int:
    """``aot bench --generate PROMPT:NEW``: greedy generation, time to first token and
    decode tokens/s per system (``aot.bench.generate``)."""
    import os

    from aot.bench import generate
    try:
        prompt, new = (int(x) for x in args.generate.split(":"))
        if prompt < 1 or new < 2:
            raise ValueError
    except ValueError:
        raise SystemExit(f"aot: --generate {args.generate!r}: PROMPT:NEW, a prompt of 1 or "
                         "more tokens and 2 or more new ones (e.g. 32:64)")
    models = args.models.split(",") if args.models else ["llama_small"]
    systems = args.systems.split(",") if args.systems else ["eager", "aot"]
    tables = []
    for model in models:
        try:
            tables.append(generate.run(model, prompt, new, args.runs or 5, systems, log=_step))
        except ValueError as e:
            raise SystemExit(f"aot: {e}")
    text = "\n".join(tables)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "generate.md")
    with open(path, "w") as f:
        f.write(text)
    _step(f"wrote markdown: {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aot", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile", help="compile a model to an artifact")
    c.add_argument("model", help="pkg.module:factory, path/to/file.py:factory, or a bundled "
                   "model name (resnet18, bert, custom_op, unlowerable); the factory returns "
                   "a model or (model, example_args)")
    c.add_argument("--input-shape", action="append", default=[],
                   help="example input shape, e.g. 1,3,224,224 (repeat for several inputs)")
    c.add_argument("--input-dtype", default="float32", help="dtype of generated inputs")
    c.add_argument("-o", "--output", help="artifact path (default: <model>.aot)")
    c.add_argument("--target", default="cpu",
                   help="cpu (this machine), cpu:<cpu or triple> (another CPU: cpu:x86-64-v3, "
                        "cpu:znver4, cpu:aarch64-linux-gnu[:neoverse-v1]) or cuda")
    c.add_argument("--fallback", default="auto", help="auto, all or none")
    c.add_argument("--fallback-op", action="append", default=[],
                   help="force an op to ATen, e.g. aten.layer_norm (repeatable)")
    c.add_argument("--flag", action="append", default=[], help="extra iree-compile flag")
    c.add_argument("--placement", default="auto",
                   help="auto (heavy ops where they measure faster) or coverage")
    c.add_argument("--strict", action="store_true", help="torch.export strict mode")
    c.add_argument("--dynamic", action="append", default=[], metavar="INPUT:DIM=NAME:MIN..MAX",
                   help="a dynamic dimension, e.g. x:0=batch:1..64 (input by name or "
                   "index; repeat, the same NAME shares the size); one artifact serves "
                   "every size in range")
    c.add_argument("--plan", help="reuse the placement decisions saved by --save-plan "
                                  "(instead of measuring)")
    c.add_argument("--save-plan", help="write this compile's placement decisions (JSON)")
    c.add_argument("--via", default="torch", choices=["torch", "stablehlo"],
                   help="what IREE compiles: the Torch dialect (default) or StableHLO "
                        "lowered by torch-mlir (pip install 'aot[stablehlo]')")
    c.add_argument("--emit", choices=EMIT,
                   help="print the MLIR at this stage instead of compiling (to -o when "
                        "given, for stablehlo); vmfb: write a plain IREE module to -o "
                        "that iree-run-module runs (every op compiled, or refused)")
    c.add_argument("--parameters", metavar="FILE.irpa",
                   help="with --emit vmfb: write the weights to this IREE parameter archive "
                        "(run with --parameters=model=FILE.irpa); the module keeps the code")
    c.set_defaults(fn=cmd_compile)
    r = sub.add_parser("run", help="load an artifact and run it on random (or given) inputs")
    r.add_argument("artifact")
    r.add_argument("--inputs", help="a .pt file with a tensor or tuple of tensors")
    r.add_argument("--repeat", type=int, default=10, help="timed runs after the first")
    r.add_argument("-o", "--output", help="save outputs to this .pt file")
    _integrity_options(r)
    r.set_defaults(fn=cmd_run)
    rep = sub.add_parser("report", help="what was compiled and what falls back to ATen")
    rep.add_argument("artifact")
    _integrity_options(rep)
    rep.set_defaults(fn=cmd_report)
    s = sub.add_parser("sign", help="sign an artifact with an elliptic-curve private key "
                       "(model-signing; pip install 'aot[signing]')")
    s.add_argument("artifact")
    s.add_argument("--key", required=True, metavar="PRIVATE.pem",
                   help="the private key (PEM: P-256, P-384 or P-521; `aot keygen` makes one)")
    s.add_argument("--signature", metavar="OUT.sig",
                   help="where to write the signature (default: ARTIFACT.sig)")
    s.set_defaults(fn=cmd_sign)
    k = sub.add_parser("keygen", help="make a P-256 key pair for `aot sign` and --verify")
    k.add_argument("private_key", metavar="PRIVATE.pem",
                   help="the private key to write (mode 0600; never overwritten)")
    k.add_argument("--public", metavar="PUBLIC.pem",
                   help="the public key to write (default: key.pub for key.pem)")
    k.set_defaults(fn=cmd_keygen)
    d = sub.add_parser("demo", help="compile, save, load and run a bundled model end to end")
    d.add_argument("--model", default="resnet18")
    d.add_argument("-o", "--output")
    d.set_defaults(fn=cmd_demo)
    b = sub.add_parser("bench", help="benchmark eager, torch.compile, IREE and aot side by "
                       "side, each system in its own process")
    b.add_argument("--quick", action="store_true",
                   help="ResNet18 b1 + custom op, eager/iree-default/aot, 5 runs (a few minutes)")
    b.add_argument("--models", help="comma-separated: resnet18_b1, resnet18_b8, resnet18_int8, "
                   "bert, custom_op (the default set), torchvision's <name>_b1/_b8 for resnet50, "
                   "mobilenet_v2, mobilenet_v3_small, efficientnet_b0, vit_b_16, "
                   "convnext_tiny, bert_base_b1/_b8; Hugging Face models from their configs "
                   "(random weights): hf_bert_base_b1, distilbert_b1, t5_small_enc_b1, "
                   "llama_small_b1; timm: timm_mobilevit_s_b1, timm_convnext_atto_b1, "
                   "timm_efficientformer_l1_b1, timm_deit_tiny_b1; or a set: quick, "
                   "default, zoo_b1, zoo_b8, zoo, hf, timm, real (hf + timm)")
    b.add_argument("--systems", help="comma-separated: eager, eager-heap (eager with the C "
                   "heap keeping freed memory, as an artifact's process does), inductor, "
                   "inductor-freezing, aotinductor, onnxruntime, openvino, iree-default, aot, "
                   "aot-coverage, aot-stablehlo, aot-dynamic (batch dimension dynamic), or a "
                   "set: quick, default (eager, eager-heap, inductor, iree-default, aot), "
                   "peers (eager, eager-heap, the four peers, aot), all")
    b.add_argument("--runs", type=int, help="timed runs per system (default 30; quick 5)")
    b.add_argument("--min-seconds", type=float,
                   help="keep adding interleaved rounds (up to 2000 runs) until each system "
                   "has run this long: many more samples for fast models (default 3; quick 0)")
    b.add_argument("--target", default="cpu", help="cpu or cuda")
    b.add_argument("--in-process", action="store_true",
                   help="build and time every system in this one process (their thread "
                   "pools then interfere) instead of one worker process per system")
    b.add_argument("--generate", metavar="PROMPT:NEW",
                   help="greedy text generation instead: time to first token and decode "
                   "tokens/s for a PROMPT-token prompt and NEW tokens; --models llama_small "
                   "(default) or llama_tiny, --systems eager, hf-static-compile (transformers' "
                   "static cache under torch.compile), aot (default eager,aot), --runs rounds "
                   "(default 5)")
    b.add_argument("--out", default="bench-results", help="output folder (md, json, png)")
    b.set_defaults(fn=cmd_bench)
    return p


def main(argv=None) -> int:
    from .errors import AotError
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except AotError as e:
        print(f"aot: error: {type(e).__name__} {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
