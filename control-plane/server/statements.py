"""peewee queries compiled to SQL once per process, then run many times with new values.

Building a query's SQL was about 60% of the scheduler's CPU for a job's trip, far
more than SQLite spent running it; so the hot statements are ordinary peewee
queries with `param("name")` markers, compiled by the database's own dialect and
run with `execute_sql`, their rows built here from the compiled column list
(peewee's `Model.raw` works the columns out again every time). Values go to the
driver as they are: convert them as the column would (`field.db_value`) where that
matters (JSON fields).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import partial

import peewee

from corral.server.backends.lookup import backend_of


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


# Rows per compiled multi-row INSERT (well under every database's limit of bound parameters).
INSERT_ROWS = 100
# psycopg keeps the parse of a statement only up to this many parameters.
PSYCOPG_CACHED_PARAMS = 50
# Compiled statements kept per cache, the oldest dropped first: an insert is compiled
# per set of columns its rows fill, and requests choose which optional ones they fill.
MAX_STATEMENTS = 1024


def _remember(cache: dict, key: Hashable, value):
    """cache[key] = value, keeping at most MAX_STATEMENTS entries; returns value."""
    if len(cache) >= MAX_STATEMENTS:
        try:
            cache.pop(next(iter(cache)), None)
        except (StopIteration, RuntimeError):  # emptied or changed by another thread meanwhile
            pass
    cache[key] = value
    return value


@dataclass(frozen=True)
class Child:
    """A row to insert with each row insert_rows inserts: `model`'s row whose field
    `parent` takes the new row's `returning` value and whose other columns are
    `values`, the same for every row (as the columns store them; None is NULL).
    The parent rows and their children are written together or not at all."""
    model: type[peewee.Model]
    parent: str
    values: dict


class Statements:
    """A per-database cache of compiled statements, keyed by what the caller names."""

    def __init__(self):
        # Threads may race to compile the same statement: both get the same SQL, and
        # a dict assignment is atomic, so no lock is needed.
        self._compiled: dict[Hashable, tuple[str, list]] = {}
        # Statements written here rather than by peewee (PostgreSQL's inserts, and
        # update_rows on each backend): per key and shape, the SQL and its slots.
        self._written: dict[Hashable, tuple[str, list]] = {}
        # Per compiled SELECT of model rows: (field name, converter or None) per column.
        self._columns: dict[Hashable, list[tuple[str, Callable | None]]] = {}

    def _get(self, key: Hashable, build: Callable[[], peewee.Query]) -> tuple[str, list]:
        compiled = self._compiled.get(key)
        if compiled is None:
            sql, params = build().sql()
            slots = [p.name if isinstance(p, _Marker) else _Constant(p) for p in params]
            compiled = _remember(self._compiled, key, (sql, slots))
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

    def insert_rows(self, db: peewee.Database, key: Hashable, model: type[peewee.Model], rows: list[dict],
                    returning: peewee.Field | None = None, skip_duplicates: bool = False,
                    child: Child | None = None) -> list[tuple]:
        """Insert rows (dicts of field name to the value as the column stores it; a
        name a row lacks is NULL there); returns the `returning` column of the
        inserted rows ([] without it). `skip_duplicates`: a row that breaks a unique
        constraint is left out (ON CONFLICT DO NOTHING). `child`: a row of another
        table for each row inserted (needs `returning`).

        On PostgreSQL the rows and their children are one statement (the insert in
        a WITH, the children selected from what it returned), atomic without a
        transaction around it: a single submit is that one statement and no BEGIN
        and COMMIT, two round trips that cost the scheduler as much CPU as the
        statement. On SQLite they are two statements, in a transaction of their own
        unless the caller runs one.

        A column that is None in every row is left out of the statement: it is NULL
        all the same (no column of Corral's has a default in the database; peewee's
        defaults are the callers' values), and the NULLs of a job's unset fields were
        most of the work (several times the insert of the other columns alone).

        Rows that need more than 50 parameters go, on PostgreSQL, as one statement
        whatever their number: each column is one array parameter, unnested (psycopg
        parses a statement of more than 50 parameters again on every run, which was
        most of a batch submit's CPU; fewer are cheaper as plain parameters, since
        psycopg dumps arrays in Python). Otherwise multi-row INSERTs of up to
        INSERT_ROWS rows, each size compiled once. Never the driver's executemany: psycopg 3's ends with a flush that
        leaves the session without its idle-in-transaction timeout, so a replica
        stopped right after one would keep its locks (the placement lock) until it
        runs again."""
        if not rows:
            return []
        assert child is None or returning is not None, "a child row takes the new row's returned value"
        names = list(dict.fromkeys(name for row in rows for name, value in row.items() if value is not None)) \
            or list(rows[0])
        key = (key, *names)
        if backend_of(db).arrays:
            return self._insert_postgres(db, key, model, rows, names, returning, skip_duplicates, child)
        if child is None:
            return self._insert_values(db, key, model, rows, names, returning, skip_duplicates)
        with contextlib.nullcontext() if db.in_transaction() else db.atomic():
            found = self._insert_values(db, key, model, rows, names, returning, skip_duplicates)
            self.insert_rows(db, (key, "child"), child.model,
                             [dict(child.values, **{child.parent: row[0]}) for row in found])
        return found

    def _insert_postgres(self, db: peewee.Database, key: tuple, model: type[peewee.Model], rows: list[dict],
                         names: list[str], returning: peewee.Field | None, skip_duplicates: bool,
                         child: Child | None) -> list[tuple]:
        child_names = [name for name, value in child.values.items() if value is not None] if child else []
        shape = child and (child.model, child.parent, *child_names)
        if len(rows) * len(names) + len(child_names) > PSYCOPG_CACHED_PARAMS:
            cache_key: tuple = ("unnest", key, shape)
            compiled = self._written.get(cache_key)
            if compiled is None:
                insert = _unnest_insert(db, model, names, returning, skip_duplicates)
                compiled = _remember(self._written, cache_key, (_with_child(db, insert, returning, child, child_names),
                                                                 []))
            params = [[row.get(name) for row in rows] for name in names]
        else:
            cache_key = ("values", key, len(rows), shape)
            compiled = self._written.get(cache_key)
            if compiled is None:
                insert, slots = self._get((key, len(rows)), partial(_values_insert, model, names, len(rows), returning,
                                                                    skip_duplicates))
                compiled = _remember(self._written, cache_key, (_with_child(db, insert, returning, child, child_names),
                                                                 slots))
            params = self._values(compiled[1], {f"{name}{i}": row.get(name)
                                                for i, row in enumerate(rows) for name in names})
        if child is not None:
            params += [child.values[name] for name in child_names]
        cursor = db.execute_sql(compiled[0], params)
        return cursor.fetchall() if returning is not None else []

    def _insert_values(self, db: peewee.Database, key: tuple, model: type[peewee.Model], rows: list[dict],
                       names: list[str], returning: peewee.Field | None, skip_duplicates: bool) -> list[tuple]:
        found: list[tuple] = []
        for start in range(0, len(rows), INSERT_ROWS):
            chunk = rows[start:start + INSERT_ROWS]
            values = {f"{name}{i}": row.get(name) for i, row in enumerate(chunk) for name in names}
            cursor = self.execute(db, (key, len(chunk)), partial(_values_insert, model, names, len(chunk), returning,
                                                                 skip_duplicates), **values)
            if returning is not None:
                found += cursor.fetchall()
        return found

    def update_rows(self, db: peewee.Database, key: Hashable, model: type[peewee.Model], rows: list[dict],
                    names: list[str], constants: dict, where: dict) -> set:
        """One UPDATE of several rows, each with values of its own: every row is a dict of
        the primary key and `names` (values as the columns store them); `constants`
        (field → value) are set in every row; only rows whose fields equal `where`
        (field → value) change. Returns the primary keys of the rows changed.

        PostgreSQL joins the rows as arrays (`FROM unnest(…)`, one parameter per
        column whatever their number), SQLite as a `WITH … AS (VALUES …)` table
        (`UPDATE … FROM`, SQLite 3.33): one statement instead of one per row."""
        if not rows:
            return set()
        pk = _primary_key(model)
        arrays = backend_of(db).arrays
        statement_key = ("update rows", key, tuple(names), tuple(constants), tuple(where),
                         0 if arrays else len(rows))
        compiled = self._written.get(statement_key)
        if compiled is None:
            compiled = _remember(self._written, statement_key,
                                 (_update_from(db, model, names, list(constants), list(where), len(rows)), []))
        columns = [pk.name, *names]
        if arrays:
            params = [list(constants.values()), [[row[name] for row in rows] for name in columns], list(where.values())]
        else:
            params = [[row[name] for row in rows for name in columns], list(constants.values()),
                      list(where.values())]
        cursor = db.execute_sql(compiled[0], [value for part in params for value in part])
        return {row[0] for row in cursor.fetchall()}

    def select(self, model: type[peewee.Model], key: Hashable, build: Callable[[], peewee.Query], /,
               **values) -> list:
        """Run a SELECT of model columns; returns model instances (the columns not
        selected are absent, as with peewee's own queries)."""
        sql, slots = self._get(key, build)
        cursor = model._meta.database.execute_sql(sql, self._values(slots, values))
        columns = self._columns.get(key)
        if columns is None:
            columns = _remember(self._columns, key, [_converter(model, d[0]) for d in cursor.description])
        rows = []
        for row in cursor.fetchall():
            instance = model(__no_default__=1)
            instance.__data__ = {name: convert(value) if convert is not None and value is not None else value
                                 for (name, convert), value in zip(columns, row)}
            rows.append(instance)
        return rows


def _values_insert(model: type[peewee.Model], names: list[str], size: int, returning: peewee.Field | None,
                   skip_duplicates: bool) -> peewee.Query:
    """INSERT ... VALUES of `size` rows, each column a param() slot named column + row number."""
    query = model.insert_many([{name: param(f"{name}{i}") for name in names} for i in range(size)])
    if skip_duplicates:
        query = query.on_conflict_ignore()
    return query.returning(returning) if returning is not None else query


def _with_child(db: peewee.Database, sql: str, returning: peewee.Field | None, child: Child | None,
                names: list[str]) -> str:
    """`sql` (an INSERT ... RETURNING) and the child rows of what it inserted, as one
    PostgreSQL statement that returns the children's parent column: the same values.
    The child's values (`names`) are parameters after the insert's."""
    if child is None or returning is None:
        return sql
    fields = [child.model._meta.fields[name] for name in names]
    parent = child.model._meta.fields[child.parent]
    columns = ", ".join(f'"{field.column_name}"' for field in [parent, *fields])
    selected = ", ".join([f'"{returning.column_name}"', *(f"%s::{_column_type(db, field)}" for field in fields)])
    return (f'WITH "inserted" AS ({sql}) INSERT INTO "{child.model._meta.table_name}" ({columns}) '
            f'SELECT {selected} FROM "inserted" RETURNING "{parent.column_name}"')


def _primary_key(model: type[peewee.Model]) -> peewee.Field:
    pk = model._meta.primary_key
    assert isinstance(pk, peewee.Field), f"{model.__name__} has no single-column primary key"
    return pk


def _update_from(db: peewee.Database, model: type[peewee.Model], names: list[str], constants: list[str],
                 where: list[str], size: int) -> str:
    """The SQL of Statements.update_rows: parameters are the constants, the rows (one
    array per column on PostgreSQL, `size` rows of values on SQLite, before the
    constants there) and the `where` values, in that order."""
    fields = model._meta.fields
    table = f'"{model._meta.table_name}"'
    pk = _primary_key(model)
    columns = [pk, *(fields[name] for name in names)]
    column_list = ", ".join(f'"{field.column_name}"' for field in columns)
    sets = ", ".join([*(f'"{fields[name].column_name}" = {db.param}' for name in constants),
                      *(f'"{fields[name].column_name}" = "rows"."{fields[name].column_name}"' for name in names)])
    conditions = " AND ".join([f'{table}."{pk.column_name}" = "rows"."{pk.column_name}"',
                               *(f'{table}."{fields[name].column_name}" = {db.param}' for name in where)])
    if backend_of(db).arrays:
        arrays = ", ".join(f"%s::{_column_type(db, field)}[]" for field in columns)
        return (f'UPDATE {table} SET {sets} FROM unnest({arrays}) AS "rows"({column_list}) '
                f'WHERE {conditions} RETURNING {table}."{pk.column_name}"')
    # SQLite's RETURNING names only the updated table's columns, unqualified.
    row = "(" + ", ".join([db.param] * len(columns)) + ")"
    return (f'WITH "rows"({column_list}) AS (VALUES {", ".join([row] * size)}) '
            f'UPDATE {table} SET {sets} FROM "rows" WHERE {conditions} RETURNING "{pk.column_name}"')


def _unnest_insert(db: peewee.Database, model: type[peewee.Model], names: list[str],
                   returning: peewee.Field | None, skip_duplicates: bool) -> str:
    """INSERT ... SELECT * FROM unnest(%s::type[], ...): one array parameter per column."""
    fields = [model._meta.fields[name] for name in names]
    arrays = ", ".join(f"%s::{_column_type(db, field)}[]" for field in fields)
    columns = ", ".join(f'"{field.column_name}"' for field in fields)
    sql = f'INSERT INTO "{model._meta.table_name}" ({columns}) SELECT * FROM unnest({arrays})'

    if skip_duplicates:
        sql += " ON CONFLICT DO NOTHING"
    if returning is not None:
        sql += f' RETURNING "{returning.column_name}"'
    return sql


# PostgreSQL's type of each kind of peewee field Corral's tables use.
POSTGRES_TYPES = {"INT": "integer", "AUTO": "integer", "BIGINT": "bigint", "BIGAUTO": "bigint",
                  "VARCHAR": "varchar", "TEXT": "text", "BOOL": "boolean", "DOUBLE": "double precision",
                  "FLOAT": "real"}


def _column_type(db: peewee.Database, field: peewee.Field) -> str:
    if isinstance(field, peewee.ForeignKeyField):
        field = field.rel_field
    return POSTGRES_TYPES[field.field_type]


def _converter(model: type[peewee.Model], column: str) -> tuple[str, Callable | None]:
    """The field name of a selected column and how its values become Python values."""
    field = model._meta.columns.get(column) or model._meta.fields.get(column)
    if field is None:
        return column, None
    if isinstance(field, peewee.ForeignKeyField):
        return field.name, field.rel_field.python_value  # the id, not the related row
    return field.name, field.python_value


class ValueList:
    """A list of values (ids, node names) as the slots of one compiled statement:
    `= ANY(array)` on PostgreSQL (one parameter whatever the length; psycopg
    re-parses a statement of more than 50 parameters on every run), IN (...) on
    SQLite with the list padded to a power of two by repeating its last value (a
    repeat in IN changes nothing), so a few compiled sizes serve every length. Put
    `size` in the statement's key."""

    def __init__(self, db: peewee.Database, name: str, ids: list):
        assert ids, "an empty list selects nothing: the caller skips the statement"
        self.name = name
        self.array = backend_of(db).arrays
        self.values: dict[str, object]
        if self.array:
            self.size = 0
            self.values = {name: list(ids)}
        else:
            self.size = 1 << (len(ids) - 1).bit_length()
            self.values = {f"{name}{i}": ids[min(i, len(ids) - 1)] for i in range(self.size)}

    def matches(self, field: peewee.Field) -> peewee.Expression:
        if self.array:
            return field == peewee.fn.ANY(param(self.name))
        return field.in_([param(f"{self.name}{i}") for i in range(self.size)])
