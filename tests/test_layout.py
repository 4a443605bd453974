"""The package's import graph has no circle, counting imports inside functions too: data
moves forward through the pipeline's stages, and the runtime never imports the compile
side (``aot.importer``, ``aot.passes``, ``aot.toolchain``, ``aot.forms``, ``aot.partition``,
``aot.backend``, ``aot.tuning``, ``iree.compiler``)."""

import ast
import pathlib

import aot

ROOT = pathlib.Path(aot.__file__).parent


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: pathlib.Path, modules: dict) -> set[str]:
    """The aot modules ``name`` imports, anywhere in its file; and the others, by name."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                base = ".".join(up[:len(up) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base)
    return {m for m in out if m != name}


def _graph():
    modules = _modules()
    return modules, {m: _imports(m, p, modules) for m, p in modules.items()}


def test_no_import_circle():
    modules, graph = _graph()
    edges = {m: {t for t in ts if t in modules} for m, ts in graph.items()}
    state, stack, circles = {}, [], []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(edges[m]):
            if state.get(t) == "open":
                circles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in sorted(modules):
        if m not in state:
            visit(m)
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_the_runtime_does_not_import_the_compile_side():
    modules, graph = _graph()
    below = [m for m in modules if m.startswith(("aot.runtime", "aot.fallback"))]
    for m in below:
        bad = {t for t in graph[m] if t.startswith((
            "aot.importer", "aot.passes", "aot.toolchain", "aot.forms", "aot.partition",
            "aot.backend", "aot.tuning",
            "aot.stages", "aot.bench", "aot.models", "iree.compiler"))}
        assert not bad, f"{m} imports {sorted(bad)}"


# the pipeline's packages in order: each imports only packages before it (and the
# foundation: top-level modules, the runtime and fallback below everything)
PIPELINE = ["aot.importer", "aot.passes", "aot.toolchain", "aot.forms", "aot.partition",
            "aot.backend", "aot.tuning"]


def test_the_stages_import_only_earlier_stages():
    """Data moves forward: importer -> passes -> (toolchain, forms) -> partition ->
    backend -> tuning; no package imports a later one, inside functions included."""
    modules, graph = _graph()
    rank = {p: i for i, p in enumerate(PIPELINE)}

    def stage(m):
        return next((p for p in PIPELINE if m == p or m.startswith(p + ".")), None)
    bad = []
    for m in modules:
        here = stage(m)
        if here is None:
            continue
        for t in graph[m]:
            there = stage(t)
            if there is not None and rank[there] > rank[here]:
                bad.append(f"{m} -> {t}")
    assert not bad, "imports of a later stage: " + "; ".join(sorted(bad))
