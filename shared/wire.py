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

JOB_TYPES = ("run", "service")
