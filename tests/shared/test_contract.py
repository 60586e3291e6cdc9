"""The request models refuse as Corral always worded it (shared/contract.py turns
pydantic's errors into one line naming the field), and the answer models serialize
what the API sends."""
import pytest

from corral.registry import contract as registry
from corral.scheduler import contract as scheduler
from corral.shared.contract import built, encode
from corral.shared.errors import BadRequest


@pytest.mark.parametrize("model, body, message", [
    (scheduler.JobRequest, {"command": "x", "port": None, "memory_mb": 2}, "'memory_mb' must be between 4 and 1048576"),
    (scheduler.JobRequest, {"command": "x", "max_retries": 1.0}, "'max_retries' must be a whole number"),
    (scheduler.JobRequest, {"command": ""}, "'command' must not be empty"),
    (scheduler.JobRequest, {"command": "x", "name": "a b"},
     "'name' must be letters, digits, '.', '_' or '-' (at most 128)"),
    (scheduler.JobRequest, {"command": "x", "on_node_lost": "never"}, "'on_node_lost' must be one of requeue, fail"),
    (scheduler.JobRequest, {"command": "x", "job_type": 5}, "'job_type' must be a string"),
    (scheduler.JobRequest, {"command": "x", "env_vars": {"A": "b\x00"}},
     "'env_vars' value for 'A' is too long or contains NUL"),
    (scheduler.JobRequest, {"command": "x", "env_vars": {f"V{i}": "" for i in range(257)}},
     "'env_vars' has more than 256 entries"),
    (scheduler.JobRequest, {"command": "x", "instance_id": "n\x00"}, "'instance_id' must not contain NUL characters"),
    (scheduler.StatusReport, {"node_id": None, "attempt": 1, "status": "running"}, "'node_id' is required"),
    (scheduler.StatusReport, {"node_id": "n", "attempt": 1, "status": "running", "stdout": "x" * (512 * 1024 + 1)},
     "'stdout' is longer than 524288 characters; send its tail"),
    (scheduler.StatusReport, {"node_id": "n", "attempt": 1, "status": "running", "limits": [1]},
     "'limits' must be an object with memory_mb, cpu_percent and max_processes"),
    (scheduler.StatusReport, {"node_id": "n", "attempt": 1, "status": "running", "limits": {"memory_mb": 1}},
     "'cpu_percent' is required"),
    (scheduler.StatusReport, {"node_id": "n", "attempt": 1, "status": "running",
                              "limits": {"memory_mb": 1, "cpu_percent": 1, "swap": 1}},
     "unknown field 'swap'; allowed fields: cpu_percent, max_processes, memory_mb"),
    (scheduler.StatusReport, {"node_id": "n", "attempt": 1, "status": "running", "requeue": True},
     "'requeue' goes with a 'failed' report"),
    (scheduler.ClaimRequest, {"max": 1, "wait_secs": 26}, "'wait_secs' must be a number of seconds from 0 to 25"),
    (scheduler.ClaimRequest, {"max": 1, "wait_secs": True}, "'wait_secs' must be a number of seconds from 0 to 25"),
    (scheduler.ClaimRequest, {"max": 1, "default_limits": "x"},
     "'default_limits' must be an object with 'run' and 'service' limits"),
    (scheduler.ClaimRequest, {"max": 1, "default_limits": {"batch": {}}, "zz": 1},
     "unknown field 'zz'; allowed fields: default_limits, limits_enforced, max, private_tmp, wait_secs"),
    (scheduler.JobBatch, {"jobs": []}, "'jobs' must hold 1 to 1000 items, not 0"),
    (scheduler.JobBatch, {"jobs": {}}, "'jobs' must be a JSON array"),
    (scheduler.ReportBatch, {"reports": [], "claim": None}, "'reports' must hold 1 to 1000 items, not 0"),
    (scheduler.ReportBatch, {"reports": [{"job_id": "job-1", "node_id": "n", "attempt": 1, "status": "running"}],
                             "claim": 1},
     "'claim' must be an object: node_id, max, limits_enforced, private_tmp, default_limits"),
    (registry.NodeRegistration, {}, "'address' is required"),
    (registry.NodeRegistration, {"node_id": "n1", "address": "h", "kind": "Big"}, "'kind' must be a lower-case word"),
    (registry.NodeRegistration, {"node_id": "n1", "address": "h", "labels": {"a b": "c"}},
     "'labels' key 'a b' is not a name"),
    (registry.NodeRegistration, {"node_id": "n1", "address": "h", "labels": {"a": 1}},
     "'labels' value for 'a' must be a string"),
    (registry.ServiceRegistration, {"job_id": "job-1", "name": "web", "node_id": "n1", "address": "h", "port": 0},
     "'port' must be between 1 and 65535"),
    (registry.ServiceRegistration, {"job_id": "job 1"}, "'job_id' must be a job id"),
    (registry.Heartbeat, {"running": -1}, "'running' must be between 0 and 1000000"),
    (registry.Heartbeat, {"running": True}, "'running' must be a whole number"),
])
def test_refusals_name_the_field_and_what_it_must_be(model, body, message):
    with pytest.raises(BadRequest) as refused:
        model.check(body)
    assert refused.value.message == message


def test_null_counts_as_not_given():
    job = scheduler.JobRequest.check({"command": "x", "job_type": None, "on_node_lost": None, "env_vars": None})
    assert job.columns()["job_type"] == "run" and job.columns()["on_node_lost"] == "requeue"
    assert job.columns()["env_vars"] == {}


def test_an_answer_leaves_out_what_its_view_did_not_set():
    result = scheduler.ReportResult.model_validate({"index": 0, "job_id": "job-1", "code": 200,
                                                   "job_status": "done", "attempt": 1})
    assert encode(result) == b'{"index":0,"job_id":"job-1","code":200,"job_status":"done","attempt":1}'
    event = scheduler.JobEvent.model_validate({"at": "2026-11-29T08:00:00.000Z", "from": None, "to": "pending",
                                               "attempt": 0, "node_id": None, "reason": "submitted"})
    assert b'"from":null' in encode(event)


JOB_ANSWER = {
    "job_id": "job-7", "name": "etl", "node_id": "node-1", "instance_id": None, "command": "echo hi",
    "deploy_url": None, "deploy_sha256": None, "job_type": "run", "port": None, "health_path": None,
    "env_vars": {"A": "b"}, "memory_mb": 256, "cpu_percent": None, "max_processes": None, "disk_mb": 10240,
    "gpus": 1, "gpu_model": "a100", "gpu_memory_mb": None, "resources": {"fpga": 1}, "nodes": 1,
    "gpus_assigned": ["GPU-5a3c1b2e"], "gpu_seconds": 12.5, "peak_gpu_memory_mb": 2048,
    "gpu_utilization_percent": 87.5, "status": "running",
    "attempt": 1, "retry_count": 0, "max_retries": 1, "next_attempt_at": None,
    "on_node_lost": "requeue", "node_losses": 0, "exit_code": None, "stdout": "", "stderr": None, "oom_killed": None,
    "peak_memory_bytes": None, "cpu_seconds": None, "ended_by": None, "limits_enforced": True, "limits": None,
    "private_tmp": True,
    "timeout_secs": 3600.0, "deadline": "2026-11-29T09:00:00.020Z", "signal_before_end": None,
    "kill_signal": "TERM", "kill_grace_secs": 10.0, "preemptible": True, "preemptions": 0, "stop_reason": None,
    "stop_at": None,
    "created_at": "2026-11-29T08:00:00.000Z",
    "placed_at": "2026-11-29T08:00:00.010Z",
    "running_at": "2026-11-29T08:00:00.020Z", "finished_at": None, "priority": 50, "constraints": None,
    "pool": None, "run_at": None, "depends_on": None, "on_dependency_failure": "cancel", "array_id": None,
    "array_index": None, "concurrency_key": None, "team": "default", "submitted_by": "admin",
    "schedule": None, "slot": None, "reserved": None,
    "pending_reason": None}


@pytest.mark.parametrize("limits", [None, {"memory_mb": 256, "cpu_percent": 100},
                                    {"memory_mb": 256, "cpu_percent": 100, "max_processes": 64}])
@pytest.mark.parametrize("grant", [None, "ab" * 32])
@pytest.mark.parametrize("depends_on", [None, [{"job_id": "job-3", "condition": "finished"}]])
def test_an_answer_built_without_validation_serializes_as_a_validated_one(limits, grant, depends_on):
    fields = dict(JOB_ANSWER, limits=limits, depends_on=depends_on, **({"service_grant": grant} if grant else {}))
    validated = encode(scheduler.Job.model_validate(fields))
    fast = encode(built(scheduler.Job, dict(fields, limits=limits and built(scheduler.Limits, limits),
                                            depends_on=depends_on and [built(scheduler.JobDependsOn, d)
                                                                       for d in depends_on])))
    assert fast == validated
    assert (b'"service_grant"' in fast) == bool(grant) and (b'"max_processes":64' in fast) == bool(
        limits and "max_processes" in limits)
