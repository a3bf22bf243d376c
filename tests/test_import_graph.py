"""The import graph of `jaxdm` (with `jaxdm.envs` and `jaxdm.kernels`) has no circles and no
upward edges, counting the function-level imports that would hide them (issue 39): a module
never needs, even lazily, a module that needs it, nor a module of a higher layer."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# setup.py's package-dir mapping: envs/ and kernels/ import as jaxdm.envs and jaxdm.kernels.
ROOTS = {"jaxdm": REPO / "jaxdm", "jaxdm.envs": REPO / "envs", "jaxdm.kernels": REPO / "kernels"}


def _modules() -> dict[str, Path]:
    out = {}
    for package, root in ROOTS.items():
        for path in root.rglob("*.py"):
            parts = package.split(".") + list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the jaxdm modules it imports anywhere in its body. ``from pkg import sub``
    is an edge to the submodule only (Python imports a package before its submodules, so a
    submodule reaching its own package that way is no circle); a name defined in a package's
    ``__init__`` is an edge to the package."""
    mods = _modules()

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            else:
                continue
            for t in targets:
                hit = owner(t) if t.startswith("jaxdm") else None
                if hit and hit != mod:
                    graph[mod].add(hit)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_jaxdm_has_no_import_circles():
    graph = import_graph()
    assert len(graph) > 100 and "jaxdm.models.decoder" in graph["jaxdm.models.loading"]
    found = circles(graph)
    detail = "; ".join(" <-> ".join(c) + " (edges: " + ", ".join(
        f"{m} -> {sorted(graph[m] & set(c))}" for m in c) + ")" for c in found)
    assert not found, f"import circles: {detail}"


# The layers, lowest first (README, "Architecture"): a module may import its own layer and the
# ones below it. Named by the first part under jaxdm ("jaxdm" itself: the package's __init__).
LAYERS = (
    ("jaxdm", "secrets", "jsonl", "config", "registry", "rundir", "runlog", "stats",
     "trajectory"),
    ("models", "kernels"),
    ("decision", "judges", "client"),
    ("roles", "envs"),
    ("rl",),
    ("harness",),
    ("screen",),
    ("bench",),
    ("train",),
    ("decide",),
    ("cli",),
)


def layer_of(module: str) -> int:
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else "jaxdm"
    for i, names in enumerate(LAYERS):
        if name in names:
            return i
    raise AssertionError(f"{module}: its package {name!r} is in no layer of LAYERS")


def test_no_module_imports_a_higher_layer():
    graph = import_graph()
    up = sorted(f"{m} -> {t}" for m, ts in graph.items() for t in ts
                if layer_of(t) > layer_of(m))
    assert not up, "imports from a lower layer into a higher one: " + "; ".join(up)
    assert layer_of("jaxdm.models.lora") < layer_of("jaxdm.decision.specs") < layer_of(
        "jaxdm.roles.jobs") < layer_of("jaxdm.screen.run")
