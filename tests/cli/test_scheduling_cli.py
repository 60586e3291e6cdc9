"""The scheduling side of `corral`: the flags of `job run` (constraints, pool, priority, start
time, dependencies, arrays, concurrency keys) as the request body the API expects, bad values
refused in one line before anything is sent, `job why`, pending reasons in `job list` and
`job status`, the nodes' figures, `array` and `concurrency`; against the `responses` mock and,
routed into it, the scheduler's real app."""
import json
import re
from urllib.parse import urlsplit

import pytest
import responses
from responses import matchers

from cli_support import REG, SCHED, corral, iso, one_line_error
from corral.cli import common
from scheduler_app import Clock, make_app, set_nodes


def a_job(job_id="job-7", **fields) -> dict:
    job = {"job_id": job_id, "name": None, "node_id": None, "command": "true", "job_type": "run",
           "status": "pending", "attempt": 0, "retry_count": 0, "max_retries": 1, "exit_code": None,
           "created_at": iso(60), "running_at": None, "finished_at": None, "priority": 50,
           "constraints": None, "pool": None, "run_at": None, "reserved": None, "pending_reason": None}
    job.update(fields)
    return job


NO_ROOM = {"code": "no_capacity", "message": "no room on the 2 nodes it may go to (short of free memory)",
           "nodes": 2, "lacking": ["memory"]}
ARRAY = {"array_id": "array-3", "count": 4, "parallel": 2, "first_job_id": "job-10", "last_job_id": "job-13"}


def body_of(mock, index=-1) -> dict:
    return json.loads(mock.calls[index].request.body)


# ---- job run: every flag into the request ----------------------------------------------------

def test_every_scheduling_flag_reaches_the_request_body(mock):
    mock.post(f"{SCHED}/jobs", json=a_job(), status=201)
    constraints = ["zone=a", "tier!=db", "gpu:in=a100,h100", "arch:not_in=arm,ppc", "ssd:exists", "spot:not_exists",
                   "note=a=b:in=c,d"]
    result = corral("job", "run", *(arg for c in constraints for arg in ("--constraint", c)), "--pool", "batch",
                    "--priority", "90", "--at", "2026-12-24T02:00:00+01:00", "--after", "job-3",
                    "--after", "job-4:failed", "--after", "job-5:finished", "--on-dependency-failure", "run",
                    "--concurrency-key", "db-mig", "--", "make", "all")
    assert result.exit_code == 0, result.output
    assert result.stdout == "job-7\n"
    assert body_of(mock) == {
        "command": "make all",
        "constraints": [{"label": "zone", "op": "=", "value": "a"}, {"label": "tier", "op": "!=", "value": "db"},
                        {"label": "gpu", "op": "in", "value": ["a100", "h100"]},
                        {"label": "arch", "op": "not_in", "value": ["arm", "ppc"]},
                        {"label": "ssd", "op": "exists"}, {"label": "spot", "op": "not_exists"},
                        {"label": "note", "op": "=", "value": "a=b:in=c,d"}],
        "pool": "batch", "priority": 90, "run_at": "2026-12-24T02:00:00+01:00",
        "depends_on": [{"job_id": "job-3", "condition": "done"}, {"job_id": "job-4", "condition": "failed"},
                       {"job_id": "job-5", "condition": "finished"}],
        "on_dependency_failure": "run", "concurrency_key": "db-mig"}


@pytest.mark.parametrize("at, fields", [("+30s", {"delay_secs": 30}), ("+10m", {"delay_secs": 600}),
                                        ("+2h", {"delay_secs": 7200}), ("+1d", {"delay_secs": 86400}),
                                        ("2026-12-24T02:00:00Z", {"run_at": "2026-12-24T02:00:00Z"})])
def test_at_is_a_time_with_a_zone_or_a_delay(mock, at, fields):
    mock.post(f"{SCHED}/jobs", json=a_job(), status=201, match=[matchers.json_params_matcher(
        {"command": "true", **fields})])
    assert corral("job", "run", "--at", at, "--", "true").exit_code == 0


def test_without_scheduling_flags_the_body_has_no_scheduling_field(mock):
    mock.post(f"{SCHED}/jobs", json=a_job(), status=201, match=[matchers.json_params_matcher({"command": "true"})])
    assert corral("job", "run", "--", "true").exit_code == 0


@pytest.mark.parametrize("args, line", [
    (["--constraint", "zone~a"], "corral: --constraint 'zone~a': a constraint is LABEL=V, LABEL!=V, LABEL:in=A,B, "
                                 "LABEL:not_in=A,B, LABEL:exists or LABEL:not_exists (LABEL: letters, digits, '.', "
                                 "'_' or '-' (at most 128))"),
    (["--constraint", "gpu"], "corral: --constraint 'gpu': a constraint is"),
    (["--constraint", "zone:in="], "corral: --constraint 'zone:in=': in takes values separated by commas, "
                                   "none of them empty"),
    (["--constraint", "zone:in=a,,b"], "corral: --constraint 'zone:in=a,,b': in takes values"),
    (["--constraint", "zone:exists=1"], "corral: --constraint 'zone:exists=1': a constraint is"),
    (["--constraint", "-zone=a"], "corral: --constraint '-zone=a': a constraint is"),
    (["--pool", "a/b"], "corral: --pool 'a/b': must be letters, digits, '.', '_' or '-' (at most 128)"),
    (["--priority", "101"], "corral: --priority '101': the priority is a whole number from 0 to 100"),
    (["--priority", "high"], "corral: --priority 'high': the priority is a whole number from 0 to 100"),
    (["--priority", "-1"], "corral: --priority '-1': the priority is a whole number from 0 to 100"),
    (["--at", "2026-12-24T02:00:00"], "corral: --at '2026-12-24T02:00:00': the time needs a zone: end it with Z "
                                      "or an offset such as +01:00"),
    (["--at", "tomorrow"], "corral: --at 'tomorrow': give an ISO-8601 time with a zone (2026-12-24T02:00:00Z) "
                           "or a delay (+30s, +10m, +2h, +1d)"),
    (["--at", "+5w"], "corral: --at '+5w': give an ISO-8601 time"),
    (["--at", "+367d"], "corral: --at '+367d': at most a year ahead"),
    (["--after", "7"], "corral: --after '7': a dependency is JOB or JOB:done, JOB:failed or JOB:finished "
                       "(JOB such as job-7)"),
    (["--after", "job-7:ok"], "corral: --after 'job-7:ok': a dependency is"),
    (["--after", "job-7", "--on-dependency-failure", "skip"], "corral: --on-dependency-failure 'skip': one of "
                                                              "cancel, run"),
    (["--on-dependency-failure", "run"], "corral: --on-dependency-failure goes with --after JOB"),
    (["--array", "0"], "corral: --array '0': a whole number from 1 to 10000"),
    (["--array", "10001"], "corral: --array '10001': a whole number from 1 to 10000"),
    (["--array", "4", "--parallel", "5"], "corral: --parallel 5: at most the --array count (4)"),
    (["--parallel", "2"], "corral: --parallel goes with --array N"),
    (["--concurrency-key", "a b"], "corral: --concurrency-key 'a b': must be letters, digits"),
])
def test_bad_scheduling_flags_are_one_line_exit_2_and_nothing_is_sent(mock, args, line):
    assert one_line_error(corral("job", "run", *args, "--", "true"), code=2).startswith(line)
    assert len(mock.calls) == 0


def test_the_help_says_each_syntax():
    text = corral("job", "run", "--help").stdout
    for said in ("LABEL=V, LABEL!=V, LABEL:in=A,B, LABEL:not_in=A,B, LABEL:exists, LABEL:not_exists",
                 "+30s, +10m, +2h, +1d", "JOB:failed, JOB:finished", "[cancel|run]", "--parallel M"):
        assert said in " ".join(text.split()), said


# ---- job run --array ---------------------------------------------------------------------------

def test_an_array_prints_its_id_and_its_jobs(mock):
    mock.post(f"{SCHED}/jobs", json=ARRAY, status=201, match=[matchers.json_params_matcher(
        {"command": "echo $CORRAL_ARRAY_INDEX", "array": {"count": 4, "parallel": 2}})])
    result = corral("job", "run", "--array", "4", "--parallel", "2", "--", "echo $CORRAL_ARRAY_INDEX")
    assert result.exit_code == 0, result.output
    assert result.stdout == "array-3\n"
    assert result.stderr == "submitted array-3: 4 jobs (job-10 to job-13), at most 2 at once\n"


def test_an_array_without_parallel_sends_the_count_only(mock):
    mock.post(f"{SCHED}/jobs", json=dict(ARRAY, parallel=4), status=201,
              match=[matchers.json_params_matcher({"command": "true", "array": {"count": 4}})])
    result = corral("job", "run", "--array", "4", "--json", "--", "true")
    assert json.loads(result.stdout) == dict(ARRAY, parallel=4)


def summary(**counts) -> dict:
    jobs = {"pending": 0, "running": 0, "done": 0, "failed": 0, "cancelled": 0}
    jobs.update(counts)
    return dict(ARRAY, created_at=iso(10), jobs=jobs)


def test_wait_on_an_array_follows_it_until_nothing_is_pending_or_running(mock):
    mock.post(f"{SCHED}/jobs", json=ARRAY, status=201)
    for state in (summary(pending=2, running=2), summary(pending=2, running=2), summary(running=2, done=2),
                  summary(done=4)):
        mock.get(f"{SCHED}/arrays/array-3", json=state)
    result = corral("job", "run", "--array", "4", "--parallel", "2", "--wait", "--", "true")
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "submitted array-3: job-10 to job-13",
        "array-3: 2 pending, 2 running, 0 done, 0 failed, 0 cancelled",
        "array-3: 0 pending, 2 running, 2 done, 0 failed, 0 cancelled",
        "array-3: 0 pending, 0 running, 4 done, 0 failed, 0 cancelled"]


def test_wait_on_an_array_with_a_failed_job_exits_1_and_json_is_the_summary(mock):
    mock.post(f"{SCHED}/jobs", json=ARRAY, status=201)
    mock.get(f"{SCHED}/arrays/array-3", json=summary(done=3, failed=1))
    result = corral("job", "run", "--array", "4", "--wait", "--json", "--", "true")
    assert result.exit_code == 1
    assert json.loads(result.stdout) == summary(done=3, failed=1)
    assert result.stderr == "corral: array-3: not every job is done (0 pending, 0 running, 3 done, 1 failed, " \
                            "0 cancelled)\n"


def test_wait_on_an_array_ctrl_c_exits_130_and_says_how_to_cancel_it(mock, monkeypatch):
    mock.post(f"{SCHED}/jobs", json=ARRAY, status=201)
    mock.get(f"{SCHED}/arrays/array-3", json=summary(pending=4))

    def interrupt(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(common, "sleep", interrupt)
    result = corral("job", "run", "--array", "4", "--wait", "--", "true")
    assert result.exit_code == 130
    assert "corral array cancel array-3" in result.stderr


# ---- pending reasons: job list, job status, --wait, job why ------------------------------------

def test_job_list_shows_why_pending_jobs_wait_and_filters_by_reason(mock):
    page = [a_job("job-8", pending_reason=NO_ROOM), a_job("job-7", status="done", exit_code=0, node_id="n1")]
    mock.get(f"{SCHED}/jobs", json=page, match=[matchers.query_param_matcher(
        {"order": "desc", "limit": "20", "pending_reason": "no_capacity"})])
    result = corral("job", "list", "--pending-reason", "no_capacity")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split()[-1] == "WAITING"
    assert lines[1].endswith("no_capacity: no room on the 2 nodes it may go to (short of free memory)")
    assert lines[2].split() == ["job-7", "-", "done", "run", "n1", "0", "0", "1m", "ago", "-", "-"]


def test_job_list_pending_reason_must_be_a_known_code(mock):
    line = one_line_error(corral("job", "list", "--pending-reason", "busy"), code=2)
    assert line.startswith("corral: --pending-reason 'busy': one of placed, no_healthy_node, constraints_unmet")
    assert len(mock.calls) == 0


def test_job_status_shows_the_reason_and_the_constraints(mock):
    job = a_job(pending_reason=NO_ROOM, priority=90, pool="batch",
                constraints=[{"label": "zone", "op": "in", "value": ["a", "b"]}, {"label": "gpu", "op": "exists"}])
    mock.get(f"{SCHED}/jobs/job-7", json=job)
    mock.get(f"{SCHED}/jobs/job-7/events", json=[])
    out = corral("job", "status", "job-7").stdout
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert "pending_reason no_capacity: no room on the 2 nodes it may go to (short of free memory) " \
           "(nodes=2, lacking=memory)" in lines
    assert "constraints zone:in=a,b, gpu:exists" in lines
    assert "priority 90" in lines and "pool batch" in lines


def test_wait_says_why_a_job_waits(mock):
    mock.post(f"{SCHED}/jobs", json=a_job(pending_reason=NO_ROOM), status=201)
    mock.get(f"{SCHED}/jobs/job-7", json=a_job(pending_reason=NO_ROOM))
    mock.get(f"{SCHED}/jobs/job-7", json=a_job(status="done", exit_code=0, node_id="n1", attempt=1,
                                               running_at=iso(2), finished_at=iso(1)))
    result = corral("job", "run", "--wait", "--", "true")
    assert result.exit_code == 0
    assert result.stderr.splitlines()[0] == \
        "job-7: pending (no room on the 2 nodes it may go to (short of free memory))"


WHY = {"job_id": "job-7", "pending_reason": NO_ROOM,
       "closest_nodes": [{"node_id": "node-2", "lacks": ["needs 512 MB of memory, 256 MB unreserved"]},
                         {"node_id": "node-1", "lacks": ["needs 1024 MB of memory, 0 MB unreserved", "no free slot"]}]}


def test_job_why_prints_the_reason_and_what_the_closest_nodes_lack(mock):
    mock.get(f"{SCHED}/jobs/job-7/why", json=WHY)
    result = corral("job", "why", "job-7")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "job-7: pending: no_capacity: no room on the 2 nodes it may go to (short of free memory)",
        "  (nodes=2, lacking=memory)",
        "",
        "closest nodes:",
        "NODE    LACKS",
        "node-2  needs 512 MB of memory, 256 MB unreserved",
        "node-1  needs 1024 MB of memory, 0 MB unreserved; no free slot"]
    assert json.loads(corral("job", "why", "job-7", "--json").stdout) == WHY


def test_job_why_of_a_job_that_does_not_wait_is_the_apis_409_in_one_line(mock):
    mock.get(f"{SCHED}/jobs/job-7/why", json={"error": "job-7 is running; only a pending job waits"}, status=409)
    # The API's message names the job first: it is not prefixed with the id again.
    assert one_line_error(corral("job", "why", "job-7")) == "corral: job-7 is running; only a pending job waits"


# ---- nodes: the scheduler's figures --------------------------------------------------------------

REG_NODES = [{"node_id": "node-1", "address": "10.0.0.5", "kind": "compute", "slots": 4, "running": 1,
              "labels": {"pool": "gpu"}, "status": "healthy", "last_heartbeat": iso(2), "drained": False},
             {"node_id": "node-2", "address": "10.0.0.6", "kind": "compute", "slots": 2, "running": 0,
              "labels": {}, "status": "healthy", "last_heartbeat": iso(3), "drained": False}]
SCHED_NODES = [{"node_id": "node-1", "pool": "gpu", "allocatable": {"memory_mb": 3584, "cpu_percent": 400},
                "reserved": {"memory_mb": 1024, "cpu_percent": 100}, "used": {"memory_mb": 300, "cpu_percent": 42}},
               {"node_id": "node-2", "pool": "default", "allocatable": {"memory_mb": None, "cpu_percent": None},
                "reserved": {"memory_mb": 0, "cpu_percent": 0}, "used": None}]


def test_node_list_shows_pool_allocatable_reserved_and_used(mock):
    mock.get(f"{REG}/nodes", json=REG_NODES)
    mock.get(f"{SCHED}/nodes", json=SCHED_NODES)
    result = corral("node", "list")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["ID", "STATUS", "ADDRESS", "SLOTS", "RUNNING", "LABELS", "HEARTBEAT", "DRAINED",
                                "POOL", "MEM_ALLOC", "MEM_RSVD", "MEM_USED", "CPU_ALLOC", "CPU_RSVD", "CPU_USED"]
    assert lines[1].split()[-7:] == ["gpu", "3584M", "1024M", "300M", "400%", "100%", "42%"]
    assert lines[2].split()[-7:] == ["default", "-", "0M", "-", "-", "0%", "-"]
    assert result.stderr == ""


def test_node_list_slots_are_what_the_node_may_hold_with_what_it_advertises_beside(mock):
    """MAX_JOBS_PER_NODE caps what a node holds: SLOTS says the cap, not just what the agent offers."""
    mock.get(f"{REG}/nodes", json=REG_NODES)
    mock.get(f"{SCHED}/nodes", json=[dict(SCHED_NODES[0], slots=4, capacity=1),
                                     dict(SCHED_NODES[1], slots=2, capacity=2)])
    lines = corral("node", "list").stdout.splitlines()
    assert lines[1].split()[:6] == ["node-1", "healthy", "10.0.0.5", "1", "(advertises", "4)"]
    assert lines[2].split()[:5] == ["node-2", "healthy", "10.0.0.6", "2", "0"]


def test_node_list_without_the_scheduler_shows_the_registrys_columns_and_says_why(mock):
    mock.get(f"{REG}/nodes", json=REG_NODES)
    mock.get(f"{SCHED}/nodes", json={"error": "the token is not valid"}, status=401)
    result = corral("node", "list")
    assert result.exit_code == 0
    assert "POOL" not in result.stdout and "node-1" in result.stdout
    assert result.stderr == "corral: no pools or resources: the token is not valid (check --token / CORRAL_TOKEN)\n"


def test_node_list_a_node_the_scheduler_does_not_know_yet_has_dashes(mock):
    mock.get(f"{REG}/nodes", json=REG_NODES)
    mock.get(f"{SCHED}/nodes", json=SCHED_NODES[:1])
    lines = corral("node", "list").stdout.splitlines()
    assert lines[2].split()[-7:] == ["-"] * 7


# ---- array show / cancel; concurrency ------------------------------------------------------------

def test_array_show_and_cancel(mock):
    mock.get(f"{SCHED}/arrays/array-3", json=summary(pending=1, running=2, done=1))
    mock.post(f"{SCHED}/arrays/array-3/cancel", json=summary(done=1, cancelled=3),
              match=[matchers.header_matcher({"Content-Type": "application/json"})])
    shown = corral("array", "show", "array-3")
    assert shown.exit_code == 0, shown.output
    lines = [" ".join(line.split()) for line in shown.stdout.splitlines()]
    assert lines == ["array_id array-3", "jobs job-10 to job-13", "count 4", "parallel 2",
                     "created_at 2026-11-29 11:59:50Z (10s ago)",
                     "status 1 pending, 2 running, 1 done, 0 failed, 0 cancelled"]
    assert json.loads(corral("array", "show", "array-3", "--json").stdout) == summary(pending=1, running=2, done=1)
    cancelled = corral("array", "cancel", "array-3")
    assert cancelled.stdout == "array-3: 0 pending, 0 running, 1 done, 0 failed, 3 cancelled\n"


def test_array_show_of_an_unknown_array_is_one_line(mock):
    mock.get(f"{SCHED}/arrays/array-9", json={"error": "no array 'array-9'"}, status=404)
    assert one_line_error(corral("array", "show", "array-9")) == "corral: array-9: no array 'array-9'"


def test_concurrency_list_set_and_remove(mock):
    limits = [{"key": "db-mig", "limit": 1, "active": 1, "team": "ml"}, {"key": "s3", "limit": 8, "active": 3,
                                                                         "team": "web"}]
    mock.get(f"{SCHED}/concurrency", json=limits)
    mock.put(f"{SCHED}/concurrency/db-mig", json={"key": "db-mig", "limit": 2, "active": 1, "team": "ml"},
             match=[matchers.json_params_matcher({"limit": 2})])
    mock.put(f"{SCHED}/concurrency/gpu", json={"key": "gpu", "limit": 4, "active": 0, "team": "ml"},
             match=[matchers.json_params_matcher({"limit": 4, "team": "ml"})])
    mock.delete(f"{SCHED}/concurrency/db-mig", status=204,
                match=[matchers.header_matcher({"Content-Type": "application/json"})])
    listed = corral("concurrency", "list")
    assert [line.split() for line in listed.stdout.splitlines()] == [
        ["KEY", "TEAM", "LIMIT", "ACTIVE"], ["db-mig", "ml", "1", "1"], ["s3", "web", "8", "3"]]
    assert json.loads(corral("concurrency", "list", "--json").stdout) == limits
    assert corral("concurrency", "set", "db-mig", "2").stdout == "db-mig: at most 2 at once (1 active)\n"
    assert corral("concurrency", "set", "gpu", "4", "--team", "ml").exit_code == 0
    removed = corral("concurrency", "remove", "db-mig")
    assert removed.exit_code == 0 and removed.stdout == "db-mig: no limit\n"


@pytest.mark.parametrize("args, line", [
    (["set", "a b", "2"], "corral: KEY 'a b': must be letters, digits, '.', '_' or '-' (at most 128)"),
    (["set", "k", "0"], "corral: LIMIT '0': a whole number from 1 to 100000"),
    (["set", "k", "many"], "corral: LIMIT 'many': a whole number from 1 to 100000"),
    (["remove", "a/b"], "corral: KEY 'a/b': must be letters"),
])
def test_bad_concurrency_arguments_are_one_line_exit_2(mock, args, line):
    assert one_line_error(corral("concurrency", *args), code=2).startswith(line)
    assert len(mock.calls) == 0


def test_an_empty_concurrency_list_says_so(mock):
    mock.get(f"{SCHED}/concurrency", json=[])
    result = corral("concurrency", "list")
    assert result.stdout == "" and result.stderr == "no concurrency limits\n"


# ---- the same commands against the scheduler's real app -------------------------------------------

@pytest.fixture
def real_app(database_url):
    """SCHED answered by the scheduler's app (its test client), through the `responses` mock."""
    clock = Clock()
    app = make_app(database_url, clock, max_jobs_per_node=4)
    client = app.test_client()

    def forward(request):
        url = urlsplit(request.url)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("content-length", "host")}
        answer = client.open(url.path, method=request.method, query_string=url.query, data=request.body,
                             headers=headers)
        return answer.status_code, {"Content-Type": answer.content_type}, answer.get_data()

    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
            mock.add_callback(method, re.compile(re.escape(SCHED) + "/.*"), callback=forward)
        yield app.extensions["corral.store"], clock


def as_json(*args):
    result = corral(*args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_real_scheduler_takes_every_flag(real_app):
    store, clock = real_app
    set_nodes(store, clock, "n1")
    first = as_json("job", "run", "--json", "--", "true")
    job = as_json("job", "run", "--json", "--constraint", "zone:in=a,b", "--constraint", "gpu:not_exists",
                  "--pool", "batch", "--priority", "70", "--at", "+1h", "--after", f"{first['job_id']}:finished",
                  "--on-dependency-failure", "run", "--concurrency-key", "db", "--", "echo", "hi")
    assert job["constraints"] == [{"label": "zone", "op": "in", "value": ["a", "b"]},
                                  {"label": "gpu", "op": "not_exists"}]
    assert (job["pool"], job["priority"], job["status"]) == ("batch", 70, "pending")
    assert job["run_at"] == "2027-01-15T09:00:00.000Z"  # the app's clock, an hour on
    assert job["pending_reason"]["code"] == "dependency"
    listed = as_json("job", "list", "--json", "--pending-reason", "dependency")
    assert [j["job_id"] for j in listed] == [job["job_id"]]
    assert as_json("job", "list", "--json", "--pending-reason", "no_capacity") == []
    why = corral("job", "why", job["job_id"])
    assert why.exit_code == 0, why.output
    assert why.stdout.startswith(f"{job['job_id']}: pending: dependency: waiting for {first['job_id']} to be finished")


def test_the_real_scheduler_arrays_concurrency_and_a_why_refused(real_app):
    store, clock = real_app
    set_nodes(store, clock, "n1")
    array = corral("job", "run", "--array", "3", "--parallel", "1", "--", "true")
    assert array.exit_code == 0, array.output
    array_id = array.stdout.strip()
    assert as_json("array", "show", array_id, "--json")["jobs"]["pending"] == 3
    assert as_json("array", "cancel", array_id, "--json")["jobs"]["cancelled"] == 3
    assert corral("concurrency", "set", "db", "2").exit_code == 0
    assert as_json("concurrency", "list", "--json") == [{"key": "db", "limit": 2, "active": 0, "team": "default"}]
    assert corral("concurrency", "remove", "db").exit_code == 0
    assert as_json("concurrency", "list", "--json") == []
    cancelled_one = as_json("array", "show", array_id, "--json")["first_job_id"]
    line = one_line_error(corral("job", "why", cancelled_one))
    assert line.startswith(f"corral: {cancelled_one} is cancelled")
    assert as_json("job", "status", "--json", cancelled_one)["status"] == "cancelled"


def test_the_real_scheduler_schedules(real_app):
    store, clock = real_app
    set_nodes(store, clock, "n1")
    added = corral("schedule", "add", "nightly", "--cron", "30 2 * * *", "--tz", "Europe/Berlin", "--overlap", "skip",
                   "--env", "STAGE=prod", "--priority", "70", "--", "python", "etl.py", "--day", "today")
    assert added.exit_code == 0, added.output
    assert added.stdout == "nightly\n" and "next run: 2027-01-16T02:30:00+01:00" in added.stderr
    shown = as_json("schedule", "show", "nightly", "--json")
    assert shown["job"] == {"command": "python etl.py --day today", "env_vars": {"STAGE": "prod"}, "priority": 70}
    assert (shown["overlap"], shown["catch_up"], shown["enabled"]) == ("skip", "latest", True)
    assert as_json("schedule", "add", "tick", "--every", "60", "--disabled", "--json", "--", "true")["enabled"] is False
    listed = corral("schedule", "list")
    assert listed.exit_code == 0 and "every 60s" in listed.stdout and "none (disabled)" in listed.stdout
    enabled = corral("schedule", "enable", "tick")
    assert enabled.exit_code == 0 and enabled.stdout.startswith("tick: enabled, next run ")
    assert as_json("schedule", "disable", "tick", "--json")["next_run_at"] is None
    assert as_json("schedule", "runs", "nightly", "--json") == []
    bad = one_line_error(corral("schedule", "add", "bad", "--cron", "61 * * * *", "--", "true"))
    assert "field 1 (minute) is not valid: '61'" in bad
    assert "a schedule named 'nightly' exists" in one_line_error(
        corral("schedule", "add", "nightly", "--cron", "@daily", "--", "true"))
    assert corral("schedule", "delete", "tick").stdout == "tick: deleted\n"
    assert "no schedule 'tick'" in one_line_error(corral("schedule", "show", "tick"))

