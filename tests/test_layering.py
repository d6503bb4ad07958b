"""The import floors of DESIGN.md, checked on the source with `ast` (nothing of bertkit is imported here).

Floors, bottom up: config, io, errors -> tokenizers/, checkpoint -> models/, data/ -> training.trainer,
training.objectives, tasks/ (the task definitions) -> tasks.run, tasks.card, features -> training.pretrain,
training.distill, tasks.finetune, inference, mine, serve/, export -> pipeline/ (the main job, its report, plots and
analysis) -> cli. A subpackage's modules may stand on different floors (training/, tasks/): FLOORS names them.
An import only points down or sideways (same floor). Module-level imports are what runs when a module is
imported; function-level ones run later, but they still say which module leans on which, so both rules (floors
and cycles) count imports at every level. (`bertkit.models`' facade names its submodules' classes and imports them
on first use, through importlib: it leans on none of them, so a submodule may read the facade's tables.)
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "bertkit"

# Top-level name under bertkit (module or sub-package) -> floor, bottom up. `bertkit` itself is the package
# facade (`from bertkit import BertModel`): it re-exports models/, so it stands on the models floor.
FLOORS: dict[str, int] = {
    "config": 0, "io": 0, "errors": 0, "recipes": 0,
    "tokenizers": 1, "checkpoint": 1, "sentence": 1,
    "models": 2, "data": 2, "": 2,
    "training": 3, "training.trainer": 3, "training.objectives": 3, "tasks": 3,
    "tasks.run": 4, "tasks.card": 4, "features": 4,
    "training.pretrain": 5, "tasks.finetune": 5, "training.distill": 5, "inference": 5, "serve": 5, "export": 5,
    "mine": 5,
    "pipeline": 6,
    "cli": 7,
}
DRIVERS = ("training.trainer", "training.pretrain", "tasks.finetune", "training.distill", "pipeline", "cli")
# Sideways imports that are still forbidden: group -> groups it must not import (any import, any level).
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "tokenizers": ("data", "models", "", *DRIVERS),  # training a vocabulary takes iterables of text
    "models": DRIVERS,
    "data": ("models", "", *DRIVERS),  # "" (the facade) would pull models/ in
    "checkpoint": ("models", ""),  # models/ call into checkpoint; never the other way round
}


@dataclass(frozen=True)
class Import:
    source: str  # importing module, dotted ("bertkit.data.shards")
    target: str  # imported bertkit module, dotted ("bertkit.tokenizers")
    line: int
    module_level: bool  # runs when `source` is imported (not inside a function body)

    def __str__(self) -> str:
        return f"{self.source} ({_path(self.source)}:{self.line}) imports {self.target}" + (
            "" if self.module_level else " inside a function")


def _modules() -> dict[str, Path]:
    """Dotted name -> file for every module of the package (a package's name is its __init__.py)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("bertkit", *path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _path(module: str) -> str:
    return str(MODULES[module].relative_to(PACKAGE.parents[1]))


def _group(module: str) -> str:
    """The longest name of FLOORS under bertkit that holds the module: "bertkit.data.shards" -> "data",
    "bertkit.tasks.run" -> "tasks.run", "bertkit.tasks.glue" -> "tasks"; the facade "bertkit" -> ""."""
    parts = module.split(".")[1:]
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in FLOORS:
            return ".".join(parts[:end])
    return parts[0] if parts else ""


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _resolve(source: str, node: ast.ImportFrom) -> str:
    """The absolute module name of a `from X import ...` (relative imports resolved against `source`)."""
    if not node.level:
        return node.module or ""
    package = source.split(".") if _is_package(source) else source.split(".")[:-1]
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


class _Collector(ast.NodeVisitor):
    """Every import statement of one module, with whether it sits in a function body."""

    def __init__(self) -> None:
        self.depth = 0  # function nesting
        self.type_checking = 0  # `if TYPE_CHECKING:` nesting (never runs)
        self.found: list[tuple[ast.AST, bool]] = []

    def _function(self, node) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_If(self, node: ast.If) -> None:
        guarded = (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING") or (
            isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
        self.type_checking += guarded
        for child in node.body:
            self.visit(child)
        self.type_checking -= guarded
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.append((node, self.depth == 0 and not self.type_checking))

    visit_ImportFrom = visit_Import


def _imports(module: str) -> tuple[list[Import], list[tuple[str, int, bool]]]:
    """(imports of bertkit modules, every imported top-level package name with line and module_level)."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"), filename=str(MODULES[module]))
    collector = _Collector()
    collector.visit(tree)
    ours, anything = [], []
    for node, module_level in collector.found:
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = _resolve(module, node)
            for alias in node.names:  # `from bertkit.data import shards` imports the module bertkit.data.shards
                full = f"{base}.{alias.name}"
                targets.append(full if full in MODULES else base)
        for target in targets:
            anything.append((target.split(".")[0], node.lineno, module_level))
            if target == "bertkit" or target.startswith("bertkit."):
                # The longest prefix that is one of our modules (`import bertkit.data.shards.x` cannot happen,
                # but `from bertkit.models import Name` names the package).
                while target not in MODULES:
                    target = target.rsplit(".", 1)[0]
                if target != module:
                    ours.append(Import(module, target, node.lineno, module_level))
    return ours, anything


GRAPH = {module: _imports(module) for module in MODULES}
EDGES = [edge for ours, _ in GRAPH.values() for edge in ours]


def test_every_module_has_a_floor():
    missing = sorted(m for m in MODULES if _group(m) not in FLOORS)
    assert not missing, f"modules on no floor (add them to FLOORS here and to DESIGN.md): {missing}"


def test_the_parser_sees_imports_at_both_levels():
    # A check on the checker: an import in a function body, or under TYPE_CHECKING, is not module-level.
    collector = _Collector()
    collector.visit(ast.parse("import bertkit.io\nif TYPE_CHECKING:\n    import bertkit.data\n"
                              "def load():\n    from bertkit import checkpoint\n"))
    assert [(node.lineno, module_level) for node, module_level in collector.found] == [(1, True), (3, False),
                                                                                       (5, False)]
    assert any(e.module_level for e in EDGES if e.source == "bertkit.training.trainer" and e.target == "bertkit.config")


def _cycle_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for edge in EDGES:
        graph[edge.source].add(edge.target)
    return graph


def test_the_cycle_rule_counts_function_level_imports(tmp_path, monkeypatch):
    # A check on the checker, on a module of its own (the package's lazy imports come and go): an import inside a
    # function is found as such, and every such edge is in the graph the cycle rule walks.
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def onnx_backend():\n    from bertkit.export import open_session\n", encoding="utf-8")
    monkeypatch.setitem(MODULES, "bertkit.lazy", lazy)
    assert [(e.target, e.module_level) for e in _imports("bertkit.lazy")[0]] == [("bertkit.export", False)]
    graph = _cycle_graph()
    assert all(e.target in graph[e.source] for e in EDGES if not e.module_level)


def test_no_import_cycle():
    graph = _cycle_graph()
    # Depth-first search with colours; a grey node reached again closes a cycle.
    colour = {m: 0 for m in graph}  # 0 new, 1 on the stack, 2 done
    cycles: list[list[str]] = []
    stack: list[str] = []

    def visit(node: str) -> None:
        colour[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if colour[nxt] == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif colour[nxt] == 0:
                visit(nxt)
        stack.pop()
        colour[node] = 2

    for node in sorted(graph):
        if colour[node] == 0:
            visit(node)
    assert not cycles, "import cycles (any level):\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_imports_only_point_down():
    up = [e for e in EDGES if e.source in MODULES and FLOORS.get(_group(e.target), -1) > FLOORS[_group(e.source)]]
    assert not up, "imports of a higher floor:\n" + "\n".join(map(str, up))


def test_forbidden_sideways_imports():
    bad = [e for e in EDGES if _group(e.target) in FORBIDDEN.get(_group(e.source), ())
           and _group(e.target) != _group(e.source)]
    assert not bad, "forbidden imports:\n" + "\n".join(map(str, bad))


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _group(m) == "tasks"))
def test_task_modules_import_no_torch_at_module_level(module):
    """Reading a task file needs no torch: not in the module itself, nor in any bertkit module it pulls in."""
    seen, todo, chain = set(), [module], {module: [module]}
    offenders = []
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        ours, anything = GRAPH[current]
        offenders += [f"{' -> '.join(chain[current])}: {_path(current)}:{line} imports {name}"
                      for name, line, module_level in anything if module_level and name == "torch"]
        for edge in ours:
            if edge.module_level and edge.target not in seen:
                chain.setdefault(edge.target, chain[current] + [edge.target])
                todo.append(edge.target)
    assert not offenders, "\n".join(offenders)
