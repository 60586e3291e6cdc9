"""No import cycle among the project's modules, not even one that only an import under
TYPE_CHECKING or inside a function closes: a cycle ties its modules into one part that
can be neither read nor tested apart. The modules are found as setup.cfg maps packages
to folders, and their imports read with ast (nothing is imported)."""
import ast
import configparser
import os

from paths import REPO


def package_dirs() -> dict[str, str]:
    """setup.cfg's package_dir: the package name of each folder."""
    config = configparser.ConfigParser()
    config.read(os.path.join(REPO, "setup.cfg"))
    mapping = {}
    for line in config["options"]["package_dir"].strip().splitlines():
        name, _, folder = (part.strip() for part in line.partition("="))
        mapping[name] = os.path.join(REPO, folder)
    return mapping


def project_modules() -> dict[str, tuple[str, bool]]:
    """Each module's dotted name: its file and whether it is a package's __init__."""
    modules: dict[str, tuple[str, bool]] = {}
    for package, folder in package_dirs().items():
        for here, dirs, files in os.walk(folder):
            dirs[:] = [d for d in dirs if os.path.exists(os.path.join(here, d, "__init__.py"))]
            parts = os.path.relpath(here, folder).split(os.sep)
            prefix = ".".join([package, *(p for p in parts if p != ".")])
            for file in files:
                if not file.endswith(".py"):
                    continue
                is_init = file == "__init__.py"
                name = prefix if is_init else f"{prefix}.{file[:-3]}"
                modules[name] = (os.path.join(here, file), is_init)
    return modules


def imported(name: str, is_init: bool, tree: ast.AST, modules) -> set[str]:
    """The project modules a module imports anywhere in it (top level, under
    TYPE_CHECKING, inside functions); `from pkg import sub` imports the module pkg.sub."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = name if is_init else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{node.module}" if node.module else package
            else:
                base = node.module or ""
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a module a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    graph = {}
    for name, (path, is_init) in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        graph[name] = imported(name, is_init, tree, modules)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each group of modules that import each other (Tarjan's
    strongly connected components), as the path around it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [path_around(graph, group) for group in groups]


def path_around(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """The shortest way from the group's first module back to itself, within the group."""
    start = min(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph[node] & group):
            if nxt == start:
                return paths[node] + [start]
            if nxt not in paths:
                paths[nxt] = paths[node] + [nxt]
                queue.append(nxt)
    raise AssertionError(f"no cycle through {start}")  # a strongly connected group always has one


def test_the_graph_covers_every_package_of_the_project():
    graph = import_graph()
    for package in ("corral.shared", "corral.server", "corral.server.backends", "corral.scheduler",
                    "corral.registry", "corral.agent", "corral.cli"):
        assert package in graph
    assert "corral.scheduler.migrations" in graph and "corral.agent.agent" in graph


def test_a_cycle_is_found_through_type_checking_and_function_imports():
    tree_a = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n")
    tree_b = ast.parse("def f():\n    from corral.x import a\n")
    modules = {"corral.x": None, "corral.x.a": None, "corral.x.b": None}
    graph = {"corral.x": set(),
             "corral.x.a": imported("corral.x.a", False, tree_a, modules),
             "corral.x.b": imported("corral.x.b", False, tree_b, modules)}
    assert cycles(graph) == [["corral.x.a", "corral.x.b", "corral.x.a"]]


def test_no_module_of_the_project_is_part_of_an_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in found)
