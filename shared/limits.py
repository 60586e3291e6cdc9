"""The numeric bounds of the job contract that the scheduler and the registry check and
the agent must stay within: a job's limits, a report's output, a claim's wait. One copy,
so that what the agent sends and what the servers take cannot drift apart."""

# A job's limits (memory_mb, cpu_percent, max_processes), and a node's default limits.
MIN_MEMORY_MB = 4  # the least a job may ask for
MAX_MEMORY_MB = 1024 * 1024  # 1 TiB
MAX_CPU_PERCENT = 100_000  # 1,000 CPUs
MAX_PROCESSES = 4_194_304  # Linux's largest pid_max
# A job's default limits by type when it asks for none: an agent's unless its
# AGENT_RUN_* / AGENT_SERVICE_* settings say otherwise, and the scheduler's for a node
# that advertised none.
DEFAULT_RUN_MEMORY_MB = 512
DEFAULT_RUN_CPU_PERCENT = 100
DEFAULT_SERVICE_MEMORY_MB = 1024
DEFAULT_SERVICE_CPU_PERCENT = 200
# A lease renewal's measured use of the node (the sum of its jobs').
MAX_USED_MEMORY_MB = 16 * MAX_MEMORY_MB
# A report's stdout or stderr, in characters: the agent sends the tails within it.
MAX_OUTPUT_CHARS = 512 * 1024
# The items of one batch request (submits, reports, output, log chunks).
MAX_BATCH = 1000
# How long a long-poll claim may wait (below gunicorn's graceful_timeout), and waits
# when it does not say.
MAX_WAIT_SECS = 25.0
DEFAULT_WAIT_SECS = 20.0

# GPUs and other countable resources (agent/gpus.py; docs/scheduling.md). A node
# advertises at most MAX_NODE_GPUS devices (MIG instances count one each) and
# MAX_RESOURCES resources; a job asks for at most that many of either.
MAX_NODE_GPUS = 256
# The most nodes one multi-node job may ask for (scheduler/gangs.py).
MAX_GANG_NODES = 256
MAX_GPU_MEMORY_MB = 1 << 24  # 16 TiB
# A device's index ("0", or "0:1" for MIG instance 1 of GPU 0) and UUID ("GPU-…", "MIG-…";
# older drivers name a MIG instance "MIG-GPU-<uuid>/<gi>/<ci>"), as the registry takes them
# and the agent checks them at start.
GPU_INDEX_PATTERN = r"^[0-9]{1,4}(:[0-9]{1,4})?$"
GPU_UUID_PATTERN = r"^(GPU|MIG)-[A-Za-z0-9/_.:-]{1,120}$"
MAX_GPU_MODEL_CHARS = 128
MAX_RESOURCES = 32
MAX_RESOURCE_COUNT = 1_000_000_000_000
# Names of resources: lower-case. These are asked for with fields of their own.
RESOURCE_NAME_PATTERN = r"^[a-z][a-z0-9_.-]{0,63}$"
RESERVED_RESOURCE_NAMES = ("gpus", "memory_mb", "cpu_percent", "slots", "jobs")
