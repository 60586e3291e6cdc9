"""`backend_of(db)`: the backend of a database object, the one place that tells the
dialects apart by the database's class (every database Corral opens is peewee's
SQLite or PostgreSQL one, or a subclass)."""
from __future__ import annotations

import peewee

from .base import Backend
from .postgres import POSTGRES
from .sqlite import SQLITE


def backend_of(db: peewee.Database) -> Backend:
    return POSTGRES if isinstance(db, peewee.PostgresqlDatabase) else SQLITE
