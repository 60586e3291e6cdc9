"""Two scheduler replicas on one PostgreSQL database with real agents, and the faults
a replicated deployment must come through: a replica killed (kill -9) in the middle
of 2,000 submissions, the database stopped for 10 s and for longer than the agents'
lease, a replica stopped (SIGSTOP) while it holds the placement lock, and the leader
of the background loops stopped past its lease.

The registry and both schedulers share one database (each service in its schema of
its own); agents get both schedulers' URLs. The database is the session's throwaway
server (tests/pg.py, fixture pg_server): the outage tests stop that same server and
start it again on its port and data dir. Every assertion comes from the API, the
database, the servers' logs, or marks the jobs write themselves.
"""
import concurrent.futures
import os
import signal
import threading
import time

import psycopg
import pytest
import requests

from cluster import Cluster, all_jobs, final_transitions, holder_pid, process_group, replica_of
from helpers import HoldingProxy, QuietHandler, process_gone, wait_for

from corral.scheduler.loops import LEASE_NAME
from corral.server.backends.postgres import IDLE_IN_TRANSACTION_TIMEOUT_MS, LOCK_TIMEOUT_MS, PLACEMENT_LOCK_KEY

pytestmark = pytest.mark.e2e

B = "scheduler-b"  # the second replica; the first is the cluster's "scheduler"
LOCK_TIMEOUT = LOCK_TIMEOUT_MS / 1000
IDLE_TIMEOUT = IDLE_IN_TRANSACTION_TIMEOUT_MS / 1000
# loops.Background's lease period with the tests' DISPATCH_INTERVAL_SECS (0.2): max(10, 5 x 0.2).
LOOPS_LEASE_SECS = 10.0
# The production lease period (HEARTBEAT_TIMEOUT_SECS): agents' leases outlast a short outage.
PRODUCTION_LEASE = 20


@pytest.fixture
def ha(tmp_path, request, pg_url):
    """`ha(replicas=True, **scheduler_env)`: a cluster whose registry and schedulers use
    one fresh PostgreSQL database, its registry started and, with `replicas`, both
    schedulers ("scheduler", replica A, and "scheduler-b", B); the test starts its
    agents. Stopped afterwards, the logs printed when the test failed."""
    made: list[Cluster] = []

    def make(replicas: bool = True, **scheduler_env) -> Cluster:
        c = Cluster(tmp_path, database_url=pg_url, **scheduler_env)
        made.append(c)
        c.start_registry()
        if replicas:
            c.start_scheduler()
            c.start_scheduler(name=B)
        return c

    try:
        yield make
    finally:
        failed = getattr(request.node, "rep_call", None)
        for c in made:
            c.stop()
            if failed is not None and failed.failed:
                print(c.logs())


@pytest.fixture
def db(pg_url):
    """A connection of the test's own to the cluster's database (autocommit)."""
    with psycopg.connect(pg_url, autocommit=True, connect_timeout=10) as conn:
        yield conn


# ---- submitting, and what came of it ------------------------------------------------------

def submit_acknowledged(urls: list[str], body: dict, key: str, path: str = "/jobs", timeout: float = 90.0,
                        refusals: list | None = None):
    """POST `body` with the Idempotency-Key `key` to the first of `urls` that acknowledges
    it (201, or 200: the key was acknowledged before, and the answer is the job it
    created), going round the URLs while each fails (no connection, no answer, a 5xx,
    appended to `refusals`); the answer's JSON. A 4xx fails the test."""
    deadline = time.monotonic() + timeout
    while True:
        for url in urls:
            try:
                answer = requests.post(url + path, json=body, headers={"Idempotency-Key": key}, timeout=(3, 15))
            except requests.RequestException:
                continue
            if answer.status_code in (200, 201):
                return answer.json()
            assert answer.status_code >= 500, (url, path, answer.status_code, answer.text)
            if refusals is not None:
                refusals.append(answer)
        assert time.monotonic() < deadline, f"no replica acknowledged {key} within {timeout:.0f}s"
        time.sleep(0.2)


def stamped_true(stamps: str) -> str:
    """A job that does nothing but append a line to `stamps` as it starts and one as it
    ends (`>>` opens with O_APPEND: each line lands whole): `start|end JOB ATTEMPT TIME`."""
    return (f"echo start $CORRAL_JOB_ID $CORRAL_ATTEMPT $(date +%s.%N) >> {stamps}; "
            f"echo end $CORRAL_JOB_ID $CORRAL_ATTEMPT $(date +%s.%N) >> {stamps}")


def stamps_file(shared_dir: str) -> str:
    path = os.path.join(shared_dir, "stamps")
    open(path, "w").close()
    os.chmod(path, 0o666)  # jobs run as uids of their own
    return path


def runs_by_job(stamps: str) -> dict[str, list[tuple[float, float]]]:
    """Per job, the (start, end) of each of its runs, from the lines the runs wrote. An
    attempt that started twice, or a run that never ended (killed), fails the test."""
    started: dict[tuple[str, str], float] = {}
    runs: dict[str, list[tuple[float, float]]] = {}
    with open(stamps) as f:
        for line in f:
            what, job, attempt, at = line.split()
            if what == "start":
                assert (job, attempt) not in started, f"attempt {attempt} of {job} started twice at once"
                started[(job, attempt)] = float(at)
            else:
                runs.setdefault(job, []).append((started.pop((job, attempt)), float(at)))
    assert not started, f"runs that never ended: {sorted(started)[:10]}"
    return runs


def overlapping_runs(runs: dict[str, list[tuple[float, float]]]) -> list:
    """The jobs two of whose runs overlapped in time (ran twice at once)."""
    found = []
    for job_id, spans in runs.items():
        spans = sorted(spans)
        found += [(job_id, first, second) for first, second in zip(spans, spans[1:]) if second[0] < first[1]]
    return found


def assert_each_done_once(url: str, job_ids) -> None:
    """Every job is done, with exactly one final transition in its history."""
    def finals(job_id):
        return job_id, [e["to"] for e in final_transitions(url, job_id)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        wrong = [(job_id, ends) for job_id, ends in pool.map(finals, job_ids) if ends != ["done"]]
    assert not wrong, f"{len(wrong)} job(s) without exactly one final transition to done: {wrong[:10]}"


def wait_all_done(url: str, job_ids, timeout: float) -> dict[str, dict]:
    wanted = set(job_ids)

    def done():
        jobs = all_jobs(url)
        return jobs if all(jobs[j]["status"] == "done" for j in wanted) else None
    return wait_for(done, timeout=timeout, interval=0.5, message=f"{len(wanted)} acknowledged jobs to be done")


def assert_no_internal_errors(c: Cluster) -> None:
    """No server answered a 500 (control-plane/server/http.py logs each as an unhandled error)."""
    for name in ("registry", *c.scheduler_names):
        log = c.procs[name].output()
        at = log.find("unhandled error")
        assert at < 0, f"{name} answered 500:\n{log[max(0, at - 200):][:4000]}"


def job_events(url: str, job_id: str) -> list[dict]:
    return requests.get(f"{url}/jobs/{job_id}/events", timeout=10).json()


def wait_job(url: str, job_id: str, *statuses: str, timeout: float) -> dict:
    """The job once it is in one of `statuses`."""
    def reached():
        job = requests.get(f"{url}/jobs/{job_id}", timeout=5).json()
        return job if job["status"] in statuses else None
    return wait_for(reached, timeout=timeout, message=f"{job_id} to be {' or '.join(statuses)}")


# ---- processes and sessions ----------------------------------------------------------------

def loops_lease(db) -> tuple[str, int, float]:
    """(holder, token, expires_at) of the scheduler's background loops' lease row."""
    return db.execute("SELECT holder, token, expires_at FROM corral_scheduler.lease WHERE name = %s",
                      (LEASE_NAME,)).fetchone()


def db_now(db) -> float:
    return float(db.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8").fetchone()[0])


def wait_background_pass(db, since: float, timeout: float = 40.0) -> None:
    """Until a background pass of the loops' leader began after `since` (the database's
    clock): each pass renews the lease row, to `now + lease period`."""
    wait_for(lambda: loops_lease(db)[2] > since + LOOPS_LEASE_SECS - 1, timeout=timeout,
             message="a background pass after the outage")


def placement_lock_holder(db) -> tuple[int, int, str] | None:
    """(backend pid, client port, state) of the session that holds the placement lock."""
    return db.execute(
        "SELECT l.pid, a.client_port, a.state FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s AND l.objid = %s AND l.objsubid = 1",
        (PLACEMENT_LOCK_KEY >> 32, PLACEMENT_LOCK_KEY & 0xFFFFFFFF)).fetchone()


def waiting_placement_lock_holder(db) -> tuple[int, int, str] | None:
    """The placement lock's holder (as placement_lock_holder) while it waits on another lock."""
    holder = placement_lock_holder(db)
    if holder is None:
        return None
    waiting = db.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                         (holder[0],)).fetchone()
    return holder if waiting and waiting[0] else None


def client_ports(pgid: int, server_port: int) -> set[int]:
    """The local ports of the TCP connections to `server_port` that processes of the
    process group `pgid` hold (from /proc/net/tcp and their open descriptors)."""
    by_inode = {}
    with open("/proc/net/tcp") as f:
        for line in list(f)[1:]:
            fields = line.split()
            if int(fields[2].rsplit(":", 1)[1], 16) == server_port:
                by_inode[f"socket:[{fields[9]}]"] = int(fields[1].rsplit(":", 1)[1], 16)
    ports = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and process_group(int(entry)) == pgid:
            try:
                links = [os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")]
            except OSError:
                continue  # it exited meanwhile
            ports.update(by_inode[link] for link in links if link in by_inode)
    return ports


# ---- a. kill -9 of a replica under 2,000 submissions ---------------------------------------

@pytest.mark.timeout(240)
def test_a_replica_killed_midway_through_2000_submissions_loses_none_and_runs_none_twice_at_once(
        ha, shared_dir):
    """Submissions alternate between the replicas, each with an Idempotency-Key, and
    move to the other replica when theirs fails (as the clients' failover does). After
    the 1,000th acknowledgement replica A gets SIGKILL, master and workers. Every
    acknowledged job ends done with one final transition, no key made two jobs, and no
    job ran twice at the same time (from the marks the jobs write)."""
    c = ha(MAX_JOBS_PER_NODE=3)
    a, b = c.scheduler_urls
    nodes = ["node-1", "node-2", "node-3"]
    for node_id in nodes:
        c.start_agent(node_id, slots=3)
    c.wait_nodes_healthy(*nodes)
    stamps = stamps_file(shared_dir)
    body = {"command": stamped_true(stamps)}
    acknowledged: dict[int, str] = {}
    lock = threading.Lock()
    killed = threading.Event()

    def submit(i: int) -> None:
        job = submit_acknowledged([a, b] if i % 2 == 0 else [b, a], body, f"ha-{i}")
        with lock:
            acknowledged[i] = job["job_id"]
            count = len(acknowledged)
        if count == 1000:
            killed.set()
            c.procs["scheduler"].kill()  # SIGKILL to its process group: master and workers

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(submit, range(2000)))
    assert killed.is_set() and not c.procs["scheduler"].alive()

    job_ids = set(acknowledged.values())
    assert len(job_ids) == 2000  # no two keys answered with one job
    jobs = wait_all_done(b, job_ids, timeout=150)
    assert set(jobs) == job_ids  # nothing but the acknowledged jobs: no key made a second job
    assert_each_done_once(b, job_ids)
    runs = runs_by_job(stamps)
    assert set(runs) == job_ids
    assert overlapping_runs(runs) == []
    assert_no_internal_errors(c)
    print(f"{sum(len(spans) > 1 for spans in runs.values())} job(s) ran more than once, one after the other")


# ---- b. the database stopped for 10 s under load -------------------------------------------

class Load:
    """Submits `true` jobs to the replicas in turn, each acknowledged before the next
    (resent with its key while the replicas fail), until stopped."""

    def __init__(self, urls: list[str], command: str, prefix: str):
        self.urls, self.command, self.prefix = urls, command, prefix
        self.acknowledged: list[str] = []
        self.refusals: list[requests.Response] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            urls = self.urls[i % 2:] + self.urls[:i % 2]
            job = submit_acknowledged(urls, {"command": self.command}, f"{self.prefix}-{i}", refusals=self.refusals)
            self.acknowledged.append(job["job_id"])
            i += 1
            self.stop.wait(0.05)

    def finish(self) -> list[str]:
        self.stop.set()
        self.thread.join(100)
        assert not self.thread.is_alive()
        return self.acknowledged


def assert_answers_503_json(response: requests.Response) -> None:
    assert response.status_code == 503, (response.request.method, response.url, response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["error"]


OUTAGE = 10.0


@pytest.mark.timeout(180)
def test_postgresql_stopped_for_10s_under_load_loses_nothing_and_kills_no_running_job(
        ha, pg_server, pg_url, shared_dir):
    """PostgreSQL stopped (a fast shutdown) for 10 s while jobs are submitted and one
    sleeps across the outage: meanwhile both replicas answer 503 with a JSON error;
    they reconnect by themselves (requests and background loops); every acknowledged
    job ends done once; the sleeping job, its agent's lease (20 s) outlasting the
    outage, ends done on its first attempt."""
    c = ha(HEARTBEAT_TIMEOUT_SECS=PRODUCTION_LEASE, MAX_JOBS_PER_NODE=2)
    a, b = c.scheduler_urls
    c.start_agent("node-1", slots=2)
    c.start_agent("node-2", slots=2)
    c.wait_nodes_healthy("node-1", "node-2")
    stamps = stamps_file(shared_dir)
    pid_file = os.path.join(shared_dir, "sleeper.pid")
    sleeper = submit_acknowledged([a, b], {"command": f"echo $$ > {pid_file}; sleep {OUTAGE + 8:.0f}; echo slept",
                                           "max_retries": 0}, "sleeper")["job_id"]
    wait_job(a, sleeper, "running", timeout=20)
    sleeper_pid = int(wait_for(lambda: open(pid_file).read().strip(), timeout=10, message="its pid"))
    load = Load([a, b], stamped_true(stamps), "load")
    try:
        wait_for(lambda: len(load.acknowledged) >= 20, timeout=30, message="jobs acknowledged before the outage")
        pg_server.shut_down()
        down_at = time.monotonic()
        try:
            for url in (a, b):
                assert_answers_503_json(requests.get(f"{url}/jobs/{sleeper}", timeout=10))
                assert_answers_503_json(requests.post(f"{url}/jobs", json={"command": "true"}, timeout=10,
                                                      headers={"Idempotency-Key": f"outage-{url}"}))
                assert_answers_503_json(requests.get(f"{url}/readyz", timeout=10))
            acknowledged_before = len(load.acknowledged)
            time.sleep(max(0.0, OUTAGE - (time.monotonic() - down_at)))  # the fault itself
            assert len(load.acknowledged) <= acknowledged_before + 1  # (one may have been answered as it stopped)
            assert not process_gone(sleeper_pid)  # it runs across the whole outage
        finally:
            pg_server.start_again()
        up_at = time.monotonic()
        for url in (a, b):
            wait_for(lambda: requests.get(f"{url}/readyz", timeout=5).status_code == 200, timeout=30,
                     message=f"{url} to be ready again")
        with psycopg.connect(pg_url, autocommit=True, connect_timeout=10) as db:
            wait_background_pass(db, db_now(db))
        count = len(load.acknowledged)
        wait_for(lambda: len(load.acknowledged) >= count + 20, timeout=30, message="jobs acknowledged after")
        reconnected = time.monotonic() - up_at
    finally:
        job_ids = load.finish()
    assert load.refusals and all(r.status_code == 503 for r in load.refusals)

    jobs = wait_all_done(b, [*job_ids, sleeper], timeout=90)
    assert len(jobs) == len(job_ids) + 1  # no resent submission made a second job
    assert_each_done_once(b, [*job_ids, sleeper])
    done = jobs[sleeper]
    assert (done["exit_code"], done["stdout"], done["attempt"], done["retry_count"], done["node_losses"]) == (
        0, "slept\n", 1, 0, 0), done
    assert [e["to"] for e in job_events(b, sleeper)].count("running") == 1
    assert overlapping_runs(runs_by_job(stamps)) == []
    assert_no_internal_errors(c)
    print(f"both replicas served again {reconnected:.1f}s after PostgreSQL was back")


# ---- c. the database stopped for longer than the agents' lease -----------------------------

# The agents' lease (HEARTBEAT_TIMEOUT_SECS) and the scheduler's grace, short: with the
# defaults (20 s and 15 s) a 40 s outage passes both the agents' lease (they fence their
# run jobs) and the scheduler's deadline for a node loss (35 s). These scale it down to
# three lease periods: a 12 s outage passes a 4 s lease and the 4 + 3 s deadline by
# about as much, and the loops' own lease (10 s) too, as 40 s does.
SHORT_LEASE = 4
SHORT_GRACE = 3
LONG_OUTAGE = 12.0


@pytest.mark.timeout(180)
def test_postgresql_stopped_past_the_lease_fences_run_jobs_requeues_them_unspent_and_loses_no_node(
        ha, pg_server, pg_url, shared_dir):
    """PostgreSQL down for three lease periods. The agents cannot renew their leases:
    each stops its run jobs at the lease timeout (while the database is still down),
    and reports them when it is back; they are requeued without spending their
    retries (a self-fenced run counts as a node loss) and end done on a later attempt.
    A service is not fenced and keeps running. Once the database is back the nodes get
    a full lease period before any counts as lost: the service's agent, stopped
    (SIGSTOP) during the outage, stays silent past the first background pass after it,
    and its service is not taken from it."""
    c = ha(HEARTBEAT_TIMEOUT_SECS=SHORT_LEASE, NODE_LOST_GRACE_SECS=SHORT_GRACE)
    a, b = c.scheduler_urls
    quiet = c.start_agent("node-1")
    c.start_agent("node-2")
    c.wait_nodes_healthy("node-1", "node-2")
    pids = os.path.join(shared_dir, "pids")
    os.mkdir(pids)
    os.chmod(pids, 0o1777)
    service = submit_acknowledged([a, b], {"command": f"echo $$ > {pids}/service; exec sleep 600",
                                           "job_type": "service", "instance_id": "node-1"}, "service")["job_id"]
    run = submit_acknowledged([a, b], {
        "command": f'echo $$ > {pids}/run-$CORRAL_ATTEMPT; [ "$CORRAL_ATTEMPT" = 1 ] && sleep 120; echo ran',
        "instance_id": "node-2", "max_retries": 0}, "run")["job_id"]
    for job_id in (service, run):
        wait_job(a, job_id, "running", timeout=20)
    service_pid = int(wait_for(lambda: open(f"{pids}/service").read().strip(), timeout=10, message="its pid"))
    run_pid = int(wait_for(lambda: open(f"{pids}/run-1").read().strip(), timeout=10, message="its pid"))

    pg_server.shut_down()
    down_at = time.monotonic()
    try:
        # The agent of node-2 fences its run job at the lease timeout, the database still down.
        wait_for(lambda: process_gone(run_pid), timeout=LONG_OUTAGE - 2, message="the run job to be fenced")
        fenced_after = time.monotonic() - down_at
        # Not at once: a lease period after its last renewal, a heartbeat (0.5 s) or so before the stop.
        assert fenced_after >= SHORT_LEASE - 2
        assert not process_gone(service_pid)  # services are not fenced
        quiet.signal(signal.SIGSTOP)  # node-1's agent: silent until after the first pass below
        time.sleep(max(0.0, LONG_OUTAGE - (time.monotonic() - down_at)))  # the fault itself
    finally:
        pg_server.start_again()
    db = psycopg.connect(pg_url, autocommit=True, connect_timeout=10)
    try:
        back = db_now(db)
        # The first background pass since (its lease row renewed): node-1's lease is far
        # past lease + grace, yet its service stays: the pass gives every node a full period.
        wait_background_pass(db, back)
        first_pass_after = db_now(db) - back
        time.sleep(SHORT_LEASE / 2)  # node-1 still silent, within the period the pass gave it
        kept = requests.get(f"{b}/jobs/{service}", timeout=10).json()
        assert (kept["status"], kept["node_id"], kept["attempt"]) == ("running", "node-1", 1), kept
    finally:
        quiet.signal(signal.SIGCONT)
        db.close()

    done = wait_job(b, run, "done", "failed", timeout=60)
    assert (done["status"], done["stdout"], done["retry_count"], done["node_losses"]) == ("done", "ran\n", 0, 1), done
    assert done["attempt"] == 2 and len(final_transitions(b, run)) == 1
    reasons = [e["reason"] for e in job_events(b, run)]
    assert any("gave the attempt up; requeued" in r for r in reasons), reasons  # the agent's fenced report
    # Nothing was counted lost by the scheduler, before the outage or after it.
    for job_id in (run, service):
        assert not any("lost" in e["reason"] for e in job_events(b, job_id)), job_events(b, job_id)
    kept = requests.get(f"{b}/jobs/{service}", timeout=10).json()
    assert (kept["status"], kept["attempt"]) == ("running", 1) and not process_gone(service_pid)
    assert "stopping 1 run job(s)" in c.procs["node-2"].output()
    assert_no_internal_errors(c)
    print(f"the run job was fenced {fenced_after:.1f}s into the outage; the first background pass came "
          f"{first_pass_after:.1f}s after the database was back")


# ---- d. a replica stopped while it holds the placement lock --------------------------------

BATCH = 500


@pytest.mark.timeout(180)
def test_a_replica_stopped_holding_the_placement_lock_holds_up_the_other_for_the_session_timeouts_only(
        ha, pg_server, pg_url, db):
    """Replica A takes big batches; the test holds the next placement inside the
    placement lock and, when the session holding it is one of A's (pg_locks, the
    session's client port, A's sockets), stops A (SIGSTOP). Replica B accepts a job at
    once and places it soon after the idle-in-transaction timeout ends A's session
    (an agent's next claim, or B's background pass once A's lease has run out). A's
    unanswered batch, resent with its key, is stored once. After SIGCONT, A serves and
    places again; nothing is lost or doubled."""
    c = ha(HEARTBEAT_TIMEOUT_SECS=PRODUCTION_LEASE, MAX_JOBS_PER_NODE=2)
    a, b = c.scheduler_urls
    # Short claims: an agent whose claim waits on the stopped A moves to B soon.
    for node_id in ("node-1", "node-2"):
        c.start_agent(node_id, slots=2, AGENT_LONG_POLL_SECS=2)
    c.wait_nodes_healthy("node-1", "node-2")
    replica_a = c.procs["scheduler"]
    # Batches of jobs pinned to a node that does not exist: stored and never placed.
    batch = {"jobs": [{"command": "true", "instance_id": "nowhere"}] * BATCH}
    batches: list[list[str]] = []
    caught = threading.Event()

    def submit_batches() -> None:
        n = 0
        while not caught.is_set() and n < 40:
            jobs = submit_acknowledged([a, b], batch, f"batch-{n}", path="/jobs/batch")
            batches.append([j["job_id"] for j in jobs])
            n += 1

    feeder = threading.Thread(target=submit_batches, daemon=True)
    feeder.start()
    stopped_holder = None
    try:
        # A placement holds the lock for a millisecond or two: too short to stop A
        # inside it at will. The test's own session locks the round-robin cursor's
        # table, which a placement reads right after taking the lock (and a submit
        # never before it), so the next placement waits there holding the lock. When
        # that is one of A's, A is stopped and the table let go: A's session gets its
        # answer and sits idle in its transaction, the lock still held, until the
        # server's idle-in-transaction timeout ends it. When it is B's, let go, again.
        deadline = time.monotonic() + 60
        with psycopg.connect(pg_url, connect_timeout=10) as blocker:
            while stopped_holder is None and time.monotonic() < deadline:
                blocker.execute("LOCK TABLE corral_scheduler.scheduler_state IN ACCESS EXCLUSIVE MODE")
                holder = wait_for(lambda: waiting_placement_lock_holder(db), timeout=10,
                                  message="a placement to wait on the cursor's table")
                if holder[1] in client_ports(replica_a.pid, pg_server.port):
                    replica_a.freeze()  # every thread, before the table is let go
                    stopped_holder, stopped_at = holder, time.monotonic()
                    caught.set()
                blocker.commit()
        assert stopped_holder is not None, "never caught replica A holding the placement lock"

        # Accepted by B at once: new work does not wait for the nodes A's placement holds.
        probe = submit_acknowledged([b], {"command": "echo probe"}, "probe")
        assert time.monotonic() - stopped_at <= LOCK_TIMEOUT, "the submit waited on A's placement"
        released_after = wait_for(lambda: (lambda h: None if h and h[0] == stopped_holder[0]
                                           else time.monotonic() - stopped_at)(placement_lock_holder(db)),
                                  timeout=IDLE_TIMEOUT + 5, message="A's session to lose the lock")
        # Placed, by B, once A's session is ended: by an agent's next claim there (an agent
        # whose claim waited on A moves to B when it times out) or by B's background pass
        # (once A's lease of the loops, 10 s, has run out).
        bound = IDLE_TIMEOUT + 10 + 5
        started = wait_job(b, probe["job_id"], "running", "done", "failed", timeout=bound + 5)
        placed_after = time.monotonic() - stopped_at
        assert started["node_id"] in ("node-1", "node-2"), started
        assert placed_after <= bound, (placed_after, stopped_holder)
    finally:
        replica_a.signal(signal.SIGCONT)
    feeder.join(120)
    assert not feeder.is_alive()

    done = wait_job(b, probe["job_id"], "done", "failed", timeout=60)
    assert (done["status"], done["stdout"]) == ("done", "probe\n")
    # A serves again, and places.
    after = submit_acknowledged([a], {"command": "echo after"}, "after")
    assert wait_all_done(a, [after["job_id"]], timeout=30)[after["job_id"]]["stdout"] == "after\n"
    # Every batch acknowledged is stored once: no more jobs than acknowledged, none twice.
    stored = db.execute("SELECT count(*), count(DISTINCT idempotency_key) FROM corral_scheduler.job "
                        "WHERE instance_id = 'nowhere'").fetchone()
    acknowledged = [job_id for jobs in batches for job_id in jobs]
    assert stored == (len(acknowledged), len(acknowledged)) == (len(set(acknowledged)), len(batches) * BATCH)
    assert_each_done_once(b, [probe["job_id"], after["job_id"]])
    assert_no_internal_errors(c)
    print(f"A stopped holding the lock ({stopped_holder[2]}); B placed after {placed_after:.1f}s, "
          f"A's session lost the lock after {released_after:.1f}s")


# ---- e. the loops' leader stopped past its lease -------------------------------------------

class HeldNodeList(HoldingProxy):
    """A proxy in front of the registry for one replica: it passes GETs on, except that,
    once armed, it holds the next node list request until released, then answers it
    with an empty list (every node gone), which the replica would write were it not
    refused."""

    def __init__(self, registry_url: str):
        self.armed = threading.Event()
        self.holding = threading.Event()
        release = threading.Event()
        lock = threading.Lock()
        armed, holding = self.armed, self.holding

        class Handler(QuietHandler):
            def do_GET(self):
                with lock:
                    hold = self.path.startswith("/nodes?") and armed.is_set()
                    if hold:
                        armed.clear()
                if hold:
                    holding.set()
                    release.wait(60)
                    status, body = 200, b"[]"
                else:
                    upstream = requests.get(registry_url + self.path, timeout=10)
                    status, body = upstream.status_code, upstream.content
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(Handler, release)


def node_list_synced(url: str) -> str:
    """When the scheduler's node list was last refreshed from the registry (ISO time)."""
    return max(n["synced_at"] for n in requests.get(url + "/nodes", timeout=5).json())


@pytest.mark.timeout(180)
def test_a_leader_stopped_past_its_lease_is_taken_over_and_its_late_writes_are_refused(ha, db):
    """Replica A leads the background loops and reads the node list through a proxy.
    It is stopped (SIGSTOP) in the middle of a pass, the proxy holding its node list
    request; B takes the loops over within the lease period (the lease row's holder
    and token change) and refreshes the node list from then on. Woken (SIGCONT), A's
    pass goes on with the answer the proxy sent meanwhile, an empty node list, and its
    write is refused: the node list, and a job placed on a node, stay as they were."""
    # A long lease: node-x, registered by the test and silent after, stays healthy throughout.
    c = ha(replicas=False, HEARTBEAT_TIMEOUT_SECS=30)
    proxy = HeldNodeList(c.registry_url)
    try:
        a = c.start_scheduler(REGISTRY_URL=proxy.url)
        wait_for(lambda: replica_of(c, holder_pid(loops_lease(db)[0])) == "scheduler", timeout=20,
                 message="replica A to lead the loops")
        b = c.start_scheduler(name=B)
        c.start_agent("node-1")
        # node-x has no agent yet: a job placed there stays placed and pending.
        requests.post(c.registry_url + "/nodes", json={"node_id": "node-x", "address": "127.0.0.1",
                                                        "kind": "compute", "slots": 1}, timeout=5).raise_for_status()
        c.wait_nodes_healthy("node-1", "node-x")
        parked = submit_acknowledged([b, a], {"command": "echo parked", "instance_id": "node-x"}, "parked")
        assert (parked["status"], parked["node_id"]) == ("pending", "node-x")

        _, token, _ = loops_lease(db)
        proxy.armed.set()
        wait_for(proxy.holding.is_set, timeout=10, message="A's pass to ask for the node list")
        c.procs["scheduler"].freeze()  # every thread: the one the answer wakes too
        stopped_at = time.monotonic()
        proxy.release.set()  # the empty list waits in A's socket
        try:
            holder, new_token, _ = wait_for(
                lambda: (lambda row: row if replica_of(c, holder_pid(row[0])) == B else None)(loops_lease(db)),
                timeout=LOOPS_LEASE_SECS + 10, message="B to take the loops over")
            took = time.monotonic() - stopped_at
            assert new_token > token and took <= LOOPS_LEASE_SECS + 3, (token, new_token, took)
            synced = node_list_synced(b)
            wait_for(lambda: node_list_synced(b) > synced, timeout=10, message="B to refresh the node list")
        finally:
            c.procs["scheduler"].signal(signal.SIGCONT)
        try:
            wait_for(lambda: "this write is refused" in c.procs["scheduler"].output(), timeout=30,
                     message="A's late write to be refused")
        except AssertionError as exc:
            # What each replica's loops did, beyond the log tail the cluster prints.
            said = {name: [line for line in c.procs[name].output().splitlines()
                           if "loops" in line or "lease" in line or "Error" in line]
                    for name in ("scheduler", B)}
            raise AssertionError(f"{exc}; lease row now {loops_lease(db)}; loops' log lines {said}") from None
        assert {"node-1", "node-x"} <= {n["node_id"] for n in requests.get(b + "/nodes", timeout=5).json()}
        still = requests.get(f"{b}/jobs/{parked['job_id']}", timeout=5).json()
        assert (still["status"], still["node_id"], still["attempt"]) == ("pending", "node-x", 1), still
        assert not any("unplaced" in e["reason"] for e in job_events(b, parked["job_id"]))
        assert loops_lease(db)[0] == holder  # B leads on
    finally:
        proxy.stop()
    c.start_agent("node-x")  # takes the job as it was placed: its first attempt
    done = wait_all_done(b, [parked["job_id"]], timeout=30)[parked["job_id"]]
    assert (done["stdout"], done["attempt"]) == ("parked\n", 1)
    assert_no_internal_errors(c)
    print(f"B took the loops over {took:.1f}s after A stopped (lease {LOOPS_LEASE_SECS:.0f}s)")
