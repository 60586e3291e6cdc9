"""The lost-database marker of a PostgreSQL service: a row of `corral_cluster.service_database`
(control-plane/server/db_marker.py has what a marker is for and what every backend shares)."""
from __future__ import annotations

import peewee

from corral.server.db_marker import HOW_TO_START_FRESH, MARKER_LOCK_KEY, MARKER_SCHEMA, MARKER_TABLE, Guard

from .postgres_url import redact, schema_for


class PostgresGuard(Guard):
    def __init__(self, db: peewee.Database, service: str, history_table: str, init: bool, url: str):
        super().__init__(db, service, history_table, init)
        self.url = url

    def read_marker(self) -> tuple[bool, str | None]:
        if self.db.execute_sql("SELECT to_regclass(%s)", (MARKER_TABLE,)).fetchone()[0] is None:
            return False, None
        row = self.db.execute_sql(f"SELECT database_id FROM {MARKER_TABLE} WHERE service = %s",
                                  (self.service,)).fetchone()
        return (True, row[0]) if row else (False, None)

    def write_marker(self, database_id: str) -> None:
        with self.db.atomic():
            self.db.execute_sql("SELECT pg_advisory_xact_lock(%s)", (MARKER_LOCK_KEY,))
            self.db.execute_sql(f"CREATE SCHEMA IF NOT EXISTS {MARKER_SCHEMA}")
            self.db.execute_sql(f"CREATE TABLE IF NOT EXISTS {MARKER_TABLE} (service text PRIMARY KEY, "
                                f"database_id text NOT NULL, recorded_at timestamptz NOT NULL DEFAULT now())")
            self.db.execute_sql(f"INSERT INTO {MARKER_TABLE} (service, database_id) VALUES (%s, %s) "
                                f"ON CONFLICT (service) DO UPDATE SET database_id = excluded.database_id, "
                                f"recorded_at = now()", (self.service, database_id))

    def tables(self) -> list[str]:
        return [name for (name,) in self.db.execute_sql(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (schema_for(self.service),)).fetchall()]

    def missing(self) -> str:
        where = redact(self.url)
        return (f"the {self.service}'s tables (schema {schema_for(self.service)}) are missing from "
                f"{where}, but {MARKER_TABLE} there says they existed (dropped, or DATABASE_URL names "
                f"another database?): restore them or fix the URL, or {HOW_TO_START_FRESH}")
