"""No module imports another's private names (``from speclane.x import _y``): what a
module shares, it names without an underscore. The package layering itself is
``lint-imports``'s ([tool.importlinter] in pyproject.toml)."""

from __future__ import annotations

import ast
from pathlib import Path

import speclane

SOURCE = Path(speclane.__file__).resolve().parent


def test_no_module_imports_a_private_name_of_another():
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("speclane"):
                found += [f"{path.relative_to(SOURCE)}:{node.lineno} {node.module}.{alias.name}"
                          for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert not found, "private names imported across modules:\n" + "\n".join(found)
