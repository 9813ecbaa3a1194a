"""The house rules that a reader of the tree relies on, read off the source: no import
circle in core_ops (imports inside functions count: they run), settings.py at the
ground floor, and every CORE_OPS_* variable read through it."""

import ast
import re
from pathlib import Path

import core_ops

PACKAGE = Path(core_ops.__file__).resolve().parent
ROOT = PACKAGE.parent


def _modules():
    """{dotted name: path} of every module of core_ops."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name, path, modules):
    """The modules of core_ops that module ``name`` imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            # `from . import x` imports the module x where there is one, else reads
            # a name of the package.
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
    return {m for m in found if m in modules and m != name}


def _cycles(graph):
    """The strongly connected components of more than one module (Tarjan's)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_module_of_core_ops_imports_itself_through_others():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


def test_a_cycle_is_found():  # the check above can fail
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_settings_is_the_ground_floor():
    modules = _modules()
    assert _imports("core_ops.settings", modules["core_ops.settings"], modules) == set()


def test_only_settings_reads_a_core_ops_variable():
    # os.environ["CORE_OPS_X"], .get("CORE_OPS_X"), getenv("CORE_OPS_X"), in core_ops, the
    # plugins and the autoload module (tests set variables; they do not count).
    read = re.compile(r"""(environ(\.get)?|getenv)\s*[\[(]\s*["']CORE_OPS_""")
    files = [*PACKAGE.rglob("*.py"), ROOT / "core_ops_autoload.py",
             *[p for p in (ROOT / "plugins").rglob("*.py") if "tests" not in p.parts and "build" not in p.parts]]
    readers = sorted(str(p.relative_to(ROOT)) for p in files if read.search(p.read_text()))
    assert readers == [], readers
