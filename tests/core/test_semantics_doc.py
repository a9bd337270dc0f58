"""Every example in docs/SEMANTICS.md names its test; each named test must exist."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_named_test_exists():
    text = (ROOT / "docs/SEMANTICS.md").read_text()
    refs = re.findall(r"^test: (\S+)::(\w+)$", text, re.M)
    assert len(refs) >= 20
    missing = []
    for path, name in refs:
        tree = ast.parse((ROOT / path).read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if name not in names:
            missing.append(f"{path}::{name}")
    assert not missing, missing


def test_every_example_block_is_followed_by_a_test():
    text = (ROOT / "docs/SEMANTICS.md").read_text()
    for block in re.finditer(r"```sh\n.*?```\n", text, re.S):
        after = text[block.end():block.end() + 400]
        assert re.search(r"^test: ", after, re.M), f"example without test: {block.group(0)[:80]}"
