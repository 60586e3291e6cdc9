"""shared/statements.py: compiled inserts and selects on each backend."""
import peewee
import pytest

from corral.shared import db as dbmod
from corral.shared import statements
from corral.shared.statements import Statements, param


def bound(db):
    class Item(peewee.Model):
        name = peewee.CharField()
        size = peewee.IntegerField(null=True)
        note = peewee.TextField(null=True)
        flag = peewee.BooleanField(null=True)

        class Meta:
            database = db
            table_name = "item"
    return Item


@pytest.fixture
def item(database_url):
    db = dbmod.open_database(database_url, service="statements")
    with db.connection_context():
        if dbmod.is_postgres(database_url):
            db.execute_sql('CREATE SCHEMA IF NOT EXISTS "corral_statements"')
        model = bound(db)
        db.create_tables([model])
        yield model
    dbmod.close_idle(db)


@pytest.mark.parametrize("count", [1, 7, 250])  # one row; a few; past a chunk and past 50 parameters
def test_inserted_rows_read_back_as_given_with_unset_columns_null(item, count):
    sql = Statements()
    rows = [{"name": f"n{i}", "size": i if i % 2 else None, "note": None, "flag": None} for i in range(count)]
    ids = sql.insert_rows(item._meta.database, "items", item, rows, returning=item.id)
    assert len(ids) == count
    read = sql.select(item, "all", lambda: item.select().order_by(item.id))
    assert [(r.name, r.size, r.note, r.flag) for r in read] == [(r["name"], r["size"], None, None) for r in rows]


def test_a_column_set_in_some_rows_only_is_kept(item):
    """And a name a row lacks is NULL in that row."""
    sql = Statements()
    rows = [{"name": "a", "note": None, "flag": True, "size": None}, {"name": "b", "note": "x"}]
    sql.insert_rows(item._meta.database, "items", item, rows)
    assert [(r.name, r.note, r.flag) for r in item.select().order_by(item.id)] == [("a", None, True), ("b", "x", None)]


def test_the_compiled_statements_are_bounded(monkeypatch, item):
    monkeypatch.setattr(statements, "MAX_STATEMENTS", 5)
    sql = Statements()
    for n in range(12):
        assert sql.rows(item._meta.database, ("count above", n),
                        lambda n=n: item.select(peewee.fn.COUNT(item.id)).where(item.id > param("above")),
                        above=n) == [(0,)]
    assert len(sql._compiled) == 5
    assert ("count above", 11) in sql._compiled  # the newest stay
