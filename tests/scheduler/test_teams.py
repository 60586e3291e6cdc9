"""Users, teams and personal tokens through the scheduler's app (corral.server.principals,
personal_tokens.py, store/accounts.py): who owns a job, who sees and changes it, whose
env var values are shown, and which tokens are refused."""
import pytest
from teams_support import AGENT_SECRET, submit, three_teams

from corral.scheduler import personal_tokens


@pytest.fixture
def cluster(database_url):
    return three_teams(database_url)


def test_a_job_belongs_to_the_team_asked_for_or_the_users_default_and_names_its_submitter(cluster):
    assert {k: submit(cluster, "alice")[k] for k in ("team", "submitted_by")} == {"team": "ml",
                                                                                  "submitted_by": "alice"}
    assert submit(cluster, "bob")["team"] == "ml"  # his only team
    assert submit(cluster, "carol", team="web")["submitted_by"] == "carol"
    # The bootstrap token is the cluster admin `admin`, in `default` unless it names a team.
    assert {k: submit(cluster, "operator")[k] for k in ("team", "submitted_by")} == {"team": "default",
                                                                                     "submitted_by": "admin"}
    assert submit(cluster, "operator", team="web")["team"] == "web"


def test_a_member_may_not_submit_in_another_team_and_an_unknown_team_is_refused(cluster):
    before = cluster("operator", "GET", "/jobs").json
    answer = cluster("bob", "POST", "/jobs", json={"command": "true", "team": "web"})
    assert answer.status_code == 403 and "not a member of team 'web'" in answer.json["error"]
    answer = cluster("operator", "POST", "/jobs", json={"command": "true", "team": "nope"})
    assert answer.status_code == 400 and "no team 'nope'" in answer.json["error"]
    answer = cluster("operator", "POST", "/jobs", json={"command": "true", "team": "a:b"})
    assert answer.status_code == 400 and "team" in answer.json["error"]
    answer = cluster("dave", "POST", "/jobs", json={"command": "true"})
    assert answer.status_code == 403
    assert cluster("operator", "GET", "/jobs").json == before  # nothing was stored


def test_another_teams_job_is_not_found_on_every_route_that_names_it(cluster):
    job = submit(cluster, "alice", env_vars={"KEY": "secret"})["job_id"]
    for method, path in (("GET", f"/jobs/{job}"), ("GET", f"/jobs/{job}/why"), ("GET", f"/jobs/{job}/events"),
                         ("GET", f"/jobs/{job}/logs"), ("POST", f"/jobs/{job}/cancel"),
                         ("POST", f"/jobs/{job}/retry")):
        kwargs = {"json": {}} if method == "POST" else {}
        answer = cluster("carol", method, path, **kwargs)
        assert answer.status_code == 404, (path, answer.status_code)
        assert answer.json == {"error": f"no job {job!r}"}  # as for a job that does not exist
        assert cluster("carol", method, path.replace(job, "job-999999"), **kwargs).json == {
            "error": "no job 'job-999999'"}
    assert cluster("operator", "GET", f"/jobs/{job}").json["status"] == "pending"


def test_lists_show_a_member_their_teams_jobs_only_and_filter_by_team_and_submitter(cluster):
    mine = submit(cluster, "bob")["job_id"]
    colleague = submit(cluster, "alice")["job_id"]
    other = submit(cluster, "carol")["job_id"]

    def ids(who, query=""):
        answer = cluster(who, "GET", f"/jobs{query}")
        assert answer.status_code == 200, answer.json
        return [j["job_id"] for j in answer.json]

    assert ids("bob") == [mine, colleague]
    assert ids("bob", "?team=web") == []  # another team's list is empty, not a refusal that tells it exists
    assert ids("bob", "?submitted_by=bob") == [mine]
    assert ids("carol") == [other]
    assert ids("operator") == ids("dave") == ids("reader") == [mine, colleague, other]
    assert ids("operator", "?team=ml&submitted_by=alice") == [colleague]
    for bad in ("?team=a:b", "?submitted_by=%20x"):
        assert cluster("operator", "GET", f"/jobs{bad}").status_code == 400


def test_env_var_values_show_to_the_submitter_team_admins_and_cluster_admins_only(cluster):
    job = submit(cluster, "bob", env_vars={"KEY": "secret"})["job_id"]
    seen = {who: cluster(who, "GET", f"/jobs/{job}").json["env_vars"]
            for who in ("bob", "bob-read", "alice", "operator", "dave", "reader")}
    assert seen == {"bob": {"KEY": "secret"}, "bob-read": {"KEY": "secret"}, "alice": {"KEY": "secret"},
                    "operator": {"KEY": "secret"}, "dave": {"KEY": "(hidden)"}, "reader": {"KEY": "(hidden)"}}
    theirs = submit(cluster, "alice", env_vars={"KEY": "hers"})["job_id"]
    assert cluster("bob", "GET", f"/jobs/{theirs}").json["env_vars"] == {"KEY": "(hidden)"}
    listed = {j["job_id"]: j["env_vars"] for j in cluster("bob", "GET", "/jobs").json}
    assert listed == {job: {"KEY": "secret"}, theirs: {"KEY": "(hidden)"}}


def test_a_member_cancels_their_own_jobs_and_a_team_admin_any_of_the_team(cluster):
    hers = submit(cluster, "alice")["job_id"]
    his = submit(cluster, "bob")["job_id"]
    answer = cluster("bob", "POST", f"/jobs/{hers}/cancel", json={})
    assert answer.status_code == 403 and "only its submitter (alice)" in answer.json["error"]
    assert cluster("operator", "GET", f"/jobs/{hers}").json["status"] == "pending"
    assert cluster("bob-read", "POST", f"/jobs/{his}/cancel", json={}).status_code == 403
    assert cluster("dave", "POST", f"/jobs/{his}/cancel", json={}).status_code == 403
    assert cluster("bob", "POST", f"/jobs/{his}/cancel", json={}).json["status"] == "cancelled"
    assert cluster("alice", "POST", f"/jobs/{hers}/cancel", json={}).json["status"] == "cancelled"
    third = submit(cluster, "bob")["job_id"]
    assert cluster("alice", "POST", f"/jobs/{third}/cancel", json={}).json["status"] == "cancelled"


def test_arrays_follow_their_jobs_team(cluster):
    array = submit(cluster, "bob", array={"count": 2})["array_id"]
    assert cluster("carol", "GET", f"/arrays/{array}").status_code == 404
    assert cluster("carol", "POST", f"/arrays/{array}/cancel", json={}).status_code == 404
    assert cluster("alice", "GET", f"/arrays/{array}").status_code == 200
    assert cluster("bob", "POST", f"/arrays/{array}/cancel", json={}).json["jobs"]["cancelled"] == 2


def test_a_read_only_token_reads_and_changes_nothing(cluster):
    answer = cluster("bob-read", "POST", "/jobs", json={"command": "true"})
    assert answer.status_code == 403 and answer.json == {"error": "a read-only token may not change anything"}
    assert cluster("bob-read", "GET", "/jobs").status_code == 200


def test_revoked_expired_and_made_up_personal_tokens_are_refused(cluster):
    accounts, clock = cluster.store.accounts, cluster.clock
    _, secret = accounts.create_token("bob", "short", "full", clock() + 60, "admin", clock())
    cluster.tokens["short"] = secret
    assert cluster("short", "GET", "/jobs").status_code == 200
    clock.now += 61
    _forget(cluster)
    assert cluster("short", "GET", "/jobs").status_code == 401
    # Revoked: refused once the cache forgets (within TTL_SECS on every process).
    accounts.revoke_token(cluster_token_id(cluster, "bob", "laptop"), clock())
    _forget(cluster)
    assert cluster("bob", "GET", "/jobs").status_code == 401
    alice = cluster.tokens["alice"]
    altered = alice[:-1] + ("B" if alice.endswith("A") else "A")  # one character off (never the same token)
    for made_up in (personal_tokens.PREFIX + "x" * 43, altered,
                    personal_tokens.PREFIX, "corral_pat_" + "\u00e9" * 10):
        cluster.tokens["made-up"] = made_up
        answer = cluster("made-up", "GET", "/jobs")
        assert answer.status_code == 401 and answer.json == {"error": "the bearer token is not valid"}
    # A user deleted: every token of theirs stops working.
    accounts.delete_user("carol", clock())
    _forget(cluster)
    assert cluster("carol", "GET", "/jobs").status_code == 401


def test_only_the_digest_of_a_token_is_stored(cluster):
    from corral.scheduler.models import ApiToken
    rows = list(ApiToken.select())
    secrets = set(cluster.tokens.values())
    for row in rows:
        assert not set(row.__data__.values()) & secrets
        assert len(row.secret_sha256) == 64
    assert all(s.startswith(personal_tokens.PREFIX) and len(s) >= 50
               for k, s in cluster.tokens.items() if k not in ("operator", "reader"))


def test_a_tokens_use_is_noted_to_the_minute(cluster):
    accounts, clock = cluster.store.accounts, cluster.clock
    token_id = cluster_token_id(cluster, "alice", "laptop")
    assert accounts.token(token_id).last_used_at is None
    cluster("alice", "GET", "/jobs")
    assert accounts.token(token_id).last_used_at == clock()
    first = clock()
    clock.now += 30
    _forget(cluster)
    cluster("alice", "GET", "/jobs")
    assert accounts.token(token_id).last_used_at == first  # less than a minute later: no write
    clock.now += 31
    _forget(cluster)
    cluster("alice", "GET", "/jobs")
    assert accounts.token(token_id).last_used_at == clock()


def test_the_cache_answers_within_its_time_without_the_database(cluster):
    calls = []
    cache = personal_tokens.TokenCache(lambda digest: calls.append(digest) or None, ttl=2.0,
                                       clock=lambda: now[0])
    now = [0.0]
    secret = personal_tokens.new_secret()
    assert cache(secret) is None and cache(secret) is None and len(calls) == 1
    now[0] = 2.0
    cache(secret)
    assert len(calls) == 2
    assert cache("not-personal") is None and len(calls) == 2  # other forms never reach the database
    assert calls[0] == personal_tokens.digest(secret) != secret


def cluster_token_id(cluster, user, name):
    return next(t.token_id for t in cluster.store.accounts.tokens(user) if t.name == name)


def _forget(cluster):
    cluster.app.extensions["corral.tokens"].forget()


def test_users_make_list_and_revoke_their_own_tokens_and_admins_anyones(cluster):
    made = cluster("bob", "POST", "/tokens", json={"name": "ci", "scope": "read", "expires_in_secs": 3600})
    assert made.status_code == 201, made.json
    token = made.json
    assert token["user"] == "bob" and token["created_by"] == "bob" and token["scope"] == "read"
    assert token["token"].startswith(personal_tokens.PREFIX) and token["expires_at"] is not None
    cluster.tokens["new"] = token["token"]
    assert cluster("new", "GET", "/whoami").json == {
        "user": "bob", "cluster_role": None, "teams": [{"team": "ml", "role": "member"}], "default_team": None,
        "token_id": token["token_id"], "read_only": True}
    listed = cluster("bob", "GET", "/tokens").json
    assert token["token_id"] in {t["token_id"] for t in listed}
    assert all("token" not in t and t["user"] == "bob" for t in listed)
    assert cluster("carol", "GET", "/tokens?user=bob").json == []
    assert {t["user"] for t in cluster("operator", "GET", "/tokens").json} == {"alice", "bob", "carol", "dave"}
    # Another user's token: no such token for a member, revocable by an admin.
    assert cluster("carol", "DELETE", f"/tokens/{token['token_id']}", json={}).status_code == 404
    assert cluster("carol", "POST", "/tokens", json={"name": "x", "user": "bob"}).status_code == 403
    assert cluster("operator", "POST", "/tokens", json={"name": "x"}).status_code == 400  # admin holds none
    for bad in ({}, {"name": "x", "scope": "all"}, {"name": "x", "expires_in_secs": 0}, {"name": "x", "user": "a:b"}):
        assert cluster("bob", "POST", "/tokens", json=bad).status_code == 400, bad
    revoked = cluster("bob", "DELETE", f"/tokens/{token['token_id']}", json={})
    assert revoked.status_code == 200 and revoked.json["revoked_at"] is not None
    assert cluster("new", "GET", "/whoami").status_code == 401  # at once in the process that revoked it
    made = cluster("operator", "POST", "/tokens", json={"name": "for-carol", "user": "carol"}).json
    assert made["user"] == "carol" and made["created_by"] == "admin"


def test_whoami_of_the_bootstrap_tokens(cluster):
    assert cluster("operator", "GET", "/whoami").json == {
        "user": "admin", "cluster_role": "admin", "teams": [], "default_team": None, "token_id": None,
        "read_only": False}
    assert cluster("reader", "GET", "/whoami").json["cluster_role"] == "reader"


def test_an_admin_provisions_teams_users_and_tokens_over_the_api(cluster):
    assert cluster("operator", "POST", "/teams", json={"name": "data"}).status_code == 201
    assert cluster("operator", "POST", "/teams", json={"name": "data"}).status_code == 409
    made = cluster("operator", "POST", "/users", json={"name": "erin@example.com", "teams": {"data": "member"},
                                                       "default_team": "data"})
    assert made.status_code == 201, made.json
    assert made.json["teams"] == [{"team": "data", "role": "member"}]
    for bad in ({"name": "admin"}, {"name": "x", "teams": {"nope": "member"}},
                {"name": "x", "teams": {"data": "boss"}}, {"name": "x", "default_team": "data"}):
        assert cluster("operator", "POST", "/users", json=bad).status_code in (400, 409), bad
    assert "x" not in {u["name"] for u in cluster("operator", "GET", "/users").json}
    secret = cluster("operator", "POST", "/tokens", json={"name": "first", "user": "erin@example.com"}).json["token"]
    cluster.tokens["erin"] = secret
    assert submit(cluster, "erin")["team"] == "data"
    # Members: only cluster admins and the team's admins change them.
    assert cluster("bob", "PUT", "/teams/data/members/bob", json={"role": "admin"}).status_code == 403
    assert cluster("alice", "PUT", "/teams/ml/members/erin@example.com", json={}).status_code == 200
    assert cluster("erin", "GET", "/whoami").json["teams"] == [{"team": "data", "role": "member"},
                                                              {"team": "ml", "role": "member"}]
    assert cluster("alice", "DELETE", "/teams/ml/members/erin@example.com", json={}).status_code == 204
    assert cluster("erin", "GET", "/whoami").json["teams"] == [{"team": "data", "role": "member"}]
    assert cluster("bob", "POST", "/teams", json={"name": "mine"}).status_code == 403
    assert cluster("bob", "POST", "/users", json={"name": "mallory", "cluster_role": "admin"}).status_code == 403
    assert cluster("operator", "DELETE", "/teams/data", json={}).status_code == 409  # it has members and jobs
    assert cluster("operator", "DELETE", "/users/erin@example.com", json={}).status_code == 204
    assert cluster("erin", "GET", "/whoami").status_code == 401


def test_a_nodes_agent_acts_for_no_user_and_gets_its_jobs_whole(cluster):
    from scheduler_app import set_nodes

    from corral.shared.credentials import node_token
    set_nodes(cluster.store, cluster.clock, "n1")
    job = submit(cluster, "bob", env_vars={"KEY": "secret"})
    cluster.tokens["n1"] = node_token(AGENT_SECRET, "n1")
    claimed = cluster("n1", "POST", "/nodes/n1/claim", json={"max": 1, "wait_secs": 0})
    assert claimed.status_code == 200, claimed.json
    assert [j["env_vars"] for j in claimed.json] == [{"KEY": "secret"}]
    report = cluster("n1", "POST", f"/jobs/{job['job_id']}/status",
                     json={"node_id": "n1", "attempt": 1, "status": "running"})
    assert report.status_code == 200, report.json
    assert report.json["env_vars"] == {"KEY": "secret"} and report.json["submitted_by"] == "bob"
    # A node credential is no user: it makes no token and reads no other route of users.
    assert cluster("n1", "GET", "/whoami").status_code == 403
    assert cluster("n1", "POST", "/tokens", json={"name": "x"}).status_code == 403


def test_a_schedule_belongs_to_a_team_and_its_runs_to_the_team_and_its_maker(cluster):
    from corral.scheduler.models import Job
    from corral.scheduler.schedules import Schedules

    nightly = {"name": "nightly", "interval_secs": 60, "job": {"command": "true", "env_vars": {"K": "secret"}}}
    assert cluster("bob", "POST", "/schedules", json=nightly).status_code == 403  # a member makes none
    assert cluster("carol", "POST", "/schedules", json=dict(nightly, team="ml")).status_code == 403
    made = cluster("alice", "POST", "/schedules", json=nightly)
    assert made.status_code == 201 and (made.json["team"], made.json["created_by"]) == ("ml", "alice")
    # Its team sees it (the template's secrets for its admins only), another team does not.
    assert cluster("bob", "GET", "/schedules/nightly").json["job"]["env_vars"] == {"K": "(hidden)"}
    assert cluster("alice", "GET", "/schedules/nightly").json["job"]["env_vars"] == {"K": "secret"}
    assert [s["name"] for s in cluster("bob", "GET", "/schedules").json] == ["nightly"]
    assert cluster("carol", "GET", "/schedules").json == []
    for method, path, body in (("GET", "/schedules/nightly", None), ("GET", "/schedules/nightly/runs", None),
                               ("PATCH", "/schedules/nightly", {"enabled": False}),
                               ("DELETE", "/schedules/nightly", {})):
        assert cluster("carol", method, path, json=body).status_code == 404, (method, path)
    assert cluster("bob", "PATCH", "/schedules/nightly", json={"enabled": False}).status_code == 403
    assert cluster("bob", "DELETE", "/schedules/nightly", json={}).status_code == 403
    # Its runs are the team's jobs, submitted by its maker.
    schedule_id = cluster.store.db.execute_sql("SELECT id FROM schedule WHERE name = 'nightly'").fetchone()[0]
    cluster.clock.now += 120
    fired = Schedules(cluster.store).fire(schedule_id, cluster.clock(), cluster.clock(), 10)
    assert fired.created
    assert {(job.team, job.submitted_by) for job in Job.select().where(Job.id.in_(fired.created))} == {
        ("ml", "alice")}
    assert cluster("alice", "PATCH", "/schedules/nightly", json={"enabled": False}).status_code == 200
    assert cluster("alice", "DELETE", "/schedules/nightly", json={}).status_code == 204


def test_a_concurrency_limit_belongs_to_a_team_whose_jobs_alone_use_its_key(cluster):
    assert cluster("bob", "PUT", "/concurrency/gpu", json={"limit": 2}).status_code == 403
    made = cluster("alice", "PUT", "/concurrency/gpu", json={"limit": 2})
    assert made.status_code == 200 and made.json["team"] == "ml"
    assert [row["key"] for row in cluster("bob", "GET", "/concurrency").json] == ["gpu"]
    assert cluster("carol", "GET", "/concurrency").json == []
    # Another team can neither take the key over, nor remove it, nor use it.
    assert cluster("carol", "PUT", "/concurrency/gpu", json={"limit": 100}).status_code == 409
    cluster("operator", "PUT", "/teams/web/members/carol", json={"role": "admin"})
    cluster.app.extensions["corral.tokens"].forget()
    answer = cluster("carol", "PUT", "/concurrency/gpu", json={"limit": 100})
    assert answer.status_code == 409 and "ml" not in answer.json["error"]
    assert cluster("carol", "DELETE", "/concurrency/gpu", json={}).status_code == 404
    answer = cluster("carol", "POST", "/jobs", json={"command": "true", "concurrency_key": "gpu"})
    assert answer.status_code == 403 and "another team" in answer.json["error"]
    assert submit(cluster, "bob", concurrency_key="gpu")["concurrency_key"] == "gpu"
    assert cluster("operator", "GET", "/concurrency").json[0]["limit"] == 2
    assert cluster("alice", "PUT", "/concurrency/gpu", json={"limit": 3, "team": "web"}).status_code == 409
    assert cluster("alice", "DELETE", "/concurrency/gpu", json={}).status_code == 204


def test_a_member_streams_the_events_of_their_teams_jobs_one_job_at_a_time(cluster):
    job = submit(cluster, "bob")["job_id"]
    answer = cluster("carol", "GET", "/events", query_string={"job_id": job})
    assert answer.status_code == 404  # another team's job, as one that does not exist
    answer = cluster("bob", "GET", "/events")
    assert answer.status_code == 403 and "job_id" in answer.json["error"]
    for who in ("bob", "alice", "dave", "operator"):
        answer = cluster(who, "GET", "/events", query_string={"job_id": job})
        assert answer.status_code == 200 and answer.mimetype == "text/event-stream", who
        answer.close()
    answer = cluster("dave", "GET", "/events")  # a cluster-wide reader sees the whole cluster
    assert answer.status_code == 200
    answer.close()

