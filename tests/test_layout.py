"""The package layout's import rules (issue: core vs research harness), checked on the source.

Rules (README "Layout"):

1. The core -- ``hpp.profiles``, ``hpp.formulation``, ``hpp.pruning``, ``hpp.runtime`` and the top-level
   ``planner``, ``plan``, ``validate``, ``resolve``, ``replan``, ``scenarios``, ``interop``, ``errors``,
   ``fileio``, ``forkshare``, ``gcfreeze`` -- imports nothing from the harness (``hpp.bench``,
   ``hpp.baselines``), directly or through another module.
2. The runtime imports no planner code: of the planner's model it may use only the cost model
   (:mod:`hpp.formulation.cost_model` and what that imports), never the search (planner, composition,
   candidates, stage balance, binding, pruning).
3. ``hpp.pruning`` imports nothing from ``hpp.formulation`` (the formulation uses the rules), so the two
   never import each other both ways.

Imports inside functions count like imports at the top: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "hpp"

CORE_PREFIXES = ("hpp.profiles", "hpp.formulation", "hpp.pruning", "hpp.runtime", "hpp.interop")
CORE_MODULES = {"hpp.planner", "hpp.plan_data", "hpp.validate", "hpp.resolve", "hpp.replan", "hpp.scenarios",
                "hpp.interop", "hpp.errors", "hpp.fileio", "hpp.forkshare", "hpp.gcfreeze"}
HARNESS_PREFIXES = ("hpp.bench", "hpp.baselines")
SEARCH_PREFIXES = ("hpp.planner", "hpp.replan", "hpp.formulation.composition", "hpp.formulation.candidates",
                   "hpp.formulation.stage_balance", "hpp.formulation.stage_costs", "hpp.formulation.binding",
                   "hpp.formulation.space_limits", "hpp.formulation.data_balance", "hpp.pruning")


def _in(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@lru_cache(maxsize=None)
def _graph(root: Path) -> tuple[tuple[str, frozenset[str]], ...]:
    return tuple((k, frozenset(v)) for k, v in _build_graph(root).items())


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the hpp modules it imports (anywhere in the file), for every module under ``root``."""
    return {k: set(v) for k, v in _graph(root)}


def _build_graph(root: Path) -> dict[str, set[str]]:
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in files.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".")
                    base = base[:len(base) - node.level + (1 if is_pkg else 0)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
            for t in targets:
                if t in files and t != name:
                    graph[name].add(t)
        graph.setdefault(name, set())
    return dict(graph)


def reachable(graph: dict[str, set[str]], start: str) -> dict[str, str]:
    """Every module reachable from ``start`` -> the module that imports it on one path (for messages)."""
    seen: dict[str, str] = {}
    stack = [start]
    while stack:
        m = stack.pop()
        for t in graph.get(m, ()):
            if t not in seen and t != start:
                seen[t] = m
                stack.append(t)
    return seen


def violations(graph: dict[str, set[str]]) -> list[str]:
    """The rule breaks of ``graph`` (module docstring), one line each, naming an import path."""
    out = []
    for m in sorted(graph):
        core = _in(m, CORE_PREFIXES) or m in CORE_MODULES
        reach = reachable(graph, m)
        for t, via in sorted(reach.items()):
            if core and _in(t, HARNESS_PREFIXES):
                out.append(f"core module {m} reaches harness module {t} (imported by {via})")
            if _in(m, ("hpp.runtime",)) and _in(t, SEARCH_PREFIXES):
                out.append(f"runtime module {m} reaches planner module {t} (imported by {via})")
        if _in(m, ("hpp.pruning",)):
            out += [f"pruning module {m} imports {t}" for t in sorted(graph[m]) if _in(t, ("hpp.formulation",))]
    return out


def test_the_package_keeps_its_import_rules():
    graph = import_graph()
    assert "hpp.planner" in graph and "hpp.bench.search_overhead" in graph    # the walk sees both sides
    assert violations(graph) == []


@pytest.mark.parametrize("edge, expect", [
    (("hpp.formulation.cost_model", "hpp.bench.instances"), "core module hpp.formulation.cost_model reaches harness"),
    (("hpp.plan_data", "hpp.baselines.uniform"), "core module hpp.plan_data reaches harness"),
    (("hpp.runtime.exec.worker", "hpp.planner"), "runtime module hpp.runtime.exec.worker reaches planner module hpp.planner"),
    (("hpp.pruning.rules", "hpp.formulation.cost_model"), "pruning module hpp.pruning.rules imports"),
])
def test_a_forbidden_import_is_reported(edge, expect):
    """The control: the checker reports each kind of break (added to the real graph)."""
    graph = {k: set(v) for k, v in import_graph().items()}
    graph[edge[0]].add(edge[1])
    assert any(v.startswith(expect) for v in violations(graph)), violations(graph)


def test_a_break_through_another_module_is_reported():
    """A core module reaching the harness through a module in between is a break too."""
    graph = {"hpp.plan_data": {"hpp.x"}, "hpp.x": {"hpp.bench.cli"}, "hpp.bench.cli": set()}
    assert violations(graph) == ["core module hpp.plan_data reaches harness module hpp.bench.cli (imported by hpp.x)"]
