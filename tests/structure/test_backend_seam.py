"""One database-backend seam: no module outside control-plane/server/backends/ tests which
database it runs on. What differs between SQLite and PostgreSQL is asked of the database's
backend (`backend_of(db)`: control-plane/server/backends/base.py), never worked out from the
database object.

Read with ast (nothing is imported). A dialect test is any of: naming a dialect's database
class (`peewee.PostgresqlDatabase`, `SqliteDatabase`, their pooled forms, Corral's own
`PostgresDatabase` and `QueuedWritersSqlite`), a row lock written directly (`.for_update(`),
a dialect flag read off the database (`getattr(db, "for_update", ...)`, `hasattr(db,
"one_writer")`), or a call of the old per-database helpers (`one_writer(db)`,
`lock_placement(db)`, ...) instead of the backend's."""
import ast
from pathlib import Path

from paths import REPO

ROOT = Path(REPO).resolve()
# The product's code; tests/ may tell the dialects apart (they set each one up).
SCANNED = ["shared", "control-plane", "agent", "cli", "scripts"]
BACKENDS = ROOT / "control-plane" / "server" / "backends"

DIALECT_CLASSES = {"PostgresqlDatabase", "PooledPostgresqlDatabase", "PostgresqlExtDatabase",
                   "SqliteDatabase", "PooledSqliteDatabase", "SqliteExtDatabase", "CSqliteExtDatabase",
                   "PostgresDatabase", "QueuedWritersSqlite"}
DIALECT_FLAGS = {"for_update", "one_writer", "wakes_on_every_commit", "lock_placement", "locked_nodes",
                 "windowed_events", "arrays"}
OLD_HELPERS = {"one_writer", "wakes_on_every_commit", "lock_placement", "locked_nodes"}


def dialect_tests(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each place in `tree` that tells the dialects apart itself."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in DIALECT_CLASSES:
            found.append((node.lineno, f"names {node.id}"))
        elif isinstance(node, ast.Attribute) and node.attr in DIALECT_CLASSES:
            found.append((node.lineno, f"names {node.attr}"))
        elif isinstance(node, ast.alias) and node.name.split(".")[-1] in DIALECT_CLASSES:
            found.append((getattr(node, "lineno", 0), f"imports {node.name}"))
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "for_update":
                found.append((node.lineno, "locks rows with .for_update() (Backend.skip_locked/lock_rows/for_share)"))
            elif isinstance(func, ast.Name) and func.id in ("getattr", "hasattr") and len(node.args) >= 2 \
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in DIALECT_FLAGS:
                found.append((node.lineno, f"reads the dialect flag {node.args[1].value!r} off an object"))
            elif isinstance(func, ast.Name) and func.id in OLD_HELPERS and node.args:
                found.append((node.lineno, f"calls {func.id}(...) instead of the backend's"))
    return found


def scanned_files() -> list[Path]:
    files = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if BACKENDS in path.parents or ".venv" in path.parts or "__pycache__" in path.parts:
                continue
            files.append(path)
    return files


def test_no_module_outside_the_backends_tests_which_database_it_runs_on():
    problems = []
    for path in scanned_files():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        problems += [f"{path.relative_to(ROOT)}:{line}: {what}" for line, what in dialect_tests(tree)]
    assert not problems, ("dialect branches outside control-plane/server/backends/ (ask backend_of(db) "
                          "instead):\n" + "\n".join(problems))


def test_the_check_finds_each_kind_of_dialect_test():
    samples = {
        "isinstance(db, peewee.PostgresqlDatabase)": "names PostgresqlDatabase",
        "from peewee import SqliteDatabase": "imports SqliteDatabase",
        "isinstance(db, postgres.PostgresDatabase)": "names PostgresDatabase",
        "q.for_update(skip_locked=True) if getattr(db, 'for_update', False) else q": "for_update",
        "one_writer(self.store.db)": "calls one_writer",
        "lock_placement(db, nodes=[n])": "calls lock_placement",
    }
    for source, expected in samples.items():
        found = dialect_tests(ast.parse(source))
        assert any(expected in what for _, what in found), (source, found)
    for fine in ("backend_of(db).skip_locked(query)", "self.ctx.backend.lock_placement(db, nodes=None)",
                 "backend_of(db).one_writer", "is_postgres(url)"):  # a URL names its backend
        assert not dialect_tests(ast.parse(fine)), fine
