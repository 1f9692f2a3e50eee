"""The package's layering, read from the source's import statements (AST, not runtime: a lazy import counts).

Library code never depends on the test scaffolding in ``nemo_tau2/testing`` (it reaches the fake backend only through
the ``nemo_tau2.generation_backends`` entry point), and the trainer in ``nemo_tau2/models`` never imports the
algorithms that drive it (the loss function is passed in).

No import circles, anywhere in ``nemo_tau2``. Every import statement counts, wherever it stands: at module level,
inside a function (a lazy import) or under ``if TYPE_CHECKING``. A lazy import hides a circle from the interpreter's
start-up, not from the design: ``a`` still needs ``b`` and ``b`` still needs ``a``, and the order they load in decides
whether a name exists yet. An import of ``p.q.m`` also depends on the packages ``p`` and ``p.q`` (their ``__init__``
runs first), except the importer's own enclosing packages, which are necessarily already loading; and
``from p import name`` depends on ``p`` itself (it reads the package's namespace), so a submodule that imports from
its own package's ``__init__`` while that ``__init__`` imports it is a circle.
"""

import ast
from collections import deque
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "nemo_tau2"


def imported_modules(path: Path, root: Path = PACKAGE.parent) -> set[str]:
    """Absolute module names imported anywhere in ``path`` (relative imports resolved against its package)."""
    package = path.relative_to(root).with_suffix("").parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}
    return found


def violations(under: str, forbidden: str, exempt: str | None = None) -> list[str]:
    bad = []
    where = PACKAGE.parent / under
    for path in [where] if where.is_file() else sorted(where.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).as_posix()
        if exempt and relative.startswith(exempt):
            continue
        hits = sorted(m for m in imported_modules(path) if m == forbidden or m.startswith(forbidden + "."))
        if hits:
            bad.append(f"{relative} imports {hits[0]}")
    return bad


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path) -> dict[str, dict[str, str]]:
    """module -> {module of the same package it depends on: ``file:line`` of the first import that makes it so}."""
    root = package.parent
    files = {module_name(path, root): path for path in sorted(package.rglob("*.py"))}
    graph: dict[str, dict[str, str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        enclosing = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1 + is_package)}
        edges: dict[str, str] = {}
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                scope = name.split(".") if is_package else name.split(".")[:-1]
                base = ".".join(scope[: len(scope) - node.level + 1]) if node.level else ""
                source = ".".join(part for part in (base, node.module or "") if part)
                named = [source] + [f"{source}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in named:
                while target and target not in files:  # `from m import a_name`: the module m
                    target = target.rpartition(".")[0]
                if not target or target == name:
                    continue
                parts = target.split(".")
                packages = {".".join(parts[:i]) for i in range(1, len(parts))} - enclosing
                for needed in {target} | {p for p in packages if p in files}:
                    edges.setdefault(needed, f"{path.relative_to(root).as_posix()}:{node.lineno}")
        graph[name] = edges
    return graph


def import_cycles(package: Path) -> list[str]:
    """One line per circle: for each set of modules tied in circles (strongly connected), the shortest loop through
    each of its modules (duplicates dropped), each step named with the import that makes it."""
    graph = import_graph(package)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def connect(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                connect(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                components.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            connect(module)
    loops: dict[frozenset[tuple[str, str]], str] = {}
    for component in components:
        members = set(component)
        for start in component:  # a shortest loop through each member: together they show every circle's seams
            loop = _shortest_loop(graph, start, members)
            steps = list(zip(loop, loop[1:], strict=False))
            described = " -> ".join(f"{a} ({graph[a][b]})" for a, b in steps) + f" -> {start}"
            loops.setdefault(frozenset(steps), f"[{len(component)} modules] {described}")
    return list(loops.values())


def _shortest_loop(graph: dict[str, dict[str, str]], start: str, members: set[str]) -> list[str]:
    came_from: dict[str, str] = {}
    queue = deque([start])
    while start not in came_from:
        module = queue.popleft()
        for target in sorted(set(graph[module]) & members):
            if target not in came_from:
                came_from[target] = module
                queue.append(target)
    loop = [start]
    while len(loop) == 1 or loop[-1] != start:
        loop.append(came_from[loop[-1]])
    return loop[::-1]


def test_import_cycles_sees_lazy_imports_and_package_inits(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("import os\n")
    (package / "a.py").write_text("from pkg.low import x\nfrom pkg.b import y\n")
    (package / "b.py").write_text("def f():\n    from pkg import a\n")  # lazy, and `from pkg import a` is pkg.a
    (package / "sub" / "__init__.py").write_text("from pkg.sub.inner import z\n")
    (package / "sub" / "inner.py").write_text("from pkg.sub import other\n")  # reads its package's __init__
    (package / "sub" / "other.py").write_text("from .. import low\nfrom pkg.sub.inner import z\n")
    cycles = import_cycles(package)
    assert cycles[0] == "[2 modules] pkg.a (pkg/a.py:2) -> pkg.b (pkg/b.py:2) -> pkg.a"
    assert cycles[1] == "[3 modules] pkg.sub (pkg/sub/__init__.py:1) -> pkg.sub.inner (pkg/sub/inner.py:1) -> pkg.sub"
    assert cycles[2:] == [
        "[3 modules] pkg.sub.other (pkg/sub/other.py:2) -> pkg.sub.inner (pkg/sub/inner.py:1) -> pkg.sub.other"
    ]
    (package / "sub" / "inner.py").write_text("from pkg.sub.other import q\n")  # a sibling, not the package
    (package / "sub" / "other.py").write_text("from pkg import low\n")
    assert len(import_cycles(package)) == 1


def test_no_import_cycles_in_the_package():
    cycles = import_cycles(PACKAGE)
    assert not cycles, "import circles in nemo_tau2 (break each at a seam that means something):\n" + "\n".join(cycles)


def test_imported_modules_sees_lazy_relative_and_from_imports(tmp_path):
    module = tmp_path / "nemo_tau2" / "gym" / "agent" / "probe.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "def f():\n    from nemo_tau2.testing import start_fake_server\n"
        "from ..resources_server import app\nimport nemo_tau2.algorithms.loss\n"
    )
    found = imported_modules(module, root=tmp_path)
    assert {"nemo_tau2.testing", "nemo_tau2.gym.resources_server", "nemo_tau2.algorithms.loss"} <= found


@pytest.mark.parametrize(
    ("under", "forbidden", "exempt"),
    [
        ("nemo_tau2", "nemo_tau2.testing", "nemo_tau2/testing/"),
        ("nemo_tau2/models", "nemo_tau2.algorithms", None),
        # the config loader and the process helpers sit below everything: no circle through them
        ("nemo_tau2/config.py", "nemo_tau2.generation", None),
        ("nemo_tau2/processes.py", "nemo_tau2.config", None),
        # token contiguity is checked by the agent and read by the experience code: it lives below both
        ("nemo_tau2/gym", "nemo_tau2.experience", None),
        # the report reads results folders: it never reaches into training or the trainer
        ("nemo_tau2/report", "nemo_tau2.algorithms", None),
        ("nemo_tau2/report", "nemo_tau2.models", None),
        # the vLLM process imports this folder alone, in vLLM's environment
        ("nemo_tau2/generation/vllm_extension", "nemo_tau2", None),
    ],
)
def test_library_layering(under, forbidden, exempt):
    assert violations(under, forbidden, exempt) == []
