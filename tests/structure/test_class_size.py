"""No class over 400 lines in the project's packages: a class that large holds more
than one concept, and is split into parts of one concept each instead."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("control-plane", "agent", "shared", "cli")
MAX_CLASS_LINES = 400


def _classes(path: Path):
    """(name, first line, length in lines) of every class in a file, nested ones too."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ClassDef):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            yield node.name, first, node.end_lineno - first + 1


def test_no_class_is_over_the_limit():
    too_long = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name, first, length in _classes(path):
                if length > MAX_CLASS_LINES:
                    too_long.append(f"{name} ({path.relative_to(ROOT)}:{first}) is {length} lines")
    assert not too_long, f"classes over {MAX_CLASS_LINES} lines: " + "; ".join(too_long)


def test_the_check_counts_a_class_from_its_decorators_to_its_last_line(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text("@decorated\nclass A:\n    x = 1\n\n    def f(self):\n        return 2\n")
    assert list(_classes(source)) == [("A", 1, 6)]
