"""The import layers, checked on the source (ast), TYPE_CHECKING imports included.

- ``runtime`` imports neither ``agent`` nor ``fleet_server``: it is a library of its own.
- The shared kernel (``agent.kernel``) and the wire contract (``agent.wire``) import nothing
  else of ``agent`` and nothing of ``fleet_server``.
- ``fleet_server`` imports from ``agent`` only the kernel and the wire contract.
- No product module (runtime, agent, fleet_server, firmware_profiles) imports ``hil``,
  ``tests`` or ``scripts``: tools and tests depend on the product, never the reverse.
- No import cycle between modules anywhere in the product or ``hil``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("runtime", "agent", "fleet_server", "firmware_profiles")
TOOLS = ("hil",)
SHARED = ("agent.kernel", "agent.wire")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    found = {}
    for top in PRODUCT + TOOLS:
        for path in sorted((ROOT / top).rglob("*.py")):
            found[_module_name(path)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in the file, resolved to a module of ours
    where the name is one (``from pkg import sub`` -> ``pkg.sub`` when that is a module)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                yield (sub if sub in MODULES else module), node.lineno


def _top(module: str) -> str:
    return module.split(".", maxsplit=1)[0]


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


EDGES = {
    name: [(target, line) for target, line in _imports(name, path)]
    for name, path in MODULES.items()
}


def _violations(source: tuple[str, ...], allowed: object) -> list[str]:
    out = []
    for name, targets in EDGES.items():
        if not _within(name, source):
            continue
        for target, line in targets:
            if not allowed(target):  # type: ignore[operator]
                out.append(f"{MODULES[name].relative_to(ROOT)}:{line} imports {target}")
    return out


def test_the_checker_sees_the_product() -> None:
    assert "runtime.pool" in MODULES
    assert "fleet_server.serve" in MODULES
    assert any(t == "agent.kernel.errors" for t, _ in EDGES["fleet_server.errors"])


def test_runtime_imports_neither_agent_nor_fleet_server() -> None:
    bad = _violations(
        ("runtime",), lambda t: _top(t) not in ("agent", "fleet_server", "hil", "tests")
    )
    assert bad == []


def test_kernel_and_wire_import_nothing_else_of_agent_or_fleet() -> None:
    bad = _violations(
        SHARED,
        lambda t: (
            _top(t) not in ("agent", "fleet_server", "hil", "tests", "scripts")
            or _within(t, SHARED)
        ),
    )
    assert bad == []


def test_fleet_server_imports_only_the_kernel_and_wire_contract_from_agent() -> None:
    bad = _violations(("fleet_server",), lambda t: _top(t) != "agent" or _within(t, SHARED))
    assert bad == []


def test_no_product_module_imports_tools_tests_or_scripts() -> None:
    bad = _violations(PRODUCT, lambda t: _top(t) not in ("hil", "tests", "scripts"))
    assert bad == []


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph = {
        name: sorted({t for t, _ in targets if t in MODULES and t != name})
        for name, targets in EDGES.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            recurse = False
            for j in range(i, len(graph[node])):
                nxt = graph[node][j]
                if nxt not in index:
                    work.append((node, j + 1))
                    work.append((nxt, 0))
                    recurse = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if recurse:
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    saved = dict(EDGES)
    try:
        EDGES["runtime.pool"] = [*EDGES["runtime.pool"], ("runtime.cli", 1)]
        EDGES["runtime.cli"] = [*EDGES["runtime.cli"], ("runtime.pool", 1)]
        assert any({"runtime.pool", "runtime.cli"} <= set(c) for c in _cycles())
    finally:
        EDGES.clear()
        EDGES.update(saved)


@pytest.mark.parametrize("top", PRODUCT + TOOLS)
def test_no_import_cycle(top: str) -> None:
    cycles = [c for c in _cycles() if any(_top(m) == top for m in c)]
    assert cycles == []
