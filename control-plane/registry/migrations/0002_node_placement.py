"""What placement needs of a node beyond its size, as its agent says: the limits it
gives jobs that ask for none (`default_limits`, JSON text; null: not said) and what
it keeps for the system (`reserved_memory_mb`, `reserved_cpu_percent`).

Columns only. The reserves may not be null and have a default in the database too,
so that servers of the previous release, which do not name them, keep inserting
nodes during a rolling upgrade (nothing reserved).
"""
import peewee
from peewee import SQL

NODE_COLUMNS = {
    "default_limits": peewee.TextField(null=True),
    "reserved_memory_mb": peewee.IntegerField(default=0, constraints=[SQL("DEFAULT 0")]),
    "reserved_cpu_percent": peewee.IntegerField(default=0, constraints=[SQL("DEFAULT 0")]),
}


def up(migrator, db):
    have = {column.name for column in db.get_columns("node")}
    migrator.migrate(*[migrator.add_column("node", name, field) for name, field in NODE_COLUMNS.items()
                       if name not in have])
