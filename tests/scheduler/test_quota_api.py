"""Team quotas through the API on each backend: PUT, GET and DELETE /teams/{team}/quota
under each role, bodies no client should send, placement within the quotas
(`pending_reason: quota`) and what `why` shows of them."""
import pytest
from scheduler_app import set_nodes
from teams_support import submit, three_teams

from corral.scheduler.service import Scheduler

QUOTA = {"guaranteed": {"jobs": 1, "cpu_percent": 200}, "borrowing_limit": {"jobs": 1}, "lending_limit": {"jobs": 0}}


@pytest.fixture
def cluster(database_url):
    return three_teams(database_url, max_jobs_per_node=8)


def put(cluster, team, body, who="operator"):
    return cluster(who, "PUT", f"/teams/{team}/quota", json=body)


def place(cluster):
    """What the background pass does: place, then give the jobs it left their reasons."""
    Scheduler(cluster.store).place(cluster.clock())
    cluster.store.placing.explain(cluster.clock())


def test_an_admin_sets_reads_and_removes_a_quota_and_members_read_their_teams_only(cluster):
    empty = cluster("operator", "GET", "/teams/ml/quota")
    assert empty.status_code == 200 and empty.json["guaranteed"] == {} and empty.json["used"]["jobs"] == 0
    answer = put(cluster, "ml", QUOTA)
    assert answer.status_code == 200, answer.json
    assert {k: answer.json[k] for k in ("team", "guaranteed", "borrowing_limit", "lending_limit")} == {
        "team": "ml", **QUOTA}
    for who in ("alice", "bob", "bob-read", "dave", "reader"):
        assert cluster(who, "GET", "/teams/ml/quota").json["guaranteed"] == QUOTA["guaranteed"], who
    # Another team's quota (and its usage) is not shown to a member, as its jobs are not.
    assert cluster("carol", "GET", "/teams/ml/quota").json == {"error": "no team 'ml'"}
    assert cluster("carol", "GET", "/teams/nope/quota").json == {"error": "no team 'nope'"}
    # Only cluster admins set or remove one: a team's own admin may not raise it.
    for who in ("alice", "bob", "carol", "dave", "reader", "bob-read"):
        assert put(cluster, "ml", {"guaranteed": {"jobs": 100}}, who).status_code == 403, who
        assert cluster(who, "DELETE", "/teams/ml/quota", json={}).status_code == 403, who
    assert cluster("operator", "GET", "/teams/ml/quota").json["guaranteed"] == QUOTA["guaranteed"]
    assert cluster("operator", "DELETE", "/teams/ml/quota", json={}).status_code == 204
    assert cluster("operator", "GET", "/teams/ml/quota").json["guaranteed"] == {}
    assert cluster("operator", "DELETE", "/teams/ml/quota", json={}).json == {"error": "team 'ml' has no quota"}
    assert put(cluster, "nope", QUOTA).json == {"error": "no team 'nope'"}


@pytest.mark.parametrize("body, error", [
    ({"guaranteed": {"jobs": -1}}, "'jobs' must be between 0 and"),
    ({"guaranteed": {"gpu": 1}}, "unknown field 'gpu'; allowed fields: cpu_percent, gpus, jobs, memory_mb"),
    ({"guaranteed": {"jobs": "3"}}, "'jobs'"),
    ({"guaranteed": {"jobs": 1.5}}, "'jobs'"),
    ({"guaranteed": {"jobs": True}}, "'jobs'"),
    ({"borrowing_limit": {"memory_mb": 1 << 60}}, "'memory_mb' must be between 0 and"),
    ({"guaranteed": {"jobs": 1}, "lending_limit": {"jobs": 2}}, "lending_limit.jobs 2 is over guaranteed.jobs 1"),
    ({"lending_limit": {"cpu_percent": 1}}, "lending_limit.cpu_percent 1 is over guaranteed.cpu_percent 0"),
    ({"guaranteed": [1]}, "'guaranteed'"),
    ({"quota": {}}, "unknown field 'quota'"),
])
def test_a_wrong_quota_is_refused_with_its_reason_and_changes_nothing(cluster, body, error):
    assert put(cluster, "ml", QUOTA).status_code == 200
    answer = put(cluster, "ml", body)
    assert answer.status_code == 400 and error in answer.json["error"], answer.json
    assert cluster("operator", "GET", "/teams/ml/quota").json["guaranteed"] == QUOTA["guaranteed"]
    assert cluster("operator", "PUT", "/teams/ml/quota", data=b"\xff{", content_type="application/json"
                   ).status_code == 400


def test_placement_keeps_a_team_within_its_guarantee_plus_borrowing_and_why_says_so(cluster):
    set_nodes(cluster.store, cluster.clock, "n1", slots=4)
    assert put(cluster, "ml", QUOTA).status_code == 200
    jobs = [submit(cluster, "bob") for _ in range(3)]
    shown = [cluster("bob", "GET", f"/jobs/{j['job_id']}").json for j in jobs]
    assert [j["node_id"] for j in shown[:2]] == ["n1", "n1"] and shown[2]["node_id"] is None
    place(cluster)
    waiting = cluster("bob", "GET", f"/jobs/{jobs[2]['job_id']}").json["pending_reason"]
    assert waiting["code"] == "quota" and waiting["team"] == "ml" and waiting["resource"] == "jobs", waiting
    assert "over its guarantee of 1 running jobs plus borrowing limit of 1 running jobs" in waiting["message"]
    listed = cluster("bob", "GET", "/jobs", query_string={"pending_reason": "quota"}).json
    assert [j["job_id"] for j in listed] == [jobs[2]["job_id"]]
    why = cluster("bob", "GET", f"/jobs/{jobs[2]['job_id']}/why").json
    assert why["quota"]["used"]["jobs"] == 2 and why["quota"]["borrowed"]["jobs"] == 1
    assert why["quota"]["guaranteed"] == QUOTA["guaranteed"]
    # Another team is not held back by ml's quota.
    assert submit(cluster, "carol")["node_id"] == "n1"
    # Without the quota, the job goes at the next placement.
    assert cluster("operator", "DELETE", "/teams/ml/quota", json={}).status_code == 204
    place(cluster)
    assert cluster("bob", "GET", f"/jobs/{jobs[2]['job_id']}").json["node_id"] == "n1"


def test_what_a_team_keeps_of_its_guarantee_is_not_borrowed_and_it_still_places_its_own(cluster):
    set_nodes(cluster.store, cluster.clock, "n1", slots=4)
    assert put(cluster, "web", {"guaranteed": {"jobs": 2}, "lending_limit": {"jobs": 0}}).status_code == 200
    ml = [submit(cluster, "bob") for _ in range(3)]
    place(cluster)
    placed = [cluster("bob", "GET", f"/jobs/{j['job_id']}").json for j in ml]
    assert [j["node_id"] for j in placed] == ["n1", "n1", None]
    reason = placed[2]["pending_reason"]
    assert reason["code"] == "quota" and reason["kept_by"] == ["web"], reason
    assert "of the 2 running jobs free, 2 running jobs is kept for the guarantees of web" in reason["message"]
    web = [submit(cluster, "carol")["job_id"] for _ in range(2)]
    place(cluster)  # a submit's own placement looks no further than the free slots down the queue
    assert [cluster("carol", "GET", f"/jobs/{j}").json["node_id"] for j in web] == ["n1", "n1"]


def test_without_quotas_why_shows_none_and_placement_is_as_before(cluster):
    set_nodes(cluster.store, cluster.clock, "n1", slots=2)
    jobs = [submit(cluster, "bob") for _ in range(3)]
    assert [j["node_id"] for j in jobs] == ["n1", "n1", None]
    why = cluster("bob", "GET", f"/jobs/{jobs[2]['job_id']}/why").json
    assert why["quota"] is None and why["pending_reason"]["code"] == "no_capacity"


def test_the_capacity_quotas_lend_from_follows_the_node_list_at_once(cluster):
    """A placement on some nodes only (a report's, a claim's) reuses the cluster's capacity
    for a moment rather than reading every node; a node that comes, goes or is drained
    through this scheduler counts at once all the same."""
    reads = cluster.store.snapshot
    set_nodes(cluster.store, cluster.clock, "n1", slots=4)
    assert reads.capacity()["jobs"] == 4
    set_nodes(cluster.store, cluster.clock, "n1", "n2", slots=4)
    assert reads.capacity()["jobs"] == 8
    cluster.store.nodes.sync_nodes([{"node_id": "n1", "address": "127.0.0.1", "kind": "compute", "slots": 4,
                                     "status": "healthy"}], cluster.clock())
    assert reads.capacity()["jobs"] == 4
    cluster.store.nodes.set_drained("n1", True, cluster.clock())
    assert reads.capacity()["jobs"] == 0
