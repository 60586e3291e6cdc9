"""The lost-database marker of a SQLite file: `<database>-id` beside it
(control-plane/server/db_marker.py has what a marker is for and what every backend shares)."""
from __future__ import annotations

import json
import os

import peewee

from corral.server.db_marker import HOW_TO_START_FRESH, Guard
from corral.shared.errors import SettingError


class SqliteGuard(Guard):
    def __init__(self, db: peewee.Database, service: str, history_table: str, init: bool):
        super().__init__(db, service, history_table, init)
        self.path = db.database
        self.marker_path = f"{self.path}-id"
        # Made by the first write to a database: a release before markers leaves it, so a
        # database lost before that release's first start here is refused too.
        self.writers_lock = f"{self.path}-writers.lock"
        self.said_by = self.marker_path

    def read_marker(self) -> tuple[bool, str | None]:
        self.said_by = self.marker_path
        try:
            with open(self.marker_path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            if os.path.exists(self.writers_lock):
                self.said_by = self.writers_lock
                return True, None
            return False, None
        except OSError as exc:
            raise SettingError(f"cannot read {self.marker_path}: {exc.strerror or exc}") from None
        try:
            marked_id = json.loads(text).get("database_id")
        except (ValueError, AttributeError):
            marked_id = None  # damaged: it still says a database existed
        return True, marked_id if isinstance(marked_id, str) else None

    def write_marker(self, database_id: str) -> None:
        text = json.dumps({"service": self.service, "database_id": database_id,
                           "says": f"this host has had the {self.service} database {os.path.basename(self.path)}; "
                                   f"without it, the server refuses to start (see --init)"}) + "\n"
        temporary = f"{self.marker_path}.tmp"
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, text.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, self.marker_path)
            directory = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(directory)  # the rename itself survives a crash
            finally:
                os.close(directory)
        except OSError as exc:
            raise SettingError(f"cannot write {self.marker_path}: {exc.strerror or exc}") from None

    def tables(self) -> list[str]:
        return [name for (name,) in self.db.execute_sql(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'").fetchall()]

    def before_connect(self) -> None:
        if not os.path.exists(self.path) and not self.init and self.read_marker()[0]:
            raise SettingError(self.missing())

    def missing(self) -> str:
        state = "is missing" if not os.path.exists(self.path) else "is empty"
        return (f"the {self.service} database {self.path} {state}, but {self.said_by} says this server has "
                f"had one there (deleted, moved, or its disk not mounted?): restore it or fix DATABASE_URL, "
                f"or {HOW_TO_START_FRESH}")
