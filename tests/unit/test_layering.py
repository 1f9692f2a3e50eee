"""The package's layering, read from the source's import statements (AST, not runtime: a lazy import counts).

Library code never depends on the test scaffolding in ``nemo_tau2/testing`` (it reaches the fake backend only through
the ``nemo_tau2.generation_backends`` entry point), and the trainer in ``nemo_tau2/models`` never imports the
algorithms that drive it (the loss function is passed in).
"""

import ast
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
