"""The column sets the store's parts read of a job, and the size of a statement's chunk.

Each set is what one kind of read needs (a claim, placement, a lifecycle decision):
reading less than the whole row is what keeps those reads cheap."""
from ..models import Job

# Rows per INSERT of a batch (well under every database's limit of bound parameters).
INSERT_CHUNK = 500
# What a claim reads of the jobs it takes: what their answer shows (views.job) and
# their transition reads; not the bookkeeping of how they queued.
CLAIMED = tuple(field for field in Job._meta.sorted_fields if field.name not in (
    "idempotency_key", "request_hash", "queue_at", "dependencies_left", "has_dependents", "pending_reason",
    "pending_code"))
# What placement reads of a queued job (rows.ask), then its stored reason and its place in the queue.
QUEUED = (Job.id, Job.attempt, Job.job_type, Job.instance_id, Job.memory_mb, Job.cpu_percent, Job.constraints,
          Job.pool, Job.array_id, Job.concurrency_key, Job.team, Job.submitted_by, Job.preemptible, Job.priority,
          Job.gpus, Job.gpu_model, Job.gpu_memory_mb, Job.resources, Job.nodes, Job.gang_held_since,
          Job.pending_reason, Job.queue_at)
# Where placement finds a queued row's array and concurrency key (throttles), team and
# submitter (fair share's turns).
QUEUED_ARRAY, QUEUED_KEY, QUEUED_TEAM, QUEUED_USER = 8, 9, 10, 11
# What a lifecycle decision reads of a job (lifecycle.py), with its metrics
# (metrics.moved), its notification (notifications.py) and its usage (usage.py): not the
# output or the request.
DECIDING = (Job.id, Job.status, Job.attempt, Job.node_id, Job.job_type, Job.running_at, Job.retry_count,
            Job.max_retries, Job.on_node_lost, Job.node_losses, Job.name, Job.exit_code, Job.finished_at,
            Job.created_at, Job.has_dependents, Job.schedule, Job.slot, Job.timeout_secs, Job.team,
            Job.submitted_by, Job.reserved_cpu_percent, Job.preemptions, Job.gpus, Job.nodes, Job.gang_id)
