"""`node.gpus` and `node.resources`: a node's GPUs (a list of {index, uuid, model,
memory_mb}) and countable resources ({name: count}), as its agent registers them
(JSON text; null: none). Nullable columns: servers of the previous release do not
name them and keep working (their nodes have none)."""
import peewee

NODE_COLUMNS = {
    "gpus": peewee.TextField(null=True),
    "resources": peewee.TextField(null=True),
}


def up(migrator, db):
    have = {column.name for column in db.get_columns("node")}
    migrator.migrate(*[migrator.add_column("node", name, field) for name, field in NODE_COLUMNS.items()
                       if name not in have])
