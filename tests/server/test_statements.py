"""control-plane/server/statements.py: compiled inserts and selects on each backend."""
import peewee
import pytest

from corral.server import db as dbmod
from corral.server import statements
from corral.server.statements import Statements, param


def bound(db):
    class Item(peewee.Model):
        name = peewee.CharField(unique=True)
        size = peewee.IntegerField(null=True)
        note = peewee.TextField(null=True)
        flag = peewee.BooleanField(null=True)

        class Meta:
            database = db
            table_name = "item"

    class Tag(peewee.Model):
        item = peewee.ForeignKeyField(Item, on_delete="CASCADE")
        at = peewee.DoubleField()
        label = peewee.CharField(max_length=8)  # longer labels break the insert (PostgreSQL)
        extra = peewee.TextField(null=True)

        class Meta:
            database = db
            table_name = "tag"
    return Item, Tag


@pytest.fixture
def models(database_url):
    db = dbmod.open_database(database_url, service="statements")
    with db.connection_context():
        if dbmod.is_postgres(database_url):
            db.execute_sql('CREATE SCHEMA IF NOT EXISTS "corral_statements"')
        item, tag = bound(db)
        db.create_tables([item, tag])
        yield item, tag
    dbmod.close_idle(db)


@pytest.fixture
def item(models):
    return models[0]


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


@pytest.mark.parametrize("count", [1, 7, 250])
def test_child_rows_are_written_with_the_rows_they_belong_to(models, count):
    item, tag = models
    sql = Statements()
    rows = [{"name": f"n{i}", "size": i} for i in range(count)]
    child = statements.Child(tag, "item", {"at": 1.5, "label": "new", "extra": None})
    ids = [row[0] for row in sql.insert_rows(item._meta.database, "items", item, rows, returning=item.id,
                                              child=child)]
    assert sorted(ids) == sorted(i.id for i in item.select())
    assert sorted((t.item_id, t.at, t.label, t.extra) for t in tag.select()) == [(i, 1.5, "new", None)
                                                                                   for i in sorted(ids)]


def test_a_skipped_duplicate_gets_no_child_row(models):
    item, tag = models
    sql = Statements()
    child = statements.Child(tag, "item", {"at": 1.0, "label": "new"})
    first = sql.insert_rows(item._meta.database, "items", item, [{"name": "a"}], returning=item.id,
                            skip_duplicates=True, child=child)
    again = sql.insert_rows(item._meta.database, "items", item, [{"name": "a"}], returning=item.id,
                            skip_duplicates=True, child=child)
    assert len(first) == 1 and again == []
    assert [t.item_id for t in tag.select()] == [first[0][0]]


@pytest.mark.parametrize("count", [1, 250])
def test_rows_whose_children_cannot_be_written_are_not_written_either(models, count, database_url):
    item, tag = models
    sql = Statements()
    db = item._meta.database
    # A child that breaks its table's constraint: NOT NULL on SQLite, the label's length on PostgreSQL.
    bad = {"at": 1.0, "label": "far-too-long"} if dbmod.is_postgres(database_url) else {"at": None, "label": "x"}
    with pytest.raises(peewee.IntegrityError if not dbmod.is_postgres(database_url) else peewee.DataError):
        sql.insert_rows(db, "items", item, [{"name": f"n{i}"} for i in range(count)], returning=item.id,
                        child=statements.Child(tag, "item", bad))
    assert item.select().count() == 0 and tag.select().count() == 0


@pytest.mark.parametrize("count", [1, 3, 120])
def test_rows_updated_in_one_statement_each_get_their_own_values(item, count):
    sql = Statements()
    db = item._meta.database
    ids = [row[0] for row in sql.insert_rows(db, "items", item, [{"name": f"n{i}", "size": 0} for i in range(count)],
                                             returning=item.id)]
    ids.sort()
    # Every other row no longer matches the condition: it is neither changed nor returned.
    item.update(size=1).where(item.id.in_(ids[1::2])).execute()
    rows = [{"id": row_id, "note": f"note {row_id}" if row_id % 3 else None, "size": row_id * 10} for row_id in ids]
    changed = sql.update_rows(db, "items", item, rows, ["note", "size"], {"flag": True}, {"size": 0})
    assert changed == set(ids[0::2])
    for read in item.select().order_by(item.id):
        if read.id in changed:
            assert (read.note, read.size, read.flag) == (f"note {read.id}" if read.id % 3 else None, read.id * 10, True)
        else:
            assert (read.note, read.size, read.flag) == (None, 1, None)
