"""Every long network wait in nemo_tau2/ comes from a config key (ARCHITECTURE decision 10: "every long wait has a
bound that comes from config"). The source is read, not run: each wait (urllib's ``urlopen(timeout=)``, aiohttp's
``ClientTimeout``, httpx's ``timeout=``, ``asyncio.wait_for``, ``asyncio.timeout``, Ray's ``get``/``wait``
``timeout=``), and the default of each timeout parameter of a function that makes such a wait, is checked: a literal
number of seconds above 60 there, or a module constant holding one, fails the test with its file and line. Short
literal waits (health probes, a log tail, a stop's grace) are fine: they bound a step, not a user's work."""

import ast
import importlib
from pathlib import Path

import pytest
from pydantic import ValidationError

ROOT = Path(__file__).resolve().parents[2]
LONG_S = 60


def _number(node: ast.AST, constants: dict[str, float]) -> float | None:
    """The seconds a wait argument holds when it is a literal (or a module constant, or a literal product/sum)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult | ast.Add):
        left, right = _number(node.left, constants), _number(node.right, constants)
        if left is not None and right is not None:
            return left * right if isinstance(node.op, ast.Mult) else left + right
    return None


def _call_name(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _wait_arguments(node: ast.Call) -> list[ast.AST]:
    """The arguments of ``node`` that are a wait in seconds, by the API it calls."""
    name = _call_name(node)
    keywords = {keyword.arg: keyword.value for keyword in node.keywords if keyword.arg}
    if name == "ClientTimeout":  # aiohttp
        return [value for key, value in keywords.items() if key in ("total", "connect", "sock_read", "sock_connect")]
    if name == "wait_for":  # asyncio.wait_for(aw, timeout)
        return [keywords["timeout"]] if "timeout" in keywords else node.args[1:2]
    if name == "timeout" and isinstance(node.func, ast.Attribute):  # asyncio.timeout(delay)
        return node.args[:1]
    if name in ("urlopen", "get", "wait", "request", "post", "put", "stream", "Client", "AsyncClient", "Timeout"):
        return [keywords["timeout"]] if "timeout" in keywords else []
    return []


def _waits_itself(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(isinstance(node, ast.Call) and _wait_arguments(node) for node in ast.walk(function))


def long_literal_waits(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    constants = {}
    for statement in tree.body:  # module constants: NAME = number
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target = statement.targets[0]
            value = _number(statement.value, {})
            if isinstance(target, ast.Name) and value is not None:
                constants[target.id] = value
    found = []
    for node in ast.walk(tree):
        waits: list[ast.AST] = []
        if isinstance(node, ast.Call):
            waits = _wait_arguments(node)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _waits_itself(node):
            # a timeout parameter's default, in a function that makes the wait itself
            arguments = node.args.args + node.args.kwonlyargs
            defaults = [None] * (len(node.args.args) - len(node.args.defaults)) + node.args.defaults
            defaults += node.args.kw_defaults
            waits = [
                default
                for argument, default in zip(arguments, defaults, strict=True)
                if default is not None and "timeout" in argument.arg
            ]
        for wait in waits:
            seconds = _number(wait, constants)
            if seconds is not None and seconds > LONG_S:
                found.append(f"{path.relative_to(ROOT)}:{wait.lineno}: {ast.unparse(wait)} = {seconds:g} s")
    return found


def test_no_long_network_wait_is_a_literal():
    found = [line for path in sorted((ROOT / "nemo_tau2").rglob("*.py")) for line in long_literal_waits(path)]
    assert found == [], "long waits not from a config key:\n" + "\n".join(found)


def test_the_check_finds_each_kind_of_long_literal_wait(tmp_path):
    """The rule catches what it claims to (a check that finds nothing must still be able to find something)."""
    source = tmp_path / "waits.py"
    source.write_text(
        "import aiohttp, asyncio, ray, urllib.request\n"
        "LONG = 90\n"
        "def a(url): return urllib.request.urlopen(url, timeout=600)\n"
        "def b(): return aiohttp.ClientTimeout(total=3600)\n"
        "async def c(x): return await asyncio.wait_for(x, 120)\n"
        "def d(r): return ray.get(r, timeout=LONG)\n"
        "def e(url, timeout_s: float = 600.0): return urllib.request.urlopen(url, timeout=timeout_s)\n"
        "def ok(url, cfg): return urllib.request.urlopen(url, timeout=cfg.timeout_s), ray.get(url, timeout=5)\n"
    )
    found = long_literal_waits(source.rename(ROOT / "tests" / "unit" / ".waits_probe.py"))
    (ROOT / "tests" / "unit" / ".waits_probe.py").unlink()
    assert sorted(line.split(": ", 1)[1] for line in found) == [
        "120 = 120 s",
        "3600 = 3600 s",
        "600 = 600 s",
        "600.0 = 600 s",
        "LONG = 90 s",
    ], found


@pytest.mark.parametrize(
    ("schema", "key", "fields"),
    [
        ("nemo_tau2.generation.config:GenerationConfig", "update_weights_timeout_s", {"backend": "fake"}),
        ("nemo_tau2.evals.config:EvalSettings", "request_timeout_s", {"save_path": "results/x"}),
        ("nemo_tau2.tau2_release.config:Tau2ReleaseConfig", "start_timeout_s", {}),
    ],
)
def test_the_new_wait_keys_refuse_what_is_not_a_positive_finite_number(schema, key, fields):
    module, name = schema.split(":")
    model = getattr(importlib.import_module(module), name)
    assert getattr(model(**fields), key) > 60  # the default: the literal it replaced
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValidationError, match=key):
            model(**fields, **{key: bad})
