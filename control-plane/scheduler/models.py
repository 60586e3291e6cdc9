"""Scheduler tables. The database is the source of truth for jobs and nodes.

`Node` is the scheduler's copy of the registry's node list (refreshed by the
leader loop): placement reads it inside its transaction, and a registry outage
leaves it as it was, so dispatch to known nodes goes on.
"""
import peewee

from corral.server.db import JSONField
from corral.server.leader import Lease
from corral.server.revocations import credential_model
from corral.server.principals import BOOTSTRAP_ADMIN, DEFAULT_TEAM
from corral.shared.states import ALL

database = peewee.DatabaseProxy()

STATUS_CHECK = "status IN ({})".format(", ".join(f"'{s}'" for s in ALL))


class BaseModel(peewee.Model):
    class Meta:
        database = database


class Job(BaseModel):
    # Never reused: PostgreSQL's sequence never goes back, and on SQLite (which hands out
    # max(id) + 1 without AUTOINCREMENT) the retention purge keeps the newest row.
    # 64-bit on PostgreSQL (BIGSERIAL), as SQLite's INTEGER is.
    id = peewee.BigAutoField()
    command = peewee.TextField(null=True)
    deploy_url = peewee.TextField(null=True)
    job_type = peewee.CharField(max_length=16, default="run")
    port = peewee.IntegerField(null=True)
    env_vars = JSONField(default=dict)
    instance_id = peewee.CharField(max_length=128, null=True)
    name = peewee.CharField(max_length=128, null=True)
    memory_mb = peewee.IntegerField(null=True)      # requested; null: the node's default
    cpu_percent = peewee.IntegerField(null=True)    # requested; null: the node's default
    max_processes = peewee.IntegerField(null=True)  # requested pids limit; null: the node's default
    disk_mb = peewee.IntegerField(null=True)        # requested work dir limit; null: JOB_DEFAULT_DISK_MB (0012)
    deploy_sha256 = peewee.CharField(max_length=64, null=True)
    health_path = peewee.CharField(max_length=1024, null=True)
    node_id = peewee.CharField(max_length=128, null=True)
    status = peewee.CharField(max_length=16, default="pending", constraints=[peewee.Check(STATUS_CHECK)])
    attempt = peewee.IntegerField(default=0)
    retry_count = peewee.IntegerField(default=0)
    max_retries = peewee.IntegerField(default=1)
    next_attempt_at = peewee.DoubleField(null=True)   # a retry waits (backoff) until then
    on_node_lost = peewee.CharField(max_length=16, default="requeue")  # or "fail"
    node_losses = peewee.IntegerField(default=0)      # requeues because its node was lost
    idempotency_key = peewee.CharField(max_length=255, null=True, unique=True)
    request_hash = peewee.CharField(max_length=64, null=True)  # of the request the key came with
    exit_code = peewee.IntegerField(null=True)
    stdout = peewee.TextField(null=True)
    stderr = peewee.TextField(null=True)
    limits_enforced = peewee.BooleanField(null=True)  # as the node reported when it started
    limits = JSONField(null=True)                     # the limits the node applied
    private_tmp = peewee.BooleanField(null=True)      # the node gave it its own /tmp (a mount namespace)
    oom_killed = peewee.BooleanField(null=True)
    peak_memory_bytes = peewee.BigIntegerField(null=True)
    cpu_seconds = peewee.DoubleField(null=True)
    ended_by = peewee.CharField(max_length=16, null=True)  # why its last attempt ended (wire.ENDED_BY) (0012)
    created_at = peewee.DoubleField()
    placed_at = peewee.DoubleField(null=True)
    running_at = peewee.DoubleField(null=True)
    finished_at = peewee.DoubleField(null=True)
    # Scheduling (migration 0004): see placement.py and waiting.py.
    priority = peewee.IntegerField(default=50)
    queue_at = peewee.DoubleField(default=0.0)        # placement's order: placement.queue_at
    run_at = peewee.DoubleField(null=True)            # not placed before (next_attempt_at holds it too)
    constraints = JSONField(null=True)                # [[label, op, value], ...]
    pool = peewee.CharField(max_length=128, null=True)
    array_id = peewee.BigIntegerField(null=True)
    array_index = peewee.IntegerField(null=True)
    concurrency_key = peewee.CharField(max_length=128, null=True)
    reserved_memory_mb = peewee.IntegerField(null=True)    # on its node, from placement until it ends
    reserved_cpu_percent = peewee.IntegerField(null=True)
    dependencies_left = peewee.IntegerField(default=0)     # placed only at 0
    has_dependents = peewee.BooleanField(default=False)    # other jobs wait on how this one ends
    on_dependency_failure = peewee.CharField(max_length=8, default="cancel")  # or "run"
    depends_on = JSONField(null=True)                 # [[job row id, condition], ...] as asked (0005)
    schedule = peewee.CharField(max_length=128, null=True)  # the schedule whose run it is, and its slot (0006)
    slot = peewee.DoubleField(null=True)
    # Its W3C trace context (0007): its submit's span, and the request's tracestate.
    traceparent = peewee.CharField(max_length=55, null=True)
    tracestate = peewee.TextField(null=True)
    pending_reason = JSONField(null=True)             # what placement last said (waiting.Reason.as_dict)
    pending_code = peewee.CharField(max_length=32, null=True)  # its code, for GET /jobs?pending_reason=
    timeout_secs = peewee.DoubleField(null=True)      # the request's (0017); null: JOB_TIMEOUT_SECS
    # How it is warned before its timeout and stopped (0025; null: none, TERM, JOB_KILL_GRACE_SECS).
    warn_signal = peewee.CharField(max_length=8, null=True)
    warn_secs = peewee.DoubleField(null=True)
    kill_signal = peewee.CharField(max_length=8, null=True)
    kill_grace_secs = peewee.DoubleField(null=True)
    # A stop the scheduler asks of its running attempt (0025): why (wire.STOP_REASONS) and
    # from when (the drain's deadline; a preemption's now). Null: none.
    stop_reason = peewee.CharField(max_length=16, null=True)
    stop_at = peewee.DoubleField(null=True)
    preemptible = peewee.BooleanField(null=True, default=True)  # may borrow, may be preempted; null: yes (0028)
    preemptions = peewee.IntegerField(null=True, default=0)     # times its attempts were preempted (0028)
    # GPUs and other countable resources (0030): what it asks per node (null: none), and
    # the UUIDs of the devices placement reserved for it on its node (null: none; kept
    # from its last placement, so read only while it holds a slot).
    gpus = peewee.IntegerField(null=True)
    gpu_model = peewee.CharField(max_length=128, null=True)
    gpu_memory_mb = peewee.IntegerField(null=True)
    resources = JSONField(null=True)                  # {name: count}
    gpus_assigned = JSONField(null=True)              # [uuid, ...]
    # What its last attempt's devices used, as its node read them (0031; null: not read).
    peak_gpu_memory_mb = peewee.IntegerField(null=True)
    gpu_utilization_percent = peewee.DoubleField(null=True)  # the mean of the samples
    # Multi-node jobs (0032; gangs.py). The job asked for: how many nodes (null: one), and
    # since when it holds the nodes it found while it waits for the rest (null: it does not).
    # A member: its job's row id and where it runs in the gang (gangs.place_of: rank,
    # size, hosts, master address and port); null on every other job.
    nodes = peewee.IntegerField(null=True)
    gang_held_since = peewee.DoubleField(null=True)
    gang_id = peewee.BigIntegerField(null=True)
    gang = JSONField(null=True)
    team = peewee.CharField(max_length=128, default=DEFAULT_TEAM)        # whose job it is (0022)
    submitted_by = peewee.CharField(max_length=128, default=BOOTSTRAP_ADMIN)  # the user who asked for it

    class Meta:
        table_name = "job"
        indexes = (
            (("node_id", "status"), False),
            (("finished_at",), False),   # the retention purge (created on start in older databases too)
            # placement: the first unplaced in queue order; a node's claims (migration 0004)
            (("status", "node_id", "queue_at", "id"), False),
            (("instance_id",), False),   # placement: the jobs pinned to a node
            (("array_id",), False),
            (("concurrency_key",), False),
            (("next_attempt_at",), False),  # the background pass: the next job to come due
            (("name",), False),          # GET /jobs?name= and ?schedule= (migration 0017)
            (("schedule",), False),
            (("team", "id"), False),     # a member's job list: their teams' jobs in id order (0022)
        )


    @property
    def job_id(self) -> str:
        return f"job-{self.id}"


# A multi-node job's members (0032): partial, so that the jobs of one node, which are not
# in it, pay no upkeep for it.
GANG_MEMBERS = "job_gang_members"
Job.add_index(Job.index(Job.gang_id, Job.attempt, name=GANG_MEMBERS, where=Job.gang_id.is_null(False)))


# Placement's turns between teams (fair share, 0027): each team's jobs waiting to be
# placed, in queue order. Partial: a job is in it only while it waits to be placed.
# Not one of the model's indexes: a cluster of one team takes no turns and would pay
# its upkeep on every submit and placement for nothing (docs/benchmarks.md measures
# it), so the first team created beside `default` makes it
# (store.accounts) and migration 0029 drops it where only `default` exists. Without it,
# the turns read the same jobs, only slower.
WAITING_BY_TEAM = "job_waiting_by_team"


def add_waiting_by_team_index(db: peewee.Database) -> None:
    """Make the index WAITING_BY_TEAM unless it exists (in the caller's transaction;
    looked up first, since PostgreSQL locks the table before IF NOT EXISTS looks)."""
    if WAITING_BY_TEAM not in {index.name for index in db.get_indexes(Job._meta.table_name)}:
        # status and node_id lead although the predicate fixes them: SQLite, without
        # statistics, otherwise prefers (status, node_id, queue_at, id), walking every
        # waiting job.
        db.execute_sql(f'CREATE INDEX IF NOT EXISTS "{WAITING_BY_TEAM}" ON "job" ("status", "node_id", "team", '
                       '"queue_at", "id") WHERE "status" = \'pending\' AND "node_id" IS NULL')


class JobEvent(BaseModel):
    """One row per status change or placement: the job's history."""

    id = peewee.BigAutoField()  # several per job: passes 2^31 first
    job = peewee.ForeignKeyField(Job, backref="events", on_delete="CASCADE", index=True)
    at = peewee.DoubleField()
    from_status = peewee.CharField(max_length=16, null=True)
    to_status = peewee.CharField(max_length=16)
    attempt = peewee.IntegerField()
    node_id = peewee.CharField(max_length=128, null=True)
    reason = peewee.TextField(default="")

    class Meta:
        table_name = "job_event"


class Node(BaseModel):
    node_id = peewee.CharField(primary_key=True, max_length=128)
    address = peewee.CharField(max_length=255)
    kind = peewee.CharField(max_length=32)
    slots = peewee.IntegerField()
    max_memory_mb = peewee.IntegerField(null=True)   # the largest limits a job may ask for there
    max_cpu_percent = peewee.IntegerField(null=True)
    status = peewee.CharField(max_length=16)
    drained = peewee.BooleanField(default=False)      # the registry's flag (status is then `drained`
                                                      # while the node is healthy), shown by GET /nodes
    drain_seq = peewee.BigIntegerField(null=True)     # the `node_drains` count of its last drain or
                                                      # undrain through the scheduler (Nodes.set_drained)
    last_heartbeat = peewee.DoubleField(null=True)   # as the registry last saw it
    refusing_work = peewee.TextField(null=True)       # why its agent takes no new work (short of disk
                                                      # space), as its last heartbeat said; null: it does
    synced_at = peewee.DoubleField()
    labels = JSONField(default=dict)
    default_limits = JSONField(null=True)             # {"run": {"memory_mb", "cpu_percent"}, "service": ...}
    reserve_memory_mb = peewee.IntegerField(default=0)  # the agent's system reserve
    reserve_cpu_percent = peewee.IntegerField(default=0)
    gpus = JSONField(null=True)                       # [{"index", "uuid", "model", "memory_mb"}] (0030)
    resources = JSONField(null=True)                  # {name: count} its agent declares (0030)

    class Meta:
        table_name = "node"


class NodeLease(BaseModel):
    """When each agent last renewed its lease here (the scheduler's own clock).

    An agent that cannot renew for HEARTBEAT_TIMEOUT_SECS stops its run jobs
    itself; the scheduler requeues them only NODE_LOST_GRACE_SECS after that.
    """

    node_id = peewee.CharField(primary_key=True, max_length=128)
    renewed_at = peewee.DoubleField()
    used_memory_mb = peewee.IntegerField(null=True)   # what its jobs use, as the agent last said
    used_cpu_percent = peewee.IntegerField(null=True)
    used_gpu_memory_mb = peewee.IntegerField(null=True)  # its GPUs' memory in use and utilisation (0031)
    used_gpu_percent = peewee.DoubleField(null=True)

    class Meta:
        table_name = "node_lease"


class SchedulerState(BaseModel):
    """Small named values shared by every worker (the round-robin cursor)."""

    key = peewee.CharField(primary_key=True, max_length=64)
    value = peewee.TextField(null=True)

    class Meta:
        table_name = "scheduler_state"


class Counter(BaseModel):
    """Running totals shared by every worker (SQS messages received, rejected, ...), read by /stats."""

    name = peewee.CharField(primary_key=True, max_length=64)
    value = peewee.BigIntegerField(default=0)

    class Meta:
        table_name = "counter"


class OutboxEvent(BaseModel):
    """A job notification waiting for (or done with) its SNS publish: the transactional outbox.

    Written in the same transaction as the job's final status change, so a
    notification exists exactly when the status change does; the SNS outbox
    loop publishes pending rows and marks them published afterwards.
    """

    id = peewee.BigAutoField()
    event_id = peewee.CharField(max_length=128, unique=True)  # stable: job-7:2:done
    job_id = peewee.BigIntegerField()
    status = peewee.CharField(max_length=16)
    message = JSONField()                                    # the notification, frozen at commit
    created_at = peewee.DoubleField()
    published_at = peewee.DoubleField(null=True)
    publish_attempts = peewee.IntegerField(default=0)
    last_error = peewee.TextField(null=True)

    class Meta:
        table_name = "sns_outbox"
        indexes = ((("published_at", "id"), False),)


class JobDependency(BaseModel):
    """A job waiting for another to end a certain way (`depends_on`, Slurm's afterok,
    afternotok, afterany)."""

    id = peewee.BigAutoField()
    job_id = peewee.BigIntegerField(index=True)        # the job that waits
    depends_on = peewee.BigIntegerField(index=True)    # the job it waits for
    condition = peewee.CharField(max_length=16)        # done, failed or finished
    state = peewee.CharField(max_length=16, default="waiting")  # waiting, met or unmeetable

    class Meta:
        table_name = "job_dependency"


class JobArray(BaseModel):
    """N jobs submitted as one, at most `parallel` of them placed or running at once."""

    id = peewee.BigAutoField()
    count = peewee.IntegerField()
    parallel = peewee.IntegerField()
    created_at = peewee.DoubleField()

    class Meta:
        table_name = "job_array"


class ConcurrencyLimit(BaseModel):
    """At most `limit` jobs with this concurrency key placed or running at once, cluster-wide."""

    key = peewee.CharField(primary_key=True, max_length=128)
    limit = peewee.IntegerField()
    team = peewee.CharField(max_length=128, default="default")  # who may change it (0023)

    class Meta:
        table_name = "concurrency_limit"


class Schedule(BaseModel):
    """A job run at every slot of a cron expression (in a zone) or an interval (slots.py)."""

    id = peewee.BigAutoField()              # immutable: the runs' idempotency keys name it
    name = peewee.CharField(max_length=128, unique=True)
    cron = peewee.CharField(max_length=256, null=True)
    interval_secs = peewee.DoubleField(null=True)
    start_at = peewee.DoubleField(null=True)  # an interval's anchor
    time_zone = peewee.CharField(max_length=64)
    job = JSONField()                       # the job template, as POST /jobs takes it
    overlap = peewee.CharField(max_length=16)
    catch_up = peewee.CharField(max_length=8)
    enabled = peewee.BooleanField()
    next_run_at = peewee.DoubleField(null=True, index=True)  # its next slot (null: disabled)
    last_job_id = peewee.BigIntegerField(null=True)          # the job of its last run (overlap)
    created_at = peewee.DoubleField()
    updated_at = peewee.DoubleField()
    team = peewee.CharField(max_length=128, default="default")        # its runs' team (0023)
    created_by = peewee.CharField(max_length=128, default="admin")    # its runs' submitter

    class Meta:
        table_name = "schedule"


class ScheduleRun(BaseModel):
    """A slot of a schedule: the job it created, or why it was skipped."""

    id = peewee.BigAutoField()
    schedule_id = peewee.BigIntegerField()
    slot = peewee.DoubleField()
    job_id = peewee.BigIntegerField(null=True)
    skipped = peewee.TextField(null=True)
    created_at = peewee.DoubleField()

    class Meta:
        table_name = "schedule_run"
        indexes = ((("schedule_id", "slot"), True),)


class StreamEvent(BaseModel):
    """What `GET /events` streams (events.py): a job's transition (written by a trigger
    on job_event, migration 0008), a node's change (the node refresh) or new output of
    an attempt. Kept EVENTS_RETENTION_SECS, apart from the jobs' own history."""

    id = peewee.BigAutoField()
    # PostgreSQL: the writing transaction's id (a column default), which tells a reader
    # which rows no open transaction can still precede (event_log.py). SQLite: null.
    tx = peewee.BigIntegerField(null=True, index=True)
    at = peewee.DoubleField()
    type = peewee.CharField(max_length=8)       # job, node or log
    job_id = peewee.BigIntegerField(null=True)  # the job's row id
    node_id = peewee.CharField(max_length=128, null=True)
    data = peewee.TextField()                   # the rest, as JSON text

    class Meta:
        table_name = "stream_event"


class StatsSample(BaseModel):
    """One sample of the charts (sampler.py, samples.py): taken `at`, counting the jobs
    that finished or started since the previous one (`since`), kept STATS_RETENTION_SECS."""

    id = peewee.BigAutoField()
    at = peewee.DoubleField(index=True)
    since = peewee.DoubleField()
    data = JSONField()                       # samples.sample(): counts, latency, nodes

    class Meta:
        table_name = "stats_sample"


class LogChunk(BaseModel):
    """A piece of an attempt's stdout or stderr as its agent shipped it (job_logs.py):
    `size` bytes from byte `start` of the stream, the chunks of a stream numbered 0, 1,
    … (`seq`) without gap or overlap; `final` on its last. The bytes are in `data`,
    or in S3 under `object_key` (CORRAL_LOG_BUCKET)."""

    id = peewee.BigAutoField()
    job_id = peewee.BigIntegerField()   # the job's row id; deleted with it (Purge.finished)
    attempt = peewee.IntegerField()
    stream = peewee.CharField(max_length=8)  # stdout or stderr
    seq = peewee.IntegerField()
    start = peewee.BigIntegerField()
    size = peewee.IntegerField()
    final = peewee.BooleanField()
    sha256 = peewee.CharField(max_length=64)  # tells a repeat from other bytes under the same seq
    data = peewee.BlobField(null=True)
    object_key = peewee.TextField(null=True)
    at = peewee.DoubleField()

    class Meta:
        table_name = "log_chunk"
        indexes = ((("job_id", "attempt", "stream", "seq"), True),)


class AuditEvent(BaseModel):
    """A state-changing request of a user (control-plane/server/audit_trail.py): who, what,
    in which team, when, from where, and the answer's status. Never a secret. Indexed for
    the time (purge, since), a user and a team; an action alone is read by a scan: every
    index is one more write on every submit."""

    id = peewee.BigAutoField()
    at = peewee.DoubleField(index=True)
    user = peewee.CharField(max_length=128)
    team = peewee.CharField(max_length=128, null=True)
    action = peewee.CharField(max_length=64)          # the route's OpenAPI operationId
    target = peewee.CharField(max_length=256, null=True)
    method = peewee.CharField(max_length=8)
    path = peewee.CharField(max_length=256)
    address = peewee.CharField(max_length=64, null=True)
    status = peewee.IntegerField()
    token_id = peewee.CharField(max_length=32, null=True)

    class Meta:
        table_name = "audit_event"
        indexes = ((("user", "id"), False), (("team", "id"), False))


class OidcSubject(BaseModel):
    """An identity provider's subject seen at least once (its first login is audited)."""

    subject = peewee.CharField(primary_key=True, max_length=255)
    user = peewee.CharField(max_length=128)
    first_seen_at = peewee.DoubleField()

    class Meta:
        table_name = "oidc_subject"


class UsageDay(BaseModel):
    """What the ended attempts of one user's jobs in one team used on one UTC day
    (store/usage.py): kept beyond the jobs' retention. Memory is the attempt's peak
    times its wall time (as Slurm's MaxRSS × elapsed), in MB-seconds."""

    day = peewee.IntegerField()                 # days since 1970-01-01, UTC
    team = peewee.CharField(max_length=128)
    user = peewee.CharField(max_length=128)
    attempts = peewee.BigIntegerField(default=0)
    cpu_seconds = peewee.DoubleField(default=0.0)
    wall_seconds = peewee.DoubleField(default=0.0)
    memory_mb_seconds = peewee.DoubleField(default=0.0)
    gpu_seconds = peewee.DoubleField(default=0.0)
    core_seconds = peewee.DoubleField(null=True, default=0.0)  # cores reserved × wall time: fair share's (0027)

    class Meta:
        table_name = "usage_day"
        primary_key = peewee.CompositeKey("day", "team", "user")


class Team(BaseModel):
    """A group of users that owns jobs (what Slurm calls an account)."""

    name = peewee.CharField(primary_key=True, max_length=128)
    created_at = peewee.DoubleField()
    max_timeout_secs = peewee.DoubleField(null=True)  # the largest timeout_secs of its jobs (0025)
    quota = JSONField(null=True)                      # quotas.Quota.as_dict(); null: none (0026)
    share = peewee.IntegerField(null=True, default=1)  # its weight in fair share; null: 1 (0027)

    class Meta:
        table_name = "team"


class User(BaseModel):
    """Someone who holds personal tokens. `cluster_role`: `admin`, `reader` or null
    (only what their teams give them); `default_team`: the team a request that names
    none acts in."""

    name = peewee.CharField(primary_key=True, max_length=128)
    cluster_role = peewee.CharField(max_length=16, null=True)
    default_team = peewee.CharField(max_length=128, null=True)
    created_at = peewee.DoubleField()

    class Meta:
        table_name = "corral_user"  # `user` is a reserved word in PostgreSQL


class Membership(BaseModel):
    """A user's place in a team: `member` or `admin`."""

    user = peewee.CharField(max_length=128)
    team = peewee.CharField(max_length=128, index=True)
    role = peewee.CharField(max_length=16)

    class Meta:
        table_name = "membership"
        primary_key = peewee.CompositeKey("user", "team")


class ApiToken(BaseModel):
    """A personal token (personal_tokens.py): only the SHA-256 of its secret is kept."""

    token_id = peewee.CharField(primary_key=True, max_length=32)
    user = peewee.CharField(max_length=128, index=True)
    name = peewee.CharField(max_length=128)
    secret_sha256 = peewee.CharField(max_length=64, unique=True)
    scope = peewee.CharField(max_length=8)            # `full` (the user's rights) or `read`
    created_at = peewee.DoubleField()
    created_by = peewee.CharField(max_length=128)
    expires_at = peewee.DoubleField(null=True)
    revoked_at = peewee.DoubleField(null=True)
    last_used_at = peewee.DoubleField(null=True)      # to the minute (personal_tokens.LAST_USED_STEP_SECS)

    class Meta:
        table_name = "api_token"


Lease.bind(database)  # the shared lease table lives in the scheduler's database

# The lowest generation of each node's credential still accepted (control-plane/server/revocations.py).
NodeCredential = credential_model(database)

MODELS = [Job, JobEvent, Node, NodeLease, SchedulerState, Counter, OutboxEvent, Lease, JobDependency, JobArray,
          ConcurrencyLimit, Schedule, ScheduleRun, StreamEvent, StatsSample, LogChunk, NodeCredential,
          Team, User, Membership, ApiToken, AuditEvent, OidcSubject, UsageDay]
