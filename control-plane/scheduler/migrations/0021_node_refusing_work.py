"""`node.refusing_work`: why a node's agent takes no new work now (short of disk
space), copied from the registry's node list; placement treats such a node like a
drained one. A nullable column: servers of the previous release do not name it."""
import peewee


def up(migrator, db):
    if "refusing_work" not in {column.name for column in db.get_columns("node")}:
        migrator.migrate(migrator.add_column("node", "refusing_work", peewee.TextField(null=True)))
