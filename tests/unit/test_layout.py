"""The package's layering, read from the source (ast, no imports run).

* only service/keylane/kafka/ imports faust, mode or aiokafka (type-only imports too);
* no import cycle among keylane's modules, nor among its subpackages;
* the authoring API imports nothing from the decision core, the stages or the Kafka layer;
* the decision core imports nothing from the stages or the Kafka layer. (It does import the
  authoring API: the core runs agents through it, KeyRuntime builds their ActivationContext.)

Imports under ``if TYPE_CHECKING:`` count for what a module may import, and not for cycles.
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "service" / "keylane"
KAFKA_CLIENTS = ("faust", "mode", "aiokafka")


@dataclass(frozen=True)
class Import:
    module: str  # the importing keylane module
    target: str  # the module imported (a keylane submodule when ``from pkg import mod`` names one)
    line: int
    type_only: bool  # under ``if TYPE_CHECKING:``

    def __str__(self) -> str:
        where = f"{self.module}:{self.line}"
        return f"{where} imports {self.target}" + (" (TYPE_CHECKING)" if self.type_only else "")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve_from(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    is_package = MODULES[module].name == "__init__.py"
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _imports_of(module: str) -> list[Import]:
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    found: list[Import] = []

    def visit(node: ast.AST, type_only: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_only)
            return
        if isinstance(node, ast.Import):
            found.extend(Import(module, alias.name, node.lineno, type_only) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve_from(module, node)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                target = submodule if submodule in MODULES else source
                found.append(Import(module, target, node.lineno, type_only))
        for child in ast.iter_child_nodes(node):
            visit(child, type_only)

    visit(tree, False)
    return found


IMPORTS = {module: _imports_of(module) for module in MODULES}


def _keylane_target(imported: Import) -> str | None:
    """The keylane module an import names (its package when it names none directly)."""
    target = imported.target
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def _is_under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _subpackage(module: str) -> str:
    """keylane.X for a module of subpackage X (or top-level module X), keylane for the root."""
    return ".".join(module.split(".")[:2])


def _find_cycle(graph: dict[str, dict[str, Import]]) -> list[str] | None:
    """One cycle of ``graph`` as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                cycle = walk(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = walk(node)
            if cycle:
                return cycle
    return None


def _describe(cycle: list[str], graph: dict[str, dict[str, Import]]) -> str:
    return "; ".join(str(graph[a][b]) for a, b in itertools.pairwise(cycle))


def test_the_layout_sees_the_package() -> None:
    assert "keylane.kafka.app" in MODULES and "keylane.stages.agent" in MODULES
    assert any(i.target == "faust" for i in IMPORTS["keylane.kafka.app"])


def test_only_the_kafka_layer_imports_faust_mode_or_aiokafka() -> None:
    offending = [
        str(imported)
        for module, imports in IMPORTS.items()
        if not _is_under(module, "keylane.kafka")
        for imported in imports
        if imported.target.split(".")[0] in KAFKA_CLIENTS
    ]
    assert not offending, "only keylane.kafka may import faust/mode/aiokafka: " + "; ".join(offending)


def test_no_module_imports_itself_through_a_cycle() -> None:
    graph: dict[str, dict[str, Import]] = {}
    for module, imports in IMPORTS.items():
        for imported in imports:
            target = _keylane_target(imported)
            if target is not None and target != module and not imported.type_only:
                graph.setdefault(module, {}).setdefault(target, imported)
    cycle = _find_cycle(graph)
    assert cycle is None, f"import cycle {' -> '.join(cycle)}: {_describe(cycle, graph)}"


def test_no_import_cycle_among_subpackages() -> None:
    graph: dict[str, dict[str, Import]] = {}
    for module, imports in IMPORTS.items():
        if module == "keylane":
            continue  # the root re-exports the public API; nothing imports it back
        for imported in imports:
            target = _keylane_target(imported)
            if target is None or imported.type_only:
                continue
            source, dest = _subpackage(module), _subpackage(target)
            if source != dest and dest != "keylane":
                graph.setdefault(source, {}).setdefault(dest, imported)
    cycle = _find_cycle(graph)
    assert cycle is None, f"subpackage import cycle {' -> '.join(cycle)}: {_describe(cycle, graph)}"


def _imports_from(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        str(imported)
        for module, imports in IMPORTS.items()
        if _is_under(module, package)
        for imported in imports
        if any(_is_under(imported.target, other) for other in forbidden)
    ]


def test_the_authoring_api_imports_nothing_from_the_core_the_stages_or_the_kafka_layer() -> None:
    offending = _imports_from("keylane.authoring", ("keylane.core", "keylane.stages", "keylane.kafka"))
    assert not offending, "keylane.authoring must not import core, stages or kafka: " + "; ".join(offending)


def test_the_core_imports_nothing_from_the_stages_or_the_kafka_layer() -> None:
    offending = _imports_from("keylane.core", ("keylane.stages", "keylane.kafka"))
    assert not offending, "keylane.core must not import the stages or kafka: " + "; ".join(offending)
