"""Scheduling for real clusters: what jobs ask of nodes and of each other.

Jobs get a priority and their place in the queue (`queue_at`, placement's
order: the time a job became eligible, moved earlier by its priority), a time
before which they are not placed (`run_at`), constraints on node labels and a
pool, the array and concurrency key they belong to, the memory and CPU they
reserve on their node while placed or running, the count of their unmet
dependencies and what to do when one can no longer be met, whether others wait
on them, and the reason
placement last gave for not placing them. Three tables: job_dependency,
job_array and concurrency_limit. Nodes get their labels, their agent's default
limits and system reserve; node leases, what the agent last said it uses.

The columns that may not be null have defaults in the database too, so that
servers of the previous release, which do not name them, keep inserting jobs
and nodes during a rolling upgrade (their jobs queue at 0: first).

The background pass wakes at the earliest time a waiting job comes due: an index
on next_attempt_at finds it. Placement's index becomes (status, node_id, queue_at, id): the first waiting
jobs in queue order, read up to a limit; it replaces (status, node_id, id),
which the claims of a node (now in queue order too) no longer read. Existing
jobs queue as of their creation, at the default priority.
"""
import peewee
from peewee import SQL

NEW_JOB_INDEX = ("status", "node_id", "queue_at", "id")
OLD_JOB_INDEX = ("status", "node_id", "id")

JOB_COLUMNS = {
    "priority": peewee.IntegerField(default=50, constraints=[SQL("DEFAULT 50")]),
    "queue_at": peewee.DoubleField(default=0.0, constraints=[SQL("DEFAULT 0")]),
    "run_at": peewee.DoubleField(null=True),
    "constraints": peewee.TextField(null=True),
    "pool": peewee.CharField(max_length=128, null=True),
    "array_id": peewee.BigIntegerField(null=True),
    "array_index": peewee.IntegerField(null=True),
    "concurrency_key": peewee.CharField(max_length=128, null=True),
    "reserved_memory_mb": peewee.IntegerField(null=True),
    "reserved_cpu_percent": peewee.IntegerField(null=True),
    "dependencies_left": peewee.IntegerField(default=0, constraints=[SQL("DEFAULT 0")]),
    "has_dependents": peewee.BooleanField(default=False, constraints=[SQL("DEFAULT FALSE")]),
    "on_dependency_failure": peewee.CharField(max_length=8, default="cancel", constraints=[SQL("DEFAULT 'cancel'")]),
    "pending_reason": peewee.TextField(null=True),
    "pending_code": peewee.CharField(max_length=32, null=True),
}
NODE_COLUMNS = {
    "labels": peewee.TextField(default="{}", constraints=[SQL("DEFAULT '{}'")]),
    "default_limits": peewee.TextField(null=True),
    "reserve_memory_mb": peewee.IntegerField(default=0, constraints=[SQL("DEFAULT 0")]),
    "reserve_cpu_percent": peewee.IntegerField(default=0, constraints=[SQL("DEFAULT 0")]),
}
LEASE_COLUMNS = {
    "used_memory_mb": peewee.IntegerField(null=True),
    "used_cpu_percent": peewee.IntegerField(null=True),
}


class JobDependency(peewee.Model):
    id = peewee.BigAutoField()
    job_id = peewee.BigIntegerField(index=True)         # the job that waits
    depends_on = peewee.BigIntegerField(index=True)     # the job it waits for
    condition = peewee.CharField(max_length=16)         # done, failed or finished
    state = peewee.CharField(max_length=16, default="waiting")  # waiting, met or unmeetable

    class Meta:
        table_name = "job_dependency"


class JobArray(peewee.Model):
    id = peewee.BigAutoField()
    count = peewee.IntegerField()
    parallel = peewee.IntegerField()
    created_at = peewee.DoubleField()

    class Meta:
        table_name = "job_array"


class ConcurrencyLimit(peewee.Model):
    key = peewee.CharField(primary_key=True, max_length=128)
    limit = peewee.IntegerField()

    class Meta:
        table_name = "concurrency_limit"


def _add(migrator, db, table: str, columns: dict) -> None:
    have = {column.name for column in db.get_columns(table)}
    migrator.migrate(*[migrator.add_column(table, name, field) for name, field in columns.items()
                       if name not in have])


def up(migrator, db):
    _add(migrator, db, "job", JOB_COLUMNS)
    _add(migrator, db, "node", NODE_COLUMNS)
    _add(migrator, db, "node_lease", LEASE_COLUMNS)
    db.execute_sql("UPDATE job SET queue_at = created_at")
    indexes = {tuple(index.columns): index.name for index in db.get_indexes("job")}
    steps = []
    if NEW_JOB_INDEX not in indexes:
        steps.append(migrator.add_index("job", NEW_JOB_INDEX, False))
    for columns in (("array_id",), ("concurrency_key",), ("next_attempt_at",)):
        if columns not in indexes:
            steps.append(migrator.add_index("job", columns, False))
    if OLD_JOB_INDEX in indexes:
        steps.append(migrator.drop_index("job", indexes[OLD_JOB_INDEX]))
    migrator.migrate(*steps)
    models = [JobDependency, JobArray, ConcurrencyLimit]
    db.bind(models)
    db.create_tables(models, safe=True)
