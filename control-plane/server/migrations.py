"""Versioned schema migrations of a service's database (docs/operations.md, "Upgrades").

Each service's numbered scripts in its `migrations/` package (`up(migrator, db)`,
with frozen copies of the tables they make, never the live models) are applied in
order by peewee's runner, each in its own transaction, under the backend's
`migration_lock()` so that replicas starting together migrate once. Migrations only
add between releases (a rolling upgrade keeps working); a database migrated by a
newer Corral is refused (SettingError, exit 2).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import peewee
from playhouse.migrate import SchemaMigrator
from playhouse.migrations import Migration, Runner

from corral.server.backends.lookup import backend_of
from corral.shared.errors import SettingError

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class MigrationSet:
    """The migrations of one service: its scripts' folder and its lock."""

    service: str      # "scheduler" or "registry"
    directory: str    # the folder of its numbered scripts
    lock_key: int     # its PostgreSQL advisory lock (a bigint no other lock of Corral uses)

    @property
    def history_table(self) -> str:
        return f"{self.service}_schema_migration"

    def names(self) -> list[str]:
        """Every step these scripts define, in order."""
        return [m.name for m in Migration.load_directory(self.directory)]


def pending(db: peewee.Database, migrations: MigrationSet, init: bool = False) -> list[str]:
    """The steps not applied to `db` yet, in order (SettingError for a newer database,
    or a lost one: control-plane/server/db_marker.py)."""
    guard = backend_of(db).marker_guard(db, migrations.service, migrations.history_table, init)
    if guard:
        guard.before_connect()
    with db.connection_context():
        if guard:
            guard.check()
        return [m.name for m in _status(_runner(db, migrations), migrations) if not m.applied]


def apply(db: peewee.Database, migrations: MigrationSet, init: bool = False) -> list[str]:
    """Apply the pending steps to `db` under the service's lock; the names applied
    (none when another process applied them first, or there were none). A lost
    database is refused first (SettingError) unless `init` (control-plane/server/db_marker.py)."""
    backend = backend_of(db)
    guard = backend.marker_guard(db, migrations.service, migrations.history_table, init)
    with backend.migration_lock(db, migrations.lock_key, guard.before_connect if guard else None):
        if guard:
            guard.check()
        backend.prepare(db, migrations.service)
        runner = _runner(db, migrations)
        _status(runner, migrations)
        try:
            applied = runner.up()
        except peewee.DatabaseError as exc:
            # One line and exit 2 at start, like any other refusal; the runner logged the step.
            raise SettingError(f"a migration step of the {migrations.service} database failed and was rolled "
                               f"back (each step is one transaction): {first_line(exc)}") from None
        if guard:
            guard.record()
    for name in applied:
        log.info("applied the %s database's migration %s", migrations.service, name)
    return applied


def applied(db: peewee.Database, migrations: MigrationSet) -> list[str]:
    """The steps the history of `db` records, in order."""
    with db.connection_context():
        return [m.name for m in _runner(db, migrations).status() if m.applied]


def _runner(db: peewee.Database, migrations: MigrationSet) -> Runner:
    return Runner(db, migrations.directory, table_name=migrations.history_table)


def _status(runner: Runner, migrations: MigrationSet) -> list[Migration]:
    steps = runner.status()
    unknown = [m.name for m in steps if m.path is None]
    if unknown:
        raise SettingError(
            f"the {migrations.service} database was migrated by a newer Corral: its history "
            f"({migrations.history_table}) has the step(s) {', '.join(unknown)}, which this version does not "
            f"know; run that newer version (or restore a backup made before the upgrade)")
    return steps


def first_line(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def create_or_complete(db: peewee.Database, migrator: SchemaMigrator, models: Iterable[type[peewee.Model]],
                       added_columns: Mapping[str, Iterable[str]]) -> None:
    """A service's first step: make its tables, or complete those of a database made
    before versioned migrations (tables, no history). Such a table may lack only the
    nullable columns `added_columns` names (table -> columns, added by releases before
    migrations began): they are added, and its rows read them as null. A table that
    lacks any other column is from a Corral too old to upgrade in place (SettingError).
    Then every missing table and index is made."""
    models = list(models)
    db.bind(models)
    for model in models:
        table = model._meta.table_name
        if not db.table_exists(table):
            continue
        have = {column.name for column in db.get_columns(table)}
        missing = [field for field in model._meta.sorted_fields if field.column_name not in have]
        addable = set(added_columns.get(table, ()))
        too_old = [field.column_name for field in missing if field.column_name not in addable or not field.null]
        if too_old:
            raise SettingError(f"the {table} table lacks the column(s) {', '.join(too_old)}, which cannot be added "
                               f"to its rows: this database is from a Corral too old to upgrade in place")
        for field in missing:
            migrator.migrate(migrator.add_column(table, field.column_name, field))
            log.info("added the column %s to the %s table", field.column_name, table)
    db.create_tables(models, safe=True)
