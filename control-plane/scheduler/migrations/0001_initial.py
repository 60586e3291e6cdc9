"""The scheduler's tables as they were when versioned migrations began.

On a fresh database this makes every table. On a database an earlier Corral
made (the tables, no history) it adds the nullable columns that releases made
before then added (the job's max_processes and private_tmp), and makes whatever
table or index is missing, so both end at the same schema with every row kept.

Frozen copies, not the live models: this step must make the same tables in
every later release. (JSON columns are TEXT: the live JSONField is a TextField.)
Class names matter as much as table names: peewee names indexes after them.
"""
import peewee

from corral.server.migrations import create_or_complete

STATUS_CHECK = "status IN ('pending', 'running', 'done', 'failed', 'cancelled')"

# Nullable columns added to tables before migrations began, which a database of an
# earlier release may lack.
ADDED_COLUMNS = {"job": ("max_processes", "private_tmp")}


class Job(peewee.Model):
    id = peewee.BigAutoField()  # 64-bit on PostgreSQL, as SQLite's INTEGER is
    command = peewee.TextField(null=True)
    deploy_url = peewee.TextField(null=True)
    job_type = peewee.CharField(max_length=16, default="run")
    port = peewee.IntegerField(null=True)
    env_vars = peewee.TextField(default="{}")
    instance_id = peewee.CharField(max_length=128, null=True)
    name = peewee.CharField(max_length=128, null=True)
    memory_mb = peewee.IntegerField(null=True)
    cpu_percent = peewee.IntegerField(null=True)
    max_processes = peewee.IntegerField(null=True)
    deploy_sha256 = peewee.CharField(max_length=64, null=True)
    health_path = peewee.CharField(max_length=1024, null=True)
    node_id = peewee.CharField(max_length=128, null=True)
    status = peewee.CharField(max_length=16, default="pending", constraints=[peewee.Check(STATUS_CHECK)])
    attempt = peewee.IntegerField(default=0)
    retry_count = peewee.IntegerField(default=0)
    max_retries = peewee.IntegerField(default=1)
    next_attempt_at = peewee.DoubleField(null=True)
    on_node_lost = peewee.CharField(max_length=16, default="requeue")
    node_losses = peewee.IntegerField(default=0)
    idempotency_key = peewee.CharField(max_length=255, null=True, unique=True)
    request_hash = peewee.CharField(max_length=64, null=True)
    exit_code = peewee.IntegerField(null=True)
    stdout = peewee.TextField(null=True)
    stderr = peewee.TextField(null=True)
    limits_enforced = peewee.BooleanField(null=True)
    limits = peewee.TextField(null=True)
    private_tmp = peewee.BooleanField(null=True)
    oom_killed = peewee.BooleanField(null=True)
    peak_memory_bytes = peewee.BigIntegerField(null=True)
    cpu_seconds = peewee.DoubleField(null=True)
    created_at = peewee.DoubleField()
    placed_at = peewee.DoubleField(null=True)
    running_at = peewee.DoubleField(null=True)
    finished_at = peewee.DoubleField(null=True)

    class Meta:
        table_name = "job"
        indexes = (
            (("status", "node_id"), False),
            (("node_id", "status"), False),
            (("finished_at",), False),
        )


class JobEvent(peewee.Model):
    id = peewee.BigAutoField()
    job = peewee.ForeignKeyField(Job, on_delete="CASCADE", index=True)
    at = peewee.DoubleField()
    from_status = peewee.CharField(max_length=16, null=True)
    to_status = peewee.CharField(max_length=16)
    attempt = peewee.IntegerField()
    node_id = peewee.CharField(max_length=128, null=True)
    reason = peewee.TextField(default="")

    class Meta:
        table_name = "job_event"


class Node(peewee.Model):
    node_id = peewee.CharField(primary_key=True, max_length=128)
    address = peewee.CharField(max_length=255)
    kind = peewee.CharField(max_length=32)
    slots = peewee.IntegerField()
    max_memory_mb = peewee.IntegerField(null=True)
    max_cpu_percent = peewee.IntegerField(null=True)
    status = peewee.CharField(max_length=16)
    drained = peewee.BooleanField(default=False)
    last_heartbeat = peewee.DoubleField(null=True)
    synced_at = peewee.DoubleField()

    class Meta:
        table_name = "node"


class NodeLease(peewee.Model):
    node_id = peewee.CharField(primary_key=True, max_length=128)
    renewed_at = peewee.DoubleField()

    class Meta:
        table_name = "node_lease"


class SchedulerState(peewee.Model):
    key = peewee.CharField(primary_key=True, max_length=64)
    value = peewee.TextField(null=True)

    class Meta:
        table_name = "scheduler_state"


class Counter(peewee.Model):
    name = peewee.CharField(primary_key=True, max_length=64)
    value = peewee.BigIntegerField(default=0)

    class Meta:
        table_name = "counter"


class OutboxEvent(peewee.Model):
    id = peewee.BigAutoField()
    event_id = peewee.CharField(max_length=128, unique=True)
    job_id = peewee.BigIntegerField()
    status = peewee.CharField(max_length=16)
    message = peewee.TextField()
    created_at = peewee.DoubleField()
    published_at = peewee.DoubleField(null=True)
    publish_attempts = peewee.IntegerField(default=0)
    last_error = peewee.TextField(null=True)

    class Meta:
        table_name = "sns_outbox"
        indexes = ((("published_at", "id"), False),)


class Lease(peewee.Model):
    """The background loops' lease (control-plane/server/leader.py)."""

    name = peewee.CharField(primary_key=True, max_length=64)
    holder = peewee.CharField(max_length=128, null=True)
    expires_at = peewee.DoubleField(default=0.0)
    token = peewee.IntegerField(default=0)

    class Meta:
        table_name = "lease"


MODELS = [Job, JobEvent, Node, NodeLease, SchedulerState, Counter, OutboxEvent, Lease]


def up(migrator, db):
    create_or_complete(db, migrator, MODELS, ADDED_COLUMNS)
