"""docs/architecture.md stays a true map of the code: its module map names every module of
the project and nothing that is not there, and every function, class or method it names
(`scheduler.service.Scheduler.submit`, `Store.take_placed`) exists. Resolved by reading the
source with ast: nothing is imported.

The map's format: under "## Module map", a `### `dir/`` heading per package (its path from the
repository's root) and a bullet per module, "- `name.py`: what it is", the name relative to
the heading's folder; a `migrations/` bullet stands for that folder's numbered steps. A
package's `__init__.py` that holds only a docstring needs no bullet. Elsewhere on the page a
code span written as a dotted name is a name of the code: package-qualified
(`agent.claims.Claims.loop`, the package as `corral.` names it) or `Class.member`."""
import ast
import configparser
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from paths import REPO

ROOT = Path(REPO).resolve()
MAP = ROOT / "docs" / "architecture.md"

FENCE = re.compile(r"^\s*(```|~~~)")
SPAN = re.compile(r"`([^`]+)`")
DOTTED = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(.*\))?$")
COVERING = "migrations"  # the one folder a single bullet may stand for
SUBMODULE = ast.Module(body=[], type_ignores=[])  # what a package's name for its submodule resolves to


def package_roots(root: Path) -> dict[str, Path]:
    """corral's top-level packages from setup.cfg's package_dir: short name -> folder."""
    config = configparser.ConfigParser()
    config.read(root / "setup.cfg", encoding="utf-8")
    roots = {}
    for line in config["options"]["package_dir"].strip().splitlines():
        name, _, path = (part.strip() for part in line.partition("="))
        parts = name.split(".")
        if len(parts) == 2 and parts[0] == "corral":
            roots[parts[1]] = root / path
    return roots


def only_a_docstring(path: Path) -> bool:
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def project_modules(root: Path) -> set[Path]:
    """Every module of the project, as a path from `root`; docstring-only __init__.py left out."""
    found = set()
    for folder in package_roots(root).values():
        for path in folder.rglob("*.py"):
            if "__pycache__" in path.parts or (path.name == "__init__.py" and only_a_docstring(path)):
                continue
            found.add(path.relative_to(root))
    return found


def prose(text: str) -> list[tuple[int, str]]:
    """The page's lines outside fenced code blocks, numbered from 1."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def section(lines: list[tuple[int, str]], title: str) -> list[tuple[int, str]]:
    """The lines under the `## title` heading, up to the next heading of that level."""
    inside, found = False, []
    for number, line in lines:
        if line.startswith("## "):
            inside = line[3:].strip().lower() == title.lower()
        elif inside:
            found.append((number, line))
    return found


def map_entries(text: str) -> list[tuple[int, Path]]:
    """The module map's bullets, as paths from the repository's root."""
    entries, folder = [], None
    for number, line in section(prose(text), "Module map"):
        if line.startswith("### "):
            spans = SPAN.findall(line)
            folder = Path(spans[0].rstrip("/")) if spans else None
        elif line.startswith("- ") and folder is not None:
            spans = SPAN.findall(line)
            if spans and line[2:].lstrip().startswith("`"):
                entries.append((number, folder / spans[0]))
    return entries


def map_problems(text: str, root: Path) -> list[str]:
    """A line for each module the map leaves out and each entry naming nothing that exists."""
    problems, covered = [], set()
    for number, entry in map_entries(text):
        path = root / entry
        if not path.exists():
            problems.append(f"line {number}: {entry} does not exist")
        elif path.is_dir():
            if path.name == COVERING:
                covered |= {p.relative_to(root) for p in path.rglob("*.py") if "__pycache__" not in p.parts}
        else:
            covered.add(entry)
    problems += [f"{module} is missing from the module map" for module in sorted(project_modules(root) - covered)]
    return problems


@dataclass
class Module:
    path: Path
    tree: ast.Module
    package: str  # the dotted name relative imports start from


@dataclass
class Code:
    """The project's modules by dotted name (`scheduler.service`) and classes by name."""
    modules: dict[str, Module] = field(default_factory=dict)
    classes: dict[str, list[tuple[str, ast.ClassDef]]] = field(default_factory=dict)

    @classmethod
    def read(cls, root: Path) -> "Code":
        code = cls()
        for short, folder in package_roots(root).items():
            for path in folder.rglob("*.py"):
                if "__pycache__" in path.parts:
                    continue
                parts = [short, *path.relative_to(folder).with_suffix("").parts]
                is_package = parts[-1] == "__init__"
                if is_package:
                    parts.pop()
                name = ".".join(parts)
                tree = ast.parse(path.read_text(encoding="utf-8"))
                code.modules[name] = Module(path, tree, name if is_package else name.rpartition(".")[0])
                for node in ast.walk(tree):
                    if isinstance(node, ast.ClassDef):
                        code.classes.setdefault(node.name, []).append((name, node))
        return code

    def top_level(self, module: str, name: str, depth: int = 0) -> ast.AST | None:
        """What `name` is at the top of `module`: its def, class or assignment, or what an
        import of the project brings in under that name."""
        if depth > 10 or module not in self.modules:
            return None
        info = self.modules[module]
        for node in info.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                return node
            if name in assigned(node):
                return node
        for node in info.tree.body:
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = imported_module(node, info.package)
                        if source is None:
                            return None  # from outside the project: not a name of its code
                        if f"{source}.{alias.name}" in self.modules:
                            return SUBMODULE
                        return self.top_level(source, alias.name, depth + 1)
        return SUBMODULE if f"{module}.{name}" in self.modules else None

    def member(self, node: ast.ClassDef, name: str, depth: int = 0) -> bool:
        """Whether the class, or a base class of the project, defines `name`."""
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and item.name == name:
                return True
            if name in assigned(item):
                return True
        if depth > 10:
            return False
        for base in node.bases:
            if isinstance(base, ast.Subscript):  # a generic base: LeasedLoop[Store, bool]
                base = base.value
            base_name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", None)
            for _, base_node in self.classes.get(base_name or "", []):
                if self.member(base_node, name, depth + 1):
                    return True
        return False

    def resolves(self, dotted: str) -> bool:
        parts = dotted.removeprefix("corral.").split(".")
        if parts[0] in {name.split(".")[0] for name in self.modules}:
            for cut in range(len(parts), 0, -1):
                module = ".".join(parts[:cut])
                if module in self.modules:
                    return self.resolves_in(module, parts[cut:])
            return False
        return any(self.resolves_attributes(node, parts[1:]) for _, node in self.classes.get(parts[0], []))

    def resolves_in(self, module: str, rest: list[str]) -> bool:
        if not rest:
            return True
        node = self.top_level(module, rest[0])
        if node is None:
            return False
        return not rest[1:] or (isinstance(node, ast.ClassDef) and self.resolves_attributes(node, rest[1:]))

    def resolves_attributes(self, node: ast.ClassDef, rest: list[str]) -> bool:
        if not self.member(node, rest[0]):
            return False
        if not rest[1:]:
            return True
        inner = [item for item in node.body if isinstance(item, ast.ClassDef) and item.name == rest[0]]
        return bool(inner) and self.resolves_attributes(inner[0], rest[1:])


def assigned(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def imported_module(node: ast.ImportFrom, package: str) -> str | None:
    """The dotted name (without `corral.`) of the module an import of the project reads from."""
    if node.level:
        base = package.split(".")
        base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
        return ".".join([*base, *([node.module] if node.module else [])])
    if node.module and node.module.startswith("corral."):
        return node.module[len("corral."):]
    return None


def name_problems(text: str, root: Path) -> list[str]:
    """A line for each dotted name of the page that is no module, function, class or member
    of the project, and each `….py` that is no file of it."""
    code, problems = Code.read(root), []
    entries = {number for number, _ in map_entries(text)}  # their first span is map_problems' to check
    basenames = {p.name for folder in [*package_roots(root).values(), root / "tests", root / "scripts"]
                 for p in folder.rglob("*.py")}
    for number, line in prose(text):
        for index, span in enumerate(SPAN.findall(line)):
            span = span.strip()
            if index == 0 and number in entries:
                continue
            if span.endswith(".py") or span.endswith("/"):
                if "/" in span.rstrip("/") and not (root / span).exists():
                    problems.append(f"line {number}: {span} does not exist")
                elif "/" not in span.rstrip("/") and span.endswith(".py") and span not in basenames:
                    problems.append(f"line {number}: no module is named {span}")
                continue
            match = DOTTED.match(span)
            if match and not code.resolves(match.group(1)):
                problems.append(f"line {number}: {match.group(1)} names nothing in the code")
    return problems


def test_the_checks_catch_a_stale_map(tmp_path):
    (tmp_path / "setup.cfg").write_text("[options]\npackage_dir =\n    corral.pkg = pkg\n", encoding="utf-8")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text('"""The package."""\n', encoding="utf-8")
    (tmp_path / "pkg" / "base.py").write_text("class Base:\n    def ping(self): ...\n", encoding="utf-8")
    (tmp_path / "pkg" / "store.py").write_text(
        "from .base import Base\n\nclass Store(Base[int]):\n    limit = 1\n    def take(self): ...\n\n"
        "def helper(): ...\n", encoding="utf-8")
    (tmp_path / "pkg" / "left_out.py").write_text("", encoding="utf-8")
    (tmp_path / "pkg" / "migrations").mkdir()
    (tmp_path / "pkg" / "migrations" / "0001_initial.py").write_text("", encoding="utf-8")
    page = ("# Map\n\n## The path\n\n`pkg.store.Store.take` `Store.ping` `pkg.store.helper` `pkg.store.Base.ping`"
            " `pkg.store.Store.limit` `POST /jobs` `pkg/store.py` `store.py`\n"
            "`pkg.store.Store.gone` `Store.gone` `pkg.wakeup.plan` `pkg/gone.py` `gone.py` `Nobody.x`\n\n"
            "```\n`pkg.inside.a.fence`\n```\n\n"
            "## Module map\n\n### `pkg/`: the package\n\n- `base.py`: a base\n- `store.py`: the store\n"
            "- `migrations/`: the steps\n- `wakeup.py`: gone\n")
    assert map_problems(page, tmp_path) == ["line 19: pkg/wakeup.py does not exist",
                                            "pkg/left_out.py is missing from the module map"]
    assert name_problems(page, tmp_path) == ["line 6: pkg.store.Store.gone names nothing in the code",
                                             "line 6: Store.gone names nothing in the code",
                                             "line 6: pkg.wakeup.plan names nothing in the code",
                                             "line 6: pkg/gone.py does not exist",
                                             "line 6: no module is named gone.py",
                                             "line 6: Nobody.x names nothing in the code"]


def test_the_module_map_is_the_code():
    problems = map_problems(MAP.read_text(encoding="utf-8"), ROOT)
    assert not problems, "docs/architecture.md's module map is out of date:\n" + "\n".join(problems)


def test_every_name_on_the_map_exists():
    problems = name_problems(MAP.read_text(encoding="utf-8"), ROOT)
    assert not problems, "docs/architecture.md names what the code does not have:\n" + "\n".join(problems)


@pytest.mark.parametrize("title", ["Processes", "The path of one job", "Module map"])
def test_the_map_has_its_parts(title):
    assert section(prose(MAP.read_text(encoding="utf-8")), title), f"docs/architecture.md has no '## {title}'"
