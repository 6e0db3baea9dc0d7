"""The import graph of simulator/model: no cycles, no import from a lower layer to a higher
one, and only the entry points import the builder (engine.py); and no cycle in the package.

Every import counts, wherever it is written: at the top, inside a function, under
``TYPE_CHECKING`` (an import cycle hidden from the interpreter is still one), or as a module
of a package's ``_EXPORTS`` (its names imported on first use)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

MODEL = Path(__file__).resolve().parent.parent / "simulator" / "model"
PACKAGE = "simulator.model"

#: Lowest first. A module may import modules of its own layer or below, never above.
LAYERS: list[set[str]] = [
    {"rules", "rules.prefix_cache", "rules.queue", "rules.continuous", "rules.service"},  # the serving rules
    # foundations: the event kernel, decision rules, the log, per-prompt columns, the
    # compiled kernel and its service times
    {"kernel", "event_order", "policies", "length", "dispatch", "log", "prompts", "streams", "kernel_cache", "kernel_service", "batch_kernel",
     "kernel_layout", "kernel_sources"},
    {"resources"},                       # devices
    {"batching"},                        # batch forming and service draws
    {"context"},                         # the run context
    {"queues"},                          # micro-batch queues and workers
    {"topologies.base"},
    {"topologies.shared", "topologies.split", "topologies.direct", "topologies.continuous"},
    {"topologies.disaggregated"},        # pools of continuous engines
    {"topologies"},                      # the registry with every topology
    {"router", "clients"},
    {"fast"},                            # entry points: the fast engine ...
    {"engine"},                          # ... the reference engine's builder, simulate()
    {""},                                # the package (its public names)
]
#: Modules not listed (new ones) sit with the fast engine's: above everything the
#: reference engine's parts are made of, below its builder.
DEFAULT_LAYER = next(i for i, layer in enumerate(LAYERS) if "fast" in layer)
#: The only modules that may import the builder.
ENTRY_POINTS = {""}


def _name(path: Path) -> str:
    """``topologies.split`` for simulator/model/topologies/split.py, ``""`` for the package."""
    parts = list(path.relative_to(MODEL).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_name(p): p for p in sorted(MODEL.rglob("*.py"))}


@functools.cache
def _nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of the file at ``path``, parsed and walked once for all the tests here
    (each reads the whole package: the same files again and again)."""
    return tuple(ast.walk(ast.parse(path.read_text())))


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of simulator/model that ``name`` imports (anywhere in its file)."""
    is_package = path.name == "__init__.py"
    here = f"{PACKAGE}.{name}" if name else PACKAGE
    out: set[str] = set()

    def add(full: str) -> None:
        if full == PACKAGE or full.startswith(PACKAGE + "."):
            local = full[len(PACKAGE) + 1:]
            if local in known and local != name:
                out.add(local)

    for node in _nodes(path):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here if is_package else here.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            for alias in node.names:
                # ``from package import module`` imports the module; else the names of ``module``
                sub = f"{module}.{alias.name}"
                add(sub if sub[len(PACKAGE) + 1:] in known else module)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets) \
                and isinstance(node.value, ast.Dict):
            # a package's names imported on first use (PEP 562): its map of modules to names
            for key in node.value.keys:
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    add(key.value)
    return out


def graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def layer_of(name: str) -> int:
    return next((i for i, layer in enumerate(LAYERS) if name in layer), DEFAULT_LAYER)


def test_the_graph_is_read():
    g = graph()
    assert "context" in g["queues"] and "resources" in g["context"] and "engine" in g[""]


def test_simulator_model_has_no_import_cycles():
    g = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(g[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles in simulator/model: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_lower_layer_imports_a_higher_one():
    upward = [f"{a or PACKAGE} -> {b}" for a, deps in sorted(graph().items()) for b in sorted(deps)
              if layer_of(b) > layer_of(a)]
    assert not upward, "imports from a lower layer to a higher one: " + ", ".join(upward)


def test_only_the_entry_points_import_the_builder():
    importers = sorted(a for a, deps in graph().items() if "engine" in deps and a not in ENTRY_POINTS)
    assert not importers, f"modules importing simulator/model/engine.py: {importers}"


def test_every_layer_names_existing_modules():
    modules = set(_modules())
    assert set().union(*LAYERS) <= modules


def test_the_whole_package_has_no_import_cycles(monkeypatch):
    """The same reading over every module of ``simulator`` (a package's ``__init__`` that
    re-exports its modules is a node like any other)."""
    monkeypatch.setitem(globals(), "MODEL", MODEL.parent)
    monkeypatch.setitem(globals(), "PACKAGE", "simulator")
    g = graph()
    assert "profile.kinds.base" in g["profile.kinds.distribution"]
    state: dict[str, int] = {}
    cycles: list[str] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(g[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles in simulator: " + "; ".join(cycles)


def test_every_error_class_is_in_the_one_hierarchy_module():
    """Every typed error is declared in simulator/errors.py (a second class of one name would
    not be caught where the first is expected)."""
    import simulator.errors as errors

    hierarchy = {name for name, value in vars(errors).items()
                 if isinstance(value, type) and issubclass(value, errors.SimctlError)}
    elsewhere = []
    for path in sorted(MODEL.parent.rglob("*.py")):
        if path.name == "errors.py" and path.parent == MODEL.parent:
            continue
        for node in _nodes(path):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                         for b in node.bases}
                if bases & hierarchy:
                    elsewhere.append(f"{path.relative_to(MODEL.parent.parent)}: {node.name}")
    assert not elsewhere, f"error classes outside simulator/errors.py: {elsewhere}"
