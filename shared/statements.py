"""peewee queries compiled to SQL once, then run many times with new values.

Building a query's SQL is most of what peewee costs: profiled in the scheduler,
turning query objects into SQL text took about 60% of the CPU of a job's trip
(submit, place, claim, report), far more than SQLite spent running it. The hot
statements are therefore written as ordinary peewee queries whose variable
parts are `param("name")` markers, compiled once per process by the database's
own dialect, and run with `execute_sql` (writes) or `Model.raw` (reads), so
they stay dialect-neutral.

Values given to a statement are passed to the driver as they are: convert them
as the column would (`field.db_value`) where that matters (JSON fields).
"""
from __future__ import annotations

from collections.abc import Callable, Hashable

import peewee


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


class _Constant:
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def param(name: str) -> peewee.Value:
    """A named slot in a compiled statement (no conversion is applied to its value)."""
    return peewee.Value(_Marker(name), converter=False)


class Statements:
    """A per-database cache of compiled statements, keyed by what the caller names."""

    def __init__(self):
        # Threads may race to compile the same statement: both get the same SQL, and
        # a dict assignment is atomic, so no lock is needed.
        self._compiled: dict[Hashable, tuple[str, list]] = {}

    def _get(self, key: Hashable, build: Callable[[], peewee.Query]) -> tuple[str, list]:
        compiled = self._compiled.get(key)
        if compiled is None:
            sql, params = build().sql()
            slots = [p.name if isinstance(p, _Marker) else _Constant(p) for p in params]
            compiled = self._compiled[key] = (sql, slots)
        return compiled

    @staticmethod
    def _values(slots: list, values: dict) -> list:
        return [values[s] if isinstance(s, str) else s.value for s in slots]

    def execute(self, db: peewee.Database, key: Hashable, build: Callable[[], peewee.Query], /, **values):
        """Run a write; returns the driver's cursor (rowcount tells how many rows changed)."""
        sql, slots = self._get(key, build)
        return db.execute_sql(sql, self._values(slots, values))

    def rows(self, db: peewee.Database, key: Hashable, build: Callable[[], peewee.Query], /,
             **values) -> list[tuple]:
        """Run a SELECT; returns its rows as tuples, values as the driver gives them."""
        sql, slots = self._get(key, build)
        return db.execute_sql(sql, self._values(slots, values)).fetchall()

    def execute_many(self, db: peewee.Database, key: Hashable, build: Callable[[], peewee.Query],
                     rows: list[dict]) -> None:
        """Run one write once per dict of values (the driver's executemany)."""
        if not rows:
            return
        sql, slots = self._get(key, build)
        cursor = db.cursor()
        try:
            cursor.executemany(sql, [self._values(slots, values) for values in rows])
        finally:
            cursor.close()

    def select(self, model: type[peewee.Model], key: Hashable, build: Callable[[], peewee.Query], /,
               **values) -> list:
        """Run a SELECT of whole model rows; returns model instances."""
        sql, slots = self._get(key, build)
        return list(model.raw(sql, *self._values(slots, values)))
