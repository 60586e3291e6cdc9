"""Fresh SQLite databases of in-process apps start as a copy of one migrated database
per service and test process, instead of running every migration step again (most of
an app's start-up, and a fifth of the unit tests' CPU).

The copy holds what the steps make, and its history's times are set anew, as a run of
the steps would have set them. Only an empty database is copied into, and the steps
themselves still run for real once per service, and in the migration tests
(`REAL_MIGRATIONS`), which check what they do.
"""
from __future__ import annotations

import atexit
import datetime
import os
import shutil
import sqlite3
import tempfile

import peewee

from corral.server import migrations

# Test modules whose subject is the migrations or the lost-database marker.
REAL_MIGRATIONS = ("test_migrations.py", "test_lost_database.py")

_real_apply = migrations.apply
_templates: dict[str, tuple[str, list[str]]] = {}  # service -> (file, the steps applied)


def _empty_file(db: peewee.Database) -> str | None:
    """The file of an SQLite database that holds nothing yet (and has no marker), or None."""
    if not isinstance(db, peewee.SqliteDatabase) or db.database in ("", ":memory:"):
        return None
    path = str(db.database)
    if path.startswith("file:") or os.path.exists(f"{path}-id"):
        return None
    if os.path.exists(path) and os.path.getsize(path) > 0:
        return None
    return path


def _copy(source: str, target: str) -> None:
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    src.close()
    dst.close()


def apply(db: peewee.Database, migration_set, init: bool = False) -> list[str]:
    path = _empty_file(db)
    if path is None:
        return _real_apply(db, migration_set, init)
    made = _templates.get(migration_set.service)
    if made is None:
        applied = _real_apply(db, migration_set, init)
        folder = tempfile.mkdtemp(prefix="corral-migrated-")
        atexit.register(shutil.rmtree, folder, True)  # the test process's own: gone when it ends
        template = os.path.join(folder, f"{migration_set.service}.db")
        _copy(path, template)
        _templates[migration_set.service] = (template, applied)
        return applied
    template, applied = made
    _copy(template, path)
    with sqlite3.connect(path) as conn:
        conn.execute(f'UPDATE "{migration_set.history_table}" SET applied = ?', (str(datetime.datetime.now()),))
    conn.close()
    assert _real_apply(db, migration_set, init) == []  # the marker, and the backend's preparation
    for name in applied:
        migrations.log.info("applied the %s database's migration %s", migration_set.service, name)
    return applied
