import pytest

from corral.scheduler import validation
from corral.scheduler.validation import job_request, parse_job_id, status_report
from corral.shared.errors import BadRequest, BatchError
from corral.shared.states import InvalidTransition, JobStatus, after_failure, check_transition


def test_minimal_request_gets_defaults():
    assert job_request({"command": "echo hi"}) == {
        "command": "echo hi", "deploy_url": None, "deploy_sha256": None, "job_type": "run", "port": None,
        "env_vars": {}, "instance_id": None, "name": None, "memory_mb": None, "cpu_percent": None,
        "max_processes": None, "disk_mb": None, "gpus": None, "gpu_model": None, "gpu_memory_mb": None,
        "resources": None, "nodes": None, "health_path": None, "max_retries": None,
        "on_node_lost": "requeue", "timeout_secs": None, "warn_signal": None, "warn_secs": None,
        "kill_signal": None, "kill_grace_secs": None, "preemptible": True, "constraints": None, "pool": None,
        "priority": 50, "run_at": None, "delay_secs": None, "depends_on": None,
        "on_dependency_failure": "cancel", "concurrency_key": None, "team": None, "array": None}


def test_a_request_digests_as_before_the_scheduling_fields_when_it_gives_none():
    # The digest an Idempotency-Key is checked against, as a release without them stored it.
    before = {"command": "echo hi", "deploy_url": None, "deploy_sha256": None, "job_type": "run", "port": None,
              "env_vars": {}, "instance_id": None, "name": None, "memory_mb": None, "cpu_percent": None,
              "max_processes": None, "health_path": None, "max_retries": None, "on_node_lost": "requeue"}
    assert validation.request_hash(job_request({"command": "echo hi"})) == validation.request_hash(before)
    assert validation.request_hash(job_request({"command": "echo hi", "priority": 60})) != \
        validation.request_hash(before)


def test_full_request():
    fields = job_request({"command": "python etl.py", "deploy_url": "s3://builds/etl-42.zip",
                          "job_type": "service", "port": 8080, "env_vars": {"STAGE": "prod"},
                          "instance_id": "node-7"})
    assert fields["job_type"] == "service" and fields["port"] == 8080
    assert fields["env_vars"] == {"STAGE": "prod"} and fields["instance_id"] == "node-7"


def test_deploy_url_alone_is_enough():
    assert job_request({"deploy_url": "https://example.com/a.zip"})["command"] is None


@pytest.mark.parametrize("body, message", [
    ({}, "needs 'command' or 'deploy_url'"),
    ({"command": None}, "needs 'command' or 'deploy_url'"),
    ({"command": "   "}, "must not be blank"),
    ({"command": 42}, "'command' must be a string"),
    ({"command": "x", "job_type": "batch"}, "'job_type' must be one of"),
    ({"command": "x", "port": 0}, "'port' must be between 1 and 65535"),
    ({"command": "x", "port": 65536}, "'port' must be between 1 and 65535"),
    ({"command": "x", "port": "80"}, "'port' must be a whole number"),
    ({"command": "x", "port": True}, "'port' must be a whole number"),
    ({"command": "x", "env_vars": ["A=1"]}, "'env_vars' must be an object"),
    ({"command": "x", "env_vars": {"A": 1}}, "value for 'A' must be a string"),
    ({"command": "x", "env_vars": {"1BAD": "x"}}, "is not an environment variable name"),
    ({"command": "x", "env_vars": {"A=B": "x"}}, "is not an environment variable name"),
    ({"command": "x", "instance_id": "../etc"}, "'instance_id' must be a node id"),
    ({"command": "x", "deploy_url": "ftp://host/a.zip"}, "'deploy_url' must start with"),
    ({"command": "x", "deploy_url": "s3://bucket"}, "s3://bucket/key"),
    ({"command": "x", "deploy_url": "http:///a.zip"}, "no host"),
    ({"command": "x", "colour": "red"}, "unknown field 'colour'"),
    ({"command": "x" * (64 * 1024 + 1)}, "longer than"),
    ({"command": "a\x00b"}, "NUL"),
])
def test_bad_requests_are_refused_with_a_clear_message(body, message):
    with pytest.raises(BadRequest) as err:
        job_request(body)
    assert message in err.value.message


def test_reports():
    assert status_report({"node_id": "n1", "attempt": 1, "status": "running"})["status"] == "running"
    done = status_report({"node_id": "n1", "attempt": 2, "status": "done", "exit_code": 0, "stdout": "hi\n"})
    assert done["stdout"] == "hi\n" and done["exit_code"] == 0


@pytest.mark.parametrize("body, message", [
    ({"node_id": "n1", "attempt": 1, "status": "pending"}, "'status' must be one of"),
    ({"node_id": "n1", "status": "running"}, "'attempt' is required"),
    ({"attempt": 1, "status": "running"}, "'node_id' is required"),
    ({"node_id": "n1", "attempt": 1, "status": "done"}, "needs 'exit_code'"),
    ({"node_id": "n1", "attempt": 1, "status": "done", "exit_code": 2}, "must have exit_code 0"),
    ({"node_id": "n1", "attempt": 1, "status": "failed", "exit_code": 1, "stdout": 5}, "'stdout' must be a string"),
])
def test_bad_reports(body, message):
    with pytest.raises(BadRequest) as err:
        status_report(body)
    assert message in err.value.message


def test_job_ids():
    assert parse_job_id("job-42") == 42
    for bad in ("job-0", "job-", "42", "job-01", "job-1x", "job--1"):
        assert parse_job_id(bad) is None


def test_state_machine():
    check_transition("pending", "running")
    check_transition("running", "pending")
    check_transition("pending", "done")  # a run given up for lost had finished: its result is kept
    # A multi-node job whose attempt ended before every member ran: retried, or failed.
    check_transition("pending", "pending")
    check_transition("pending", "failed")
    for old, new in [("done", "running"), ("cancelled", "pending"), ("failed", "done"), ("done", "pending")]:
        with pytest.raises(InvalidTransition):
            check_transition(old, new)


def test_retry_budget():
    assert after_failure(0, 1) is JobStatus.PENDING
    assert after_failure(1, 1) is JobStatus.FAILED
    assert after_failure(0, 0) is JobStatus.FAILED


@pytest.mark.parametrize("body", [
    {"command": "x", "instance_id": "n1\n"},
    {"command": "x", "env_vars": {"A\n": "b"}},
    {"command": "x", "deploy_url": "http://[/build.zip"},
    {"command": "x", "deploy_url": "https://[::zz]/build.zip"},
    {"command": "x", "deploy_url": "http://host:port/build.zip"},
])
def test_trailing_newlines_and_broken_urls_are_refused(body):
    with pytest.raises(BadRequest):
        job_request(body)
    assert parse_job_id("job-1\n") is None


def test_limits_checksum_and_health_path():
    fields = job_request({"deploy_url": "https://h/a.zip", "deploy_sha256": "AB" * 32, "job_type": "service",
                          "port": 80, "health_path": "/healthz", "memory_mb": 256, "cpu_percent": 50})
    assert fields["deploy_sha256"] == "ab" * 32 and fields["health_path"] == "/healthz"
    for body, message in [
        ({"command": "x", "deploy_sha256": "ab" * 32}, "needs 'deploy_url'"),
        ({"deploy_url": "https://h/a.zip", "deploy_sha256": "xyz"}, "64 hexadecimal digits"),
        ({"command": "x", "health_path": "/h"}, "service jobs with a 'port'"),
        ({"command": "x", "job_type": "service", "port": 1, "health_path": "h"}, "starting with '/'"),
        ({"command": "x", "memory_mb": 0}, "'memory_mb' must be between"),
        ({"command": "x", "cpu_percent": 0}, "'cpu_percent' must be between"),
    ]:
        with pytest.raises(BadRequest) as err:
            job_request(body)
        assert message in err.value.message, body


def test_report_results():
    report = status_report({"node_id": "n", "attempt": 1, "status": "failed", "exit_code": -9, "oom_killed": True,
                            "peak_memory_bytes": 5, "cpu_seconds": 1, "limits": {"memory_mb": 5, "cpu_percent": 5}})
    assert report["oom_killed"] is True and report["cpu_seconds"] == 1.0 and report["limits"]["memory_mb"] == 5
    for extra in ({"cpu_seconds": -1}, {"cpu_seconds": True}, {"limits": {"memory_mb": 1}}, {"oom_killed": "yes"}):
        with pytest.raises(BadRequest):
            status_report({"node_id": "n", "attempt": 1, "status": "running", **extra})


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_AUDIT"])
def test_env_vars_that_make_the_loader_run_job_code_are_refused_by_name(name):
    with pytest.raises(BadRequest) as caught:
        validation.job_request({"command": "true", "env_vars": {"A": "1", name: "./evil.so"}})
    assert name in caught.value.message
    with pytest.raises(BatchError) as caught:
        validation.job_batch({"jobs": [{"command": "true"}, {"command": "true", "env_vars": {name: "x"}}]})
    assert caught.value.errors[0]["index"] == 1 and name in caught.value.errors[0]["error"]


def test_ld_library_path_stays_allowed():
    fields = validation.job_request({"command": "true", "env_vars": {"LD_LIBRARY_PATH": "/opt/cuda/lib64"}})
    assert fields["env_vars"] == {"LD_LIBRARY_PATH": "/opt/cuda/lib64"}
