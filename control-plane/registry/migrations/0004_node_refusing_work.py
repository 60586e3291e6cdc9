"""`node.refusing_work`: why a node's agent takes no new work now (short of disk
space), as its heartbeats say. A nullable column: servers of the previous release
do not name it and keep working (their nodes take work)."""
import peewee


def up(migrator, db):
    if "refusing_work" not in {column.name for column in db.get_columns("node")}:
        migrator.migrate(migrator.add_column("node", "refusing_work", peewee.TextField(null=True)))
