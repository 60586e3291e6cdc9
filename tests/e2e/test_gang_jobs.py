"""Multi-node jobs on real hosts, on each database: three agents, each in a network
namespace of its own with its own address; a job of `nodes: 3` starts a member on each,
and a real rendezvous (rank 0 listens on MASTER_ADDR:MASTER_PORT, the others connect and
send their ranks, rank 0 answers with what it met) proves that every member was told the
right addresses and ranks. A member that fails ends the others, which are stopped with
their signal long before they would end on their own."""
import os
import textwrap
import urllib.parse

import pytest

from cluster import BIN, wait_scheduler_sees_healthy
from helpers import wait_for
from lab_cluster import OPERATOR_TOKEN, REGISTRY, SCHEDULER, api, lab_of, start, start_servers

pytestmark = [pytest.mark.e2e, pytest.mark.root]

# The rendezvous a distributed launcher does, in a few lines: rank 0 serves on the master
# address and port; every other rank connects (retrying until rank 0 listens, as torchrun
# does), says its rank and address, and is told the world rank 0 met.
RENDEZVOUS = textwrap.dedent("""\
    import os, socket, time
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    master = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    hosts = os.environ["CORRAL_GANG_HOSTS"].split(",")
    assert os.environ["CORRAL_GANG_RANK"] == os.environ["NODE_RANK"] == str(rank)
    assert int(os.environ["CORRAL_GANG_SIZE"]) == size == len(hosts) and hosts[0] == master[0]
    if rank == 0:
        server = socket.create_server(master)
        server.settimeout(60)
        met, conns = {}, []
        while len(met) < size - 1:
            conn, (peer, _) = server.accept()
            said = conn.makefile().readline().split()
            met[int(said[0])] = said[1] + "@" + peer
            conns.append(conn)
        world = " ".join(f"{r}={met[r]}" for r in sorted(met))
        for conn in conns:
            conn.sendall(f"{world}\\n".encode())
            conn.close()
        print(f"rank 0 of {size} on {master[0]}:{master[1]} met {world}")
    else:
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = socket.create_connection(master, timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        conn.sendall(f"{rank} {hosts[rank]}\\n".encode())
        print(f"rank {rank} of {size} was told {conn.makefile().readline().strip()}")
""")


@pytest.fixture
def lab(tmp_path):
    yield from lab_of(tmp_path, agents=3)


@pytest.fixture
def lab_database_url(database_url, request):
    """The test's database as the control-plane host reaches it: PostgreSQL through its
    Unix socket (the session's server listens on the root namespace's loopback only)."""
    if not database_url.startswith("postgresql"):
        return database_url
    server = request.getfixturevalue("pg_server")
    parts = urllib.parse.urlsplit(database_url)
    return f"postgresql://{parts.username}@:{server.port}{parts.path}?host={server.base_dir}"


def cluster(lab, procs, dirs, database_url):
    """The servers on `database_url` and three agents, every one healthy to the scheduler."""
    start_servers(lab, procs, dirs, {"DATABASE_URL": database_url} if database_url.startswith("postgresql") else {},
                  DATABASE_URL=database_url, NODE_REFRESH_SECS=0.3, DISPATCH_INTERVAL_SECS=0.2,
                  TIMEOUT_CHECK_SECS=0.5, RETRY_BASE_SECS=0.2, JOB_KILL_GRACE_SECS=1)
    for i, ns in enumerate(lab.agent_ns):
        start(lab, procs, dirs, f"host-{i + 1}", ns, [os.path.join(BIN, "corral-agent")],
              NODE_ID=f"host-{i + 1}", REGISTRY_URL=REGISTRY, SCHEDULER_URL=SCHEDULER, AGENT_SLOTS=2,
              POLL_INTERVAL_SECS=0.2, HEARTBEAT_INTERVAL_SECS=0.5, AGENT_KILL_GRACE_SECS=1)
    wait_scheduler_sees_healthy(SCHEDULER, ("host-1", "host-2", "host-3"), timeout=30, token=OPERATOR_TOKEN)
    return {f"host-{i + 1}": address for i, address in enumerate(lab.agent_addr)}


def job(job_id):
    answer = api.get(f"{SCHEDULER}/jobs/{job_id}", timeout=5)
    assert answer.status_code == 200, answer.text
    return answer.json()


def ended(job_id, timeout=60):
    return wait_for(lambda: (lambda j: j if j["status"] in ("done", "failed", "cancelled") else None)(job(job_id)),
                    timeout=timeout, message=f"{job_id} to end")


def whole_log(job_id):
    answer = api.get(f"{SCHEDULER}/jobs/{job_id}/logs", timeout=5)
    assert answer.status_code == 200, answer.text
    return answer.content.decode(), answer.headers["X-Corral-Log-Complete"]


def test_three_members_start_together_rendezvous_and_a_failing_member_ends_the_others(
        lab, lab_database_url, shared_dir):
    lab, procs, dirs = lab
    addresses = cluster(lab, procs, dirs, lab_database_url)
    program = os.path.join(shared_dir, "rendezvous.py")
    with open(program, "w") as f:
        f.write(RENDEZVOUS)
    os.chmod(program, 0o644)

    submitted = api.post(f"{SCHEDULER}/jobs", json={"command": f"python3 {program}", "nodes": 3}, timeout=10)
    assert submitted.status_code == 201, submitted.text
    gang = ended(submitted.json()["job_id"])
    assert gang["status"] == "done", gang
    members = gang["members"]
    assert [m["rank"] for m in members] == [0, 1, 2] and all(m["status"] == "done" for m in members), members
    assert {m["node_id"] for m in members} == set(addresses)
    hosts = [addresses[m["node_id"]] for m in members]
    port = job(members[0]["job_id"])["gang"]["master_port"]
    world = f"1={hosts[1]}@{hosts[1]} 2={hosts[2]}@{hosts[2]}"
    assert members[0]["stdout_tail"] == f"rank 0 of 3 on {hosts[0]}:{port} met {world}\n", members
    for rank in (1, 2):
        assert members[rank]["stdout_tail"] == f"rank {rank} of 3 was told {world}\n", members
    assert gang["stdout"] == members[0]["stdout_tail"]
    # Every member's complete output is served like any job's.
    wait_for(lambda: whole_log(members[2]["job_id"]) == (members[2]["stdout_tail"], "true"), timeout=20,
             message="member 2's complete log")

    # Rank 1 fails once every member runs; the others would sleep for a minute, and note it
    # when they are stopped instead.
    notes = os.path.join(shared_dir, "notes")
    open(notes, "w").close()
    os.chmod(notes, 0o666)  # each member runs under a uid of its own
    failing = (f'trap "echo stopped-$RANK >> {notes}; exit 143" TERM; echo started-$RANK >> {notes}; '
               f'if [ "$RANK" = 1 ]; then for i in $(seq 200); do [ $(grep -c started {notes}) = 3 ] && break; '
               'sleep 0.1; done; echo "rank 1 gives up" >&2; exit 3; fi; sleep 60 & wait')
    submitted = api.post(f"{SCHEDULER}/jobs", json={"command": failing, "nodes": 3, "max_retries": 0},
                         timeout=10)
    assert submitted.status_code == 201, submitted.text
    failed = ended(submitted.json()["job_id"], timeout=40)
    assert failed["status"] == "failed" and failed["exit_code"] == 3 and failed["stderr"] == "rank 1 gives up\n"
    by_rank = {m["rank"]: m for m in failed["members"]}
    assert by_rank[1]["status"] == "failed" and by_rank[1]["exit_code"] == 3
    assert by_rank[0]["status"] == by_rank[2]["status"] == "cancelled", failed["members"]
    assert by_rank[0]["ended_by"] == by_rank[2]["ended_by"] == "cancel", failed["members"]
    # Their agents stop them with their signal: each notes it long before its minute is up.
    wait_for(lambda: sorted(open(notes).read().split()) == [
        "started-0", "started-1", "started-2", "stopped-0", "stopped-2"], timeout=20,
        message="members 0 and 2 to be stopped")
