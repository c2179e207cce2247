"""Imports run one way: the layer table in docs/ARCHITECTURE.md is the rule, and every import in
the code (lazy ones inside functions too) is checked against it.

A package may import its own modules and any package of a lower layer, never one of its own
layer or above: libraries never import the programs built on them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
# | 2 | `soft_target`, `hosts` | ... : the layer's number and its packages, as the doc shows them.
_ROW = re.compile(r"^\|\s*(\d+)\s*\|([^|]*)\|")


def layers() -> dict[str, int]:
    """Package -> layer, read from the table in docs/ARCHITECTURE.md."""
    layer_of: dict[str, int] = {}
    for line in ARCHITECTURE.read_text().splitlines():
        match = _ROW.match(line)
        if match:
            for package in re.findall(r"`([a-z_]+)`", match.group(2)):
                layer_of[package] = int(match.group(1))
    return layer_of


def python_packages() -> list[str]:
    """Top-level directories of the repository that hold Python code."""
    return sorted(p.name for p in ROOT.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and any(p.rglob("*.py")))


def imported_packages(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in one file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def upward_imports(layer_of: dict[str, int]) -> list[str]:
    """Every import of a package of the importer's layer or above, as 'file:line: why'."""
    wrong = []
    for package, layer in sorted(layer_of.items()):
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, imported in imported_packages(path):
                if imported == package or imported not in layer_of:
                    continue
                if layer_of[imported] >= layer:
                    wrong.append(f"{path.relative_to(ROOT)}:{line}: {package} (layer {layer}) "
                                 f"imports {imported} (layer {layer_of[imported]})")
    return wrong


def test_every_python_package_has_a_layer_in_the_architecture_doc():
    layer_of = layers()
    assert layer_of, f"no layer table found in {ARCHITECTURE}"
    missing = [p for p in python_packages() if p not in layer_of]
    assert not missing, f"packages with no layer in docs/ARCHITECTURE.md: {missing}"


def test_no_import_runs_upward():
    wrong = upward_imports(layers())
    assert not wrong, "imports that run upward:\n" + "\n".join(wrong)


def test_the_check_sees_an_upward_import(tmp_path):
    """The checker itself: a library importing a program is caught, lazy imports included."""
    source = tmp_path / "lib.py"
    source.write_text("import os\n\ndef f():\n    from emulation import net\n    return net\n")
    assert imported_packages(source) == [(1, "os"), (4, "emulation")]
    layer_of = layers()
    assert layer_of["emulation"] > layer_of["hosts"] > layer_of["bml"]
