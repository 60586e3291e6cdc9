"""The registry's tables as they were when versioned migrations began.

On a fresh database this makes every table. On a database an earlier Corral
made (the tables, no history) it adds the nullable column that releases made
before then added (the service's attempt), and makes whatever table or index
is missing, so both end at the same schema with every row kept.

Frozen copies, not the live models: this step must make the same tables in
every later release. (JSON columns are TEXT: the live JSONField is a TextField.)
Class names matter as much as table names: peewee names indexes after them.
"""
import peewee

from corral.server.migrations import create_or_complete

# Nullable columns added to tables before migrations began, which a database of an
# earlier release may lack.
ADDED_COLUMNS = {"service": ("attempt",)}


class Node(peewee.Model):
    node_id = peewee.CharField(primary_key=True, max_length=128)
    address = peewee.CharField(max_length=255)
    kind = peewee.CharField(max_length=32, default="compute", index=True)
    slots = peewee.IntegerField(default=1)
    cpus = peewee.IntegerField(null=True)
    memory_mb = peewee.IntegerField(null=True)
    max_memory_mb = peewee.IntegerField(null=True)
    max_cpu_percent = peewee.IntegerField(null=True)
    labels = peewee.TextField(default="{}")
    registered_at = peewee.DoubleField()
    last_heartbeat = peewee.DoubleField(index=True)
    running = peewee.IntegerField(null=True)
    drained = peewee.BooleanField(default=False)

    class Meta:
        table_name = "node"


class Service(peewee.Model):
    job_id = peewee.CharField(primary_key=True, max_length=64)
    name = peewee.CharField(max_length=255, index=True)
    node_id = peewee.CharField(max_length=128, index=True)
    address = peewee.CharField(max_length=255)
    port = peewee.IntegerField()
    attempt = peewee.IntegerField(null=True)
    healthy = peewee.BooleanField(null=True)
    checked_at = peewee.DoubleField(null=True)
    registered_at = peewee.DoubleField()

    class Meta:
        table_name = "service"


MODELS = [Node, Service]


def up(migrator, db):
    create_or_complete(db, migrator, MODELS, ADDED_COLUMNS)
