"""Fair share through the API on each backend: which team's job takes a freed slot,
a team's share (PATCH /teams/{team}), GET /usage/fair-share under each role, and what
`why` says of it."""
import pytest
from scheduler_app import set_nodes
from teams_support import AGENT_SECRET, submit, three_teams

from corral.scheduler.store.usage import Ended
from corral.shared.credentials import node_token

HOUR = 3600.0


@pytest.fixture
def cluster(database_url):
    return make(database_url)


def make(database_url, **settings):
    cluster = three_teams(database_url, **settings)
    cluster.tokens["n1"] = node_token(AGENT_SECRET, "n1")
    set_nodes(cluster.store, cluster.clock, "n1", slots=1)
    return cluster


def used(cluster, team, user, core_seconds):
    """What earlier attempts of `user`'s in `team` reserved, as ended attempts add it."""
    with cluster.store.db.atomic():
        cluster.store.usage.add([Ended(team, user, 0.0, core_seconds, 0.0, core_seconds)], cluster.clock())
    cluster.store.fair_share.forget()


def run_to_done(cluster, job_id):
    for status in ("running", "done"):
        answer = cluster("n1", "POST", f"/jobs/{job_id}/status",
                         json={"node_id": "n1", "attempt": 1, "status": status, "exit_code": 0})
        assert answer.status_code == 200, answer.json


def node_of(cluster, job_id):
    return cluster("operator", "GET", f"/jobs/{job_id}").json["node_id"]


def test_a_freed_slot_goes_to_the_team_that_used_less_whoever_submitted_first(cluster):
    used(cluster, "ml", "bob", 10 * HOUR)
    first = submit(cluster, "bob")["job_id"]
    assert node_of(cluster, first) == "n1"
    older = [submit(cluster, "bob")["job_id"] for _ in range(2)]
    newer = submit(cluster, "carol")["job_id"]
    run_to_done(cluster, first)
    assert node_of(cluster, newer) == "n1" and [node_of(cluster, j) for j in older] == [None, None]
    run_to_done(cluster, newer)
    assert node_of(cluster, older[0]) == "n1"  # web alone waits no more: ml's turn


def test_within_a_team_a_freed_slot_goes_to_the_user_who_used_less(cluster):
    used(cluster, "ml", "bob", 10 * HOUR)
    first = submit(cluster, "alice")["job_id"]
    bobs = submit(cluster, "bob")["job_id"]
    alices = submit(cluster, "alice")["job_id"]
    run_to_done(cluster, first)  # alice's first attempt ran a moment: still far less than bob's ten hours
    assert node_of(cluster, alices) == "n1" and node_of(cluster, bobs) is None


def test_a_larger_share_takes_the_turn_for_the_same_usage(cluster):
    used(cluster, "ml", "bob", 2 * HOUR)
    used(cluster, "web", "carol", 3 * HOUR)
    first = submit(cluster, "operator")["job_id"]
    mls, webs = submit(cluster, "bob")["job_id"], submit(cluster, "carol")["job_id"]
    answer = cluster("operator", "PATCH", "/teams/web", json={"share": 2})
    assert answer.status_code == 200 and answer.json["share"] == 2
    run_to_done(cluster, first)
    assert node_of(cluster, webs) == "n1" and node_of(cluster, mls) is None


def test_with_fair_share_off_jobs_go_in_queue_order(database_url):
    cluster = make(database_url, fair_share_half_life_secs=0.0)
    used(cluster, "ml", "bob", 10 * HOUR)
    first = submit(cluster, "bob")["job_id"]
    older, newer = submit(cluster, "bob")["job_id"], submit(cluster, "carol")["job_id"]
    run_to_done(cluster, first)
    assert node_of(cluster, older) == "n1" and node_of(cluster, newer) is None
    assert cluster("operator", "GET", "/usage/fair-share").json["enabled"] is False


def test_fair_share_is_shown_to_whoever_may_see_the_team_and_in_why(cluster):
    used(cluster, "ml", "bob", 3 * HOUR)
    used(cluster, "web", "carol", HOUR)
    everything = cluster("operator", "GET", "/usage/fair-share").json
    assert everything["enabled"] is True and everything["half_life_secs"] == 7 * 86400
    assert [t["team"] for t in everything["teams"]] == ["default", "web", "ml"]  # the highest factor first
    ml = everything["teams"][2]
    assert ml["weight"] == 1 and ml["share"] == pytest.approx(1 / 3) and ml["usage_part"] == pytest.approx(0.75)
    assert ml["factor"] == pytest.approx(2 ** -(0.75 * 3)) and [u["user"] for u in ml["users"]] == ["bob"]
    assert ml["usage_core_seconds"] == pytest.approx(3 * HOUR, rel=0.01)
    for who, teams in (("carol", ["web"]), ("bob", ["ml"]), ("dave", ["default", "web", "ml"])):
        assert [t["team"] for t in cluster(who, "GET", "/usage/fair-share").json["teams"]] == teams, who
    blocker = submit(cluster, "carol")["job_id"]
    waiting = submit(cluster, "bob")["job_id"]
    assert node_of(cluster, blocker) == "n1"
    why = cluster("bob", "GET", f"/jobs/{waiting}/why").json
    assert why["fair_share"]["team"] == "ml" and [u["user"] for u in why["fair_share"]["users"]] == ["bob"]
    assert why["fair_share"]["factor"] == pytest.approx(ml["factor"], rel=0.01)


@pytest.mark.parametrize("body", [{"share": 0}, {"share": -1}, {"share": None}, {"share": "2"}, {"share": 1.5},
                                  {"share": 10_001}, {"share": True}])
def test_a_wrong_share_is_refused_and_changes_nothing(cluster, body):
    answer = cluster("operator", "PATCH", "/teams/ml", json=body)
    assert answer.status_code == 400 and "'share'" in answer.json["error"], answer.json
    assert [t["share"] for t in cluster("operator", "GET", "/teams").json] == [1, 1, 1]
    assert cluster("alice", "PATCH", "/teams/ml", json={"share": 5}).status_code == 403  # a team's admin may not
