"""`node.drain_seq`: the number of the operator's last drain or undrain of the node
through the scheduler (the `node_drains` counter), so that a node list fetched from
the registry before that drain cannot undo it (Nodes.sync_nodes)."""
import peewee


def up(migrator, db):
    if "drain_seq" not in {column.name for column in db.get_columns("node")}:
        migrator.migrate(migrator.add_column("node", "drain_seq", peewee.BigIntegerField(null=True)))
