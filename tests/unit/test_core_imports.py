"""The package's arrows: opdflow.core imports nothing heavy, no import circle, no private names
across modules.

- Every module of opdflow.core (found by pkgutil over its path), imported in a fresh
  interpreter, leaves torch, ray, transformers and vllm out of sys.modules; so does the
  plain `python -c "import opdflow.core"` (read from its -X importtime log).
- The module graph over opdflow/ has no circle. It counts every import statement wherever
  it stands: at the top of a module, inside a function (a deferred import only hides a
  circle until the function runs; issue 26's config.py -> engines/recipes.py -> config.py
  went through one) and under `if TYPE_CHECKING:` (a type is an arrow too). A node is a
  module (a package is its __init__.py); an import points at the module it names, or at
  the package whose __init__ defines the name. The parent packages an import runs on the
  way are not counted as arrows.
- No module imports a private name (`_name`) from another opdflow module, by `from M import
  _name` or by reaching `M._name` through an imported module.

Pure reading of the source (ast) apart from the two interpreters: a few seconds.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "opdflow"
HEAVY = ("torch", "ray", "transformers", "vllm")


def _python(*args: str) -> subprocess.CompletedProcess:
    """A fresh interpreter on this checkout's opdflow."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}

CHILD = """
import importlib, json, pkgutil, sys
HEAVY = set(sys.argv[1].split(","))

def heavy():
    return sorted({n.split(".")[0] for n, m in sys.modules.items() if m is not None} & HEAVY)

import opdflow.core
seen = {"opdflow.core": heavy()}
for info in pkgutil.walk_packages(opdflow.core.__path__, "opdflow.core."):
    importlib.import_module(info.name)
    seen[info.name] = heavy()
print(json.dumps(seen))
"""


def test_every_core_module_imports_nothing_heavy():
    out = _python("-c", CHILD, ",".join(HEAVY))
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # pkgutil found every module of the folder (the check is not vacuous)
    assert set(seen) == {m for m in MODULES if m.startswith("opdflow.core")}
    first = next(((m, h) for m, h in seen.items() if h), None)  # in import order
    assert first is None, f"importing {first[0]} imports {first[1]}"


def test_import_opdflow_core_alone_imports_nothing_heavy():
    out = _python("-X", "importtime", "-c", "import opdflow.core")
    assert out.returncode == 0, out.stderr[-3000:]
    imported = [
        line.rsplit("|", 1)[1].strip()
        for line in out.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    ]
    assert "opdflow.core" in imported  # the log is read right
    heavy = sorted({m for m in imported if m.split(".")[0] in HEAVY})
    assert not heavy, heavy


# ---------------------------------------------------------------- the source's imports


def _resolve(name: str) -> str | None:
    """The module (or package) `name` lives in: the longest prefix that is a module."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports_in(source: str, package: str) -> list[tuple[int, str, str | None, str | None]]:
    """(line, module, name or None, as-name or None) of every import statement in `source`
    (a module of `package`): at the top, in functions and under TYPE_CHECKING alike;
    relative imports made absolute."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, None, a.asname) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            out += [(node.lineno, base, a.name, a.asname) for a in node.names]
    return sorted(out)


def _package(module: str) -> str:
    """The package a module's relative imports start from."""
    is_package = MODULES.get(module, Path()).name == "__init__.py"
    return module if is_package else module.rpartition(".")[0]


def _imports(module: str) -> list[tuple[int, str, str | None, str | None]]:
    return _imports_in(MODULES[module].read_text(), _package(module))


def _graph() -> dict[str, set[str]]:
    """module -> the opdflow modules it imports (itself left out)."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for m in MODULES:
        for _, base, name, _ in _imports(m):
            target = _resolve(f"{base}.{name}" if name else base)
            if target and target != m:
                graph[m].add(target)
    return graph


def _tangles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Each strongly connected set of more than one module: modules that all reach each
    other through imports (every circle lies inside one)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                found.append(set(members))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _circle_through(graph: dict[str, set[str]], members: set[str]) -> list[str]:
    """A shortest path from the first member back to itself inside `members` (breadth first)."""
    start = min(members)
    paths = {w: [start, w] for w in graph[start] if w in members}
    frontier = list(paths)
    while start not in paths:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    return paths[start]


def test_the_import_reader_counts_every_import_and_finds_circles():
    source = """
from __future__ import annotations
from typing import TYPE_CHECKING
import opdflow.core.stats as st
from . import sibling
if TYPE_CHECKING:
    from ..config import PipelineConfig

def later():
    from opdflow.analysis import quality
"""
    assert _imports_in(source, "opdflow.driver") == [
        (2, "__future__", "annotations", None),
        (3, "typing", "TYPE_CHECKING", None),
        (4, "opdflow.core.stats", None, "st"),
        (5, "opdflow.driver", "sibling", None),
        (7, "opdflow.config", "PipelineConfig", None),
        (10, "opdflow.analysis", "quality", None),
    ]
    assert any(t.startswith("opdflow.commands.") for t in _graph()["opdflow.cli"])
    ring = {"a": {"b"}, "b": {"c", "a"}, "c": {"a"}, "d": {"a"}}
    assert _tangles(ring) == [{"a", "b", "c"}]
    assert _circle_through(ring, {"a", "b", "c"}) == ["a", "b", "a"]
    assert _tangles({"a": {"b"}, "b": set()}) == []
    uses = """
import opdflow.record.checkpoint
from opdflow.commands import quality as q
from opdflow.commands.quality import _dur, __doc__

def f():
    return q._quiet, opdflow.record.checkpoint._single_process_quiet, q.__name__
"""
    assert _private_uses("opdflow.commands.study", uses) == [
        "opdflow.commands.study:4 imports opdflow.commands.quality._dur",
        "opdflow.commands.study:7 uses opdflow.commands.quality._quiet",
        "opdflow.commands.study:7 uses opdflow.record.checkpoint._single_process_quiet",
    ]


def test_no_import_circle_among_opdflow_modules():
    graph = _graph()
    tangles = _tangles(graph)
    assert not tangles, "import circles: " + "; ".join(
        f"{' -> '.join(_circle_through(graph, t))} (caught in it: {', '.join(sorted(t))})"
        for t in tangles
    )


def _private_uses(module: str, source: str) -> list[str]:
    """'module:line imports M._name' for each private name `source` (module `module`) takes
    from another opdflow module."""
    found, alias = [], {}  # local name -> the opdflow module it is bound to
    for line, base, name, asname in _imports_in(source, _package(module)):
        if not base.startswith("opdflow"):
            continue
        if name is None:  # `import opdflow.a.b` binds opdflow; `... as x` binds x to opdflow.a.b
            alias[asname or "opdflow"] = base if asname else "opdflow"
        elif f"{base}.{name}" in MODULES:  # from opdflow.a import b: b is a module
            alias[asname or name] = f"{base}.{name}"
        elif name.startswith("_") and not name.startswith("__"):
            found.append(f"{module}:{line} imports {base}.{name}")
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        head, _, rest = ast.unparse(node.value).partition(".")
        owner = ".".join([alias[head], rest]).rstrip(".") if head in alias else None
        if owner in MODULES and owner != module and not node.attr.startswith("__"):
            found.append(f"{module}:{node.lineno} uses {owner}.{node.attr}")
    return found


def test_no_module_imports_a_private_name_from_another():
    found = [use for m, path in MODULES.items() for use in _private_uses(m, path.read_text())]
    assert not found, "private names used across modules: " + "; ".join(found)


def _folder_rule(init: Path) -> tuple[set[str], set[str]]:
    """The opdflow folders and the heavy libraries a folder's `__init__` docstring says its
    modules may import: the paragraph from "May import:" up to "Imported by" (or its
    end)."""
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    if "May import:" not in doc:
        return set(), set()
    rule = doc.split("May import:", 1)[1].split("Imported by", 1)[0].split("\n\n", 1)[0]
    folders = {m.split(".")[1] for m in rule.replace(",", " ").split() if m.startswith("opdflow.")}
    return {f.strip(".;()") for f in folders}, {h for h in HEAVY if h in rule}


FOLDERS = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))


def _violations(folder: str) -> list[str]:
    allowed, heavy = _folder_rule(PACKAGE / folder / "__init__.py")
    out = []
    for module, path in MODULES.items():
        if module.split(".")[1:2] != [folder] or path.parent != PACKAGE / folder:
            continue
        for line, base, name, _ in _imports(module):
            root = base.split(".")[0]
            if root == "opdflow":
                target = _resolve(f"{base}.{name}" if name else base) or base
                parts = target.split(".")
                other = parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else None
                if other and other != folder and other not in allowed:
                    out.append(
                        f"{path.relative_to(REPO)}:{line} imports {target} (opdflow.{other})"
                    )
            elif root in HEAVY and root not in heavy:
                out.append(f"{path.relative_to(REPO)}:{line} imports {base} ({root})")
    return out


def test_every_folder_states_what_it_may_import():
    """Each folder's __init__ docstring has a "May import:" paragraph (what the next test
    holds its modules to)."""
    missing = [f for f in FOLDERS if not _folder_rule(PACKAGE / f / "__init__.py")[0]]
    assert not missing, f"folders without a 'May import: opdflow....' line: {missing}"


def test_every_folder_imports_only_what_its_rule_allows():
    """Every import in a folder's modules (top level, in functions, under TYPE_CHECKING) of
    another opdflow folder, or of torch, ray, transformers or vllm, is named by the folder's
    "May import:" line; a violation names the file and line."""
    found = [v for folder in FOLDERS for v in _violations(folder)]
    assert not found, "imports outside their folder's 'May import' rule:\n" + "\n".join(found)


def test_the_folder_rule_reader_finds_a_violation(tmp_path):
    """The reader parses a rule and flags an import the rule leaves out."""
    init = tmp_path / "__init__.py"
    init.write_text('"""X.\n\nMay import: opdflow.core, opdflow.config; torch. Imported by y."""\n')
    assert _folder_rule(init) == ({"core", "config"}, {"torch"})
    assert "driver" not in _folder_rule(init)[0]


def test_no_module_is_over_400_lines():
    """A module that grows past 400 lines has grown a second noun: split it."""
    long = {str(p.relative_to(REPO)): n for p in MODULES.values()
            if (n := len(p.read_text().splitlines())) > 400}  # fmt: skip
    assert not long, long
