"""The runtime's subpackages by responsibility import only those below them (``hpp/runtime/__init__.py``).

Order, lowest first: :mod:`hpp.runtime.config` (the run configuration, read by all), ``models``, ``host``,
``checkpoint``, ``exec``, ``launch``, ``profile``, ``network``, and the top level (``hpp run`` and its report),
which may import them all. A lazy import inside a function counts like one at the top.
"""

from __future__ import annotations

import pytest

from tests.test_layout import import_graph

ORDER = ("config", "models", "host", "checkpoint", "exec", "launch", "profile", "network", "(top)")


def layer(module: str) -> str:
    """The layer of a runtime module: its subpackage, ``config``, or ``(top)``."""
    parts = module.split(".")
    if module == "hpp.runtime.config":
        return "config"
    if len(parts) >= 3 and parts[2] in ORDER:
        return parts[2]
    return "(top)"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a runtime layer to one above it, one line each."""
    out = []
    for m in sorted(graph):
        if not m.startswith("hpp.runtime."):
            continue
        for t in sorted(graph[m]):
            if t.startswith("hpp.runtime.") and ORDER.index(layer(t)) > ORDER.index(layer(m)):
                out.append(f"{m} ({layer(m)}) imports {t} ({layer(t)})")
    return out


def test_every_runtime_layer_imports_only_those_below_it():
    graph = import_graph()
    layers = {layer(m) for m in graph if m.startswith("hpp.runtime.")}
    assert layers == set(ORDER), layers                        # every layer has modules: the walk sees them all
    assert upward_imports(graph) == []


@pytest.mark.parametrize("edge", [("hpp.runtime.exec.worker", "hpp.runtime.launch.binding"),
                                  ("hpp.runtime.host.time_model", "hpp.runtime.timeline"),
                                  ("hpp.runtime.config", "hpp.runtime.exec.training")])
def test_an_upward_import_is_reported(edge):
    """The control: the edges this layout removed, added back to the real graph, are each reported."""
    graph = {k: set(v) for k, v in import_graph().items()}
    graph[edge[0]].add(edge[1])
    assert any(line.startswith(f"{edge[0]} (") and edge[1] in line for line in upward_imports(graph))
