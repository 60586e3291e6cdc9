"""Registry tables. Health is not stored: it is derived from `last_heartbeat`."""
import peewee

from corral.server.db import JSONField
from corral.server.revocations import credential_model

database = peewee.DatabaseProxy()


class BaseModel(peewee.Model):
    class Meta:
        database = database


class Node(BaseModel):
    node_id = peewee.CharField(primary_key=True, max_length=128)
    address = peewee.CharField(max_length=255)
    kind = peewee.CharField(max_length=32, default="compute", index=True)
    slots = peewee.IntegerField(default=1)
    cpus = peewee.IntegerField(null=True)
    memory_mb = peewee.IntegerField(null=True)
    max_memory_mb = peewee.IntegerField(null=True)     # the largest limits a job may ask for here
    max_cpu_percent = peewee.IntegerField(null=True)
    labels = JSONField(default=dict)
    # What placement needs beyond the node's size, as its agent says: the limits of jobs
    # that ask for none ({"run": {...}, "service": {...}}; null: not said) and the
    # system's reserve.
    default_limits = JSONField(null=True)
    reserved_memory_mb = peewee.IntegerField(default=0)
    reserved_cpu_percent = peewee.IntegerField(default=0)
    registered_at = peewee.DoubleField()
    last_heartbeat = peewee.DoubleField(index=True)
    running = peewee.IntegerField(null=True)
    drained = peewee.BooleanField(default=False)  # an operator's choice; survives re-registration
    # Why its agent takes no new work now (short of disk space), as its last heartbeat
    # or registration said; null: it takes work.
    refusing_work = peewee.TextField(null=True)
    # Its GPUs ([{"index", "uuid", "model", "memory_mb"}], MIG instances one each) and
    # countable resources ({name: count}), as its registration said; null: none.
    gpus = JSONField(null=True)
    resources = JSONField(null=True)

    class Meta:
        table_name = "node"


class Service(BaseModel):
    job_id = peewee.CharField(primary_key=True, max_length=64)
    name = peewee.CharField(max_length=255, index=True)
    node_id = peewee.CharField(max_length=128, index=True)
    address = peewee.CharField(max_length=255)
    port = peewee.IntegerField()
    # The job's attempt the record belongs to (null: recorded without tokens, or by an
    # older agent); a record of a newer attempt on another node replaces it.
    attempt = peewee.IntegerField(null=True)
    healthy = peewee.BooleanField(null=True)
    checked_at = peewee.DoubleField(null=True)
    registered_at = peewee.DoubleField()

    class Meta:
        table_name = "service"


# The lowest generation of each node's credential still accepted (control-plane/server/revocations.py).
NodeCredential = credential_model(database)

MODELS = [Node, Service, NodeCredential]
