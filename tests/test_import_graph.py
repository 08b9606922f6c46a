"""capkv's import graph, read from the source: no cycle, and no edge up the layers.

Every ``import`` counts — at module level, in a function (a lazy import is still
a dependency) and under ``TYPE_CHECKING`` — except the implicit import of a
module's parent packages. The layers, bottom to top (README, "Layout"); a module
may import from its own layer and the ones below:
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import capkv

PACKAGE = Path(capkv.__file__).resolve().parent

LAYERS: list[tuple[str, set[str]]] = [
    ("foundation", {"capkv._version", "capkv._homes", "capkv._lazy", "capkv._torch", "capkv.errors"}),
    ("contracts", {"capkv.contracts"}),
    ("capabilities", {"capkv.capabilities"}),
    ("composite, devmode, config", {"capkv.composite", "capkv.devmode", "capkv.config"}),
    ("transfer, engine", {"capkv.transfer", "capkv.engine"}),
    ("connectors, stores", {"capkv.connectors", "capkv.stores"}),
    (
        "adapters, cli, testing, the mypy plugin",
        {"capkv.adapters", "capkv.vllm", "capkv.cli", "capkv.testing", "capkv.mypy", "capkv._mypy_plugin",
         "capkv._mypy_rule", "capkv._mypy_conformance"},
    ),
    ("the root front", {"capkv", "capkv.__main__"}),
]
"""Areas by layer: an area is a package (with everything below it) or a root-level module."""

__doc__ = (__doc__ or "") + "\n".join(f"{i}. {name}: {', '.join(sorted(areas))}" for i, (name, areas) in enumerate(LAYERS))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports(module: str) -> set[str]:
    """The capkv modules ``module`` imports, each resolved to the deepest module named."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target.startswith("capkv") and target != module:
                found.add(target)
    return found


GRAPH = {module: imports(module) for module in MODULES}


def area(module: str) -> str:
    candidates = [  # the root package covers only itself: a module at capkv's root names its layer explicitly
        a for _, areas in LAYERS for a in areas if module == a or (a != "capkv" and module.startswith(f"{a}."))
    ]
    if not candidates:
        raise AssertionError(f"{module} is in no layer: add its package or module to LAYERS")
    return max(candidates, key=len)


def layer(module: str) -> int:
    return next(i for i, (_, areas) in enumerate(LAYERS) if area(module) in areas)


def test_every_module_is_in_a_layer() -> None:
    for module in MODULES:
        area(module)


def test_no_import_goes_up_the_layers() -> None:
    upward = sorted(
        f"{module} ({LAYERS[layer(module)][0]}) imports {target} ({LAYERS[layer(target)][0]})"
        for module, targets in GRAPH.items()
        for target in targets
        if layer(target) > layer(module)
    )
    assert upward == []


def test_no_import_cycle() -> None:
    """Tarjan's strongly connected components of the module graph: every one a single module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in GRAPH[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component: list[str] = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in MODULES:
        if module not in index:
            visit(module)
    assert cycles == []


@pytest.mark.parametrize(
    ("edges", "problem"),
    [
        ({"capkv.composite._building": {"capkv.composite._multi"}, "capkv.composite._multi": {"capkv.composite._building"}},
         "cycle"),
        ({"capkv._lazy": {"capkv.devmode._mode"}}, "upward"),
    ],
    ids=["round 2's composite cycle", "round 2's _lazy -> devmode edge"],
)
def test_the_checks_catch_round_2s_defects(edges: dict[str, set[str]], problem: str) -> None:
    """The two defects of round 2's graph, put back, fail the checks above."""
    saved = {module: set(GRAPH[module]) for module in edges}
    try:
        for module, targets in edges.items():
            GRAPH[module] |= targets
        with pytest.raises(AssertionError):
            (test_no_import_cycle if problem == "cycle" else test_no_import_goes_up_the_layers)()
    finally:
        GRAPH.update(saved)
