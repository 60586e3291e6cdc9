"""What the scheduler, the registry, the agent and the CLI must spell alike on the
wire: headers, job id patterns, job types. (Job statuses and their transitions are
shared/states.py; names of nodes and services, shared/validate.py.)"""
import re

# A long-poll claim that answered without waiting says why: "busy", "stopping", "again".
LONG_POLL_HEADER = "X-Corral-Long-Poll"
# A submit carrying one answers the job the first request with it created.
IDEMPOTENCY_HEADER = "Idempotency-Key"

# Job ids: "job-" and the row's id. The OpenAPI pattern and the one validation uses
# (its group is the id) say the same.
JOB_ID_PATTERN = r"^job-[1-9][0-9]{0,17}$"
JOB_ID_RE = re.compile(r"^job-([1-9][0-9]{0,17})\Z")

JOB_RUN = "run"
JOB_SERVICE = "service"
JOB_TYPES = (JOB_RUN, JOB_SERVICE)
# A job's choices the CLI offers as the scheduler checks them: when its node is lost,
# and when one of its dependencies can never be met.
ON_NODE_LOST = ("requeue", "fail")
ON_DEPENDENCY_FAILURE = ("cancel", "run")
# A schedule's choices: a slot that comes while the last run is active, and slots missed.
SCHEDULE_OVERLAP = ("allow", "skip", "cancel_previous")
SCHEDULE_CATCH_UP = ("latest", "none", "all")
# The kinds of events GET /events streams (its `types` filter).
EVENT_TYPES = ("job", "node", "log")

# Why an agent ended a job's attempt itself (its report's `ended_by`): its work dir
# outgrew its disk_mb, it ran past its timeout, or the kernel killed it at its memory
# limit. `memory` is what agents before `oom` sent; the scheduler reads it as `oom`.
ENDED_BY_DISK = "disk"
ENDED_BY_TIMEOUT = "timeout"
ENDED_BY_OOM = "oom"
ENDED_BY_MEMORY = "memory"
# A stop the scheduler asked for (a lease answer's `stop`): the drain of the node with a
# deadline, or a preemption. Reported with requeue: the job runs again, no retry spent.
ENDED_BY_DRAIN = "drain"
ENDED_BY_PREEMPTION = "preemption"
STOP_REASONS = (ENDED_BY_DRAIN, ENDED_BY_PREEMPTION)
ENDED_BY_REPORTED = (ENDED_BY_DISK, ENDED_BY_TIMEOUT, ENDED_BY_OOM, ENDED_BY_MEMORY, *STOP_REASONS)
# Why an attempt ended, as a job answer says (the scheduler's word): it exited on its
# own, or Corral ended it (timeout, cancel, preemption, the drain of its node), or its
# node was lost or gave it up, or the kernel (oom) or its disk limit did.
ENDED_BY_EXIT = "exit"
ENDED_BY_CANCEL = "cancel"
ENDED_BY_NODE_LOST = "node_lost"
ENDED_BY = (ENDED_BY_EXIT, ENDED_BY_TIMEOUT, ENDED_BY_CANCEL, ENDED_BY_PREEMPTION, ENDED_BY_DRAIN,
            ENDED_BY_NODE_LOST, ENDED_BY_OOM, ENDED_BY_DISK)

# The signals a job may ask for before its end (`signal_before_end`) and to be stopped
# with (`kill_signal`), by name without SIG. Not KILL (that is what follows the grace),
# nor STOP or the job-control ones (a stopped job would sit out its grace).
JOB_SIGNALS = ("TERM", "INT", "HUP", "QUIT", "USR1", "USR2", "ALRM", "WINCH", "URG")
DEFAULT_KILL_SIGNAL = "TERM"

# Complete logs (PUT /jobs/{id}/attempts/{n}/logs/{stream}/{seq}, GET /jobs/{id}/logs).
LOG_STDOUT = "stdout"
LOG_STDERR = "stderr"
LOG_STREAMS = (LOG_STDOUT, LOG_STDERR)
# One chunk's body at most; the agent ships in chunks of up to this size.
LOG_CHUNK_MAX_BYTES = 1024 * 1024
# A chunk's request: the node that ran the attempt, where in the stream the chunk
# starts, and "1" on the stream's last chunk.
LOG_NODE_HEADER = "X-Corral-Node"
LOG_OFFSET_HEADER = "X-Corral-Log-Offset"
LOG_FINAL_HEADER = "X-Corral-Log-Final"
# GET /jobs/{id}/logs answers: the stream's size stored so far, whether its last
# chunk came, and the attempt answered.
LOG_SIZE_HEADER = "X-Corral-Log-Size"
LOG_COMPLETE_HEADER = "X-Corral-Log-Complete"
LOG_ATTEMPT_HEADER = "X-Corral-Log-Attempt"
# What the agent writes where it dropped the middle of a stream past CORRAL_LOG_MAX_BYTES.
LOG_DROPPED_MARK = "\n[corral: {} bytes dropped]\n"
# The scheduler takes a stream this much past CORRAL_LOG_MAX_BYTES (the mark's room).
LOG_MARK_ROOM = 4096
