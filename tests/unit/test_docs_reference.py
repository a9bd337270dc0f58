"""The reference docs name only what exists: every flag of a benchmark command in
docs/PERFORMANCE.md is one its script takes, and every ``Class.method``, function and file
the newcomer's path in docs/ARCHITECTURE.md ("Start here") cites is in the code, and the
table of the core's parts there is the one their constructors make."""
from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _benchmark_commands() -> list[tuple[str, list[str]]]:
    """(module, flags) of every ``python -m benchmarks.X ...`` command (with its
    continuation lines) in PERFORMANCE.md."""
    text = (DOCS / "PERFORMANCE.md").read_text().replace("\\\n", " ")
    out = []
    for m in re.finditer(r"python -m (benchmarks\.\w+|tests\.stress\.\w+)([^\n`]*)", text):
        out.append((m.group(1), re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", m.group(2))))
    return out


@cache
def _flags_of(module: str) -> set[str]:
    """The long options a benchmark's argparse takes (its own, and the shared CPU option)."""
    path = ROOT / (module.replace(".", "/") + ".py")
    flags = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "add_argument":
            flags |= {a.value for a in node.args if isinstance(a, ast.Constant)
                      and isinstance(a.value, str) and a.value.startswith("--")}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "add_cpu_option":
            flags.add("--cpus")
    return flags


def test_every_benchmark_flag_in_the_performance_doc_exists():
    commands = _benchmark_commands()
    assert len(commands) >= 10, "the doc lists the benchmarks' commands"
    missing = [f"{module} {flag}" for module, flags in commands for flag in flags
               if flag not in _flags_of(module)]
    assert not missing, "flags no benchmark takes: " + ", ".join(missing)


@cache
def _definitions() -> tuple[set[str], set[str]]:
    """Every ``Class.method`` (or field) and every function/class name defined in the code."""
    methods, names = set(), set()
    for top in ("delvefs", "eventhandler", "rulesets"):
        for path in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    names.add(node.name)
                    for item in ast.walk(node):
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            methods.add(f"{node.name}.{item.name}")
                        elif isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name) \
                                and item.value.id == "self" and isinstance(item.ctx, ast.Store):
                            methods.add(f"{node.name}.{item.attr}")  # its fields too
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(node.name)
    return methods, names


def _start_here() -> str:
    text = (DOCS / "ARCHITECTURE.md").read_text()
    start = text.index("## Start here")
    return text[start:text.index("\n## ", start + 1)]


def test_the_start_here_path_cites_only_what_exists():
    methods, names = _definitions()
    section = _start_here()
    cited = re.findall(r"`([^`\s]+)`", section)
    assert len(cited) >= 30, "the path names the code it passes"
    missing = []
    for c in cited:
        if c.endswith(".py") or "/" in c:
            if not (ROOT / c).exists():
                missing.append(c)
        elif re.fullmatch(r"[A-Z]\w*\.\w+", c):
            if c not in methods:
                missing.append(c)
        elif re.fullmatch(r"[A-Za-z_]\w*", c) and c[0].isupper():
            if c not in names:
                missing.append(c)
    assert not missing, "cited in 'Start here' but not in the code: " + ", ".join(missing)


def _core_arrows() -> dict[str, list[str]]:
    """part -> what ``FileSystem.__init__`` gives it (other parts; ``cache``, ``store``,
    ``handler``), in the order it builds them."""
    tree = ast.parse((ROOT / "delvefs/client/mount/fs/core.py").read_text())
    fs = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "FileSystem")
    init = next(n for n in fs.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    arrows = {}
    for st in init.body:
        if isinstance(st, ast.Assign) and isinstance(st.value, ast.Call) \
                and isinstance(st.targets[0], ast.Attribute):
            given = []
            for arg in [*st.value.args, *(k.value for k in st.value.keywords)]:
                for n in ast.walk(arg):
                    if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) \
                            and n.value.id == "self":
                        given.append(n.attr)
                    elif isinstance(n, ast.Name) and n.id in ("cache", "store", "handler"):
                        given.append(n.id)
            arrows[st.targets[0].attr] = given
    return arrows


def test_the_core_parts_table_is_the_constructors():
    text = (DOCS / "ARCHITECTURE.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| `[\w.]+` \| (.*) \|$", text, re.M)
    documented = {part: re.findall(r"`(\w+)`", given) for part, given in rows}
    assert documented == _core_arrows()
    assert list(documented) == list(_core_arrows()), "in the order they are built"
