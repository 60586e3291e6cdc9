"""`corral admin user|team|token …`: the request bodies against the contract's models
(UserRequest, TeamRequest, TeamChange, MemberRequest, TokenRequest), the tables, and a
token's secret printed once."""
import json

import pytest
from responses import matchers

from cli_support import SCHED, corral, iso, one_line_error
from corral.scheduler.contract import TeamChange

ALICE = {"name": "alice", "cluster_role": None, "default_team": "ml", "created_at": iso(3600),
         "teams": [{"team": "ml", "role": "admin"}, {"team": "web", "role": "member"}]}
ML = {"name": "ml", "created_at": iso(7200), "members": [{"user": "alice", "role": "admin"},
                                                         {"user": "bob", "role": "member"}]}
TOKEN = {"token_id": "tok-3f9a0c1b2d4e5f60", "user": "alice", "name": "laptop", "scope": "full",
         "created_at": iso(0), "created_by": "admin", "expires_at": None, "revoked_at": None, "last_used_at": None}
SECRET = "corral_pat_9f8e7d6c5b4a"


def body(expected: dict):
    return [matchers.json_params_matcher(expected, strict_match=True)]


# ---- users ----------------------------------------------------------------------------------

def test_user_create_sends_the_user_request(mock):
    mock.post(f"{SCHED}/users", json=ALICE, status=201, match=body(
        {"name": "alice", "teams": {"ml": "admin", "web": "member"}, "default_team": "ml",
         "cluster_role": "reader"}))
    result = corral("admin", "user", "create", "alice", "--team", "ml:admin", "--team", "web",
                    "--default-team", "ml", "--cluster-role", "reader")
    assert result.exit_code == 0, result.output
    assert result.stdout == "alice: teams ml (admin), web (member), default team ml, cluster role -\n"
    assert "corral admin token create --user alice" in result.stderr


def test_user_create_with_a_name_alone_sends_the_name_alone(mock):
    mock.post(f"{SCHED}/users", json=dict(ALICE, teams=[], default_team=None), status=201,
              match=body({"name": "alice"}))
    result = corral("admin", "user", "create", "alice", "--json")
    assert json.loads(result.stdout)["name"] == "alice"


@pytest.mark.parametrize("value, message", [("ml:owner", "the role after ':' is member or admin"),
                                            ("a b:admin", "must be letters, digits")])
def test_a_bad_team_membership_is_refused_before_anything_is_sent(mock, value, message):
    line = one_line_error(corral("admin", "user", "create", "alice", "--team", value), code=2)
    assert line.startswith(f"corral: --team {value!r}: ") and message in line


def test_user_list_is_a_table(mock):
    mock.get(f"{SCHED}/users", json=[ALICE, {"name": "dave", "cluster_role": "reader", "default_team": None,
                                             "created_at": iso(60), "teams": []}])
    lines = corral("admin", "user", "list").stdout.splitlines()
    assert lines[0].split() == ["NAME", "CLUSTER", "ROLE", "TEAMS", "DEFAULT", "TEAM", "CREATED"]
    assert lines[1].split() == ["alice", "-", "ml", "(admin),", "web", "(member)", "ml", "1h", "ago"]
    assert lines[2].split() == ["dave", "reader", "-", "-", "1m", "ago"]


def test_user_delete(mock):
    mock.delete(f"{SCHED}/users/alice", status=204)
    assert corral("admin", "user", "delete", "alice").stdout == "alice: deleted, their tokens revoked\n"
    mock.delete(f"{SCHED}/users/nobody", json={"error": "no user 'nobody'"}, status=404)
    assert one_line_error(corral("admin", "user", "delete", "nobody")) == "corral: nobody: no user 'nobody'"


# ---- teams ----------------------------------------------------------------------------------

def test_team_create_list_and_delete(mock):
    mock.post(f"{SCHED}/teams", json=dict(ML, members=[]), status=201, match=body({"name": "ml"}))
    assert corral("admin", "team", "create", "ml").stdout == "ml: -\n"
    mock.get(f"{SCHED}/teams", json=[ML])
    lines = corral("admin", "team", "list").stdout.splitlines()
    assert lines[0].split() == ["NAME", "MEMBERS", "CREATED"]
    assert lines[1].split() == ["ml", "alice", "(admin),", "bob", "2h", "ago"]
    assert json.loads(corral("admin", "team", "list", "--json").stdout) == [ML]
    mock.delete(f"{SCHED}/teams/ml", status=204)
    assert corral("admin", "team", "delete", "ml").stdout == "ml: deleted\n"


def test_team_set_patches_the_max_timeout(mock):
    mock.patch(f"{SCHED}/teams/ml", json=dict(ML, max_timeout_secs=7200), match=body({"max_timeout_secs": 7200}))
    result = corral("admin", "team", "set", "ml", "--max-timeout", "2h")
    assert result.exit_code == 0, result.output
    assert result.stdout == "ml: max timeout 2h00m\n"
    TeamChange.check(json.loads(mock.calls[0].request.body))


def test_team_set_no_max_timeout_sends_null(mock):
    mock.patch(f"{SCHED}/teams/ml", json=dict(ML, max_timeout_secs=None), match=body({"max_timeout_secs": None}))
    result = corral("admin", "team", "set", "ml", "--no-max-timeout")
    assert result.exit_code == 0, result.output
    assert result.stdout == "ml: max timeout none (the scheduler's JOB_TIMEOUT_MAX_SECS)\n"
    TeamChange.check(json.loads(mock.calls[0].request.body))
    mock.replace("PATCH", f"{SCHED}/teams/ml", json=dict(ML, max_timeout_secs=None))
    assert json.loads(corral("admin", "team", "set", "ml", "--no-max-timeout", "--json").stdout)["name"] == "ml"


@pytest.mark.parametrize("args, says", [
    (("--max-timeout", "soon"), "corral: --max-timeout 'soon': a duration"),
    (("--max-timeout", "0"), "corral: --max-timeout '0': a duration"),
    (("--max-timeout", "1h", "--no-max-timeout"), "corral: give --max-timeout DURATION or --no-max-timeout, "
                                                  "not both"),
])
def test_team_set_refuses_bad_flags_before_anything_is_sent(mock, args, says):
    assert one_line_error(corral("admin", "team", "set", "ml", *args), code=2).startswith(says)


def test_team_set_needs_something_to_change(mock):
    result = corral("admin", "team", "set", "ml")
    assert result.exit_code == 2 and result.stdout == ""
    assert "--max-timeout DURATION, --no-max-timeout or --share N" in result.stderr


def test_team_set_sends_a_share_alone_and_refuses_one_below_one(mock):
    mock.patch(f"{SCHED}/teams/ml", json=dict(ML, share=3))
    result = corral("admin", "team", "set", "ml", "--share", "3")
    assert result.exit_code == 0, result.output
    sent = json.loads(mock.calls[0].request.body)
    assert sent == {"share": 3}
    TeamChange.check(sent)
    assert result.stdout.strip().endswith("share 3")
    assert corral("admin", "team", "set", "ml", "--share", "0").exit_code == 2
    assert len(mock.calls) == 1


def test_a_team_set_refused_is_one_line(mock):
    mock.patch(f"{SCHED}/teams/ml", json={"error": "only cluster admins change a team's limits"}, status=403)
    line = one_line_error(corral("admin", "team", "set", "ml", "--max-timeout", "1d"))
    assert line.startswith("corral: ml: only cluster admins change a team's limits")


def test_team_list_shows_the_max_timeout_when_the_scheduler_sends_it(mock):
    mock.get(f"{SCHED}/teams", json=[dict(ML, max_timeout_secs=86400), dict(ML, name="web", members=[],
                                                                            max_timeout_secs=None)])
    lines = corral("admin", "team", "list").stdout.splitlines()
    assert lines[0].split() == ["NAME", "MAX", "TIMEOUT", "MEMBERS", "CREATED"]
    assert lines[1].split() == ["ml", "1d00h", "alice", "(admin),", "bob", "2h", "ago"]
    assert lines[2].split() == ["web", "-", "-", "2h", "ago"]


def test_add_member_puts_the_role_and_remove_member_deletes(mock):
    mock.put(f"{SCHED}/teams/ml/members/bob", json=ML, match=body({"role": "member"}))
    assert corral("admin", "team", "add-member", "ml", "bob").stdout == "ml: alice (admin), bob\n"
    mock.put(f"{SCHED}/teams/ml/members/carol", json=ML, match=body({"role": "admin"}))
    assert corral("admin", "team", "add-member", "ml", "carol", "--admin").exit_code == 0
    mock.delete(f"{SCHED}/teams/ml/members/bob", status=204)
    assert corral("admin", "team", "remove-member", "ml", "bob").stdout == "ml: bob removed\n"


def test_a_path_segment_stays_one_segment(mock):
    mock.delete(f"{SCHED}/teams/ml/members/a%2F..%2Fb", status=204)
    assert corral("admin", "team", "remove-member", "ml", "a/../b").exit_code == 0


def test_a_team_admin_refused_is_one_line(mock):
    message = "only the admins of team 'ml' and cluster admins change its members"
    mock.put(f"{SCHED}/teams/ml/members/bob", json={"error": message}, status=403)
    assert one_line_error(corral("admin", "team", "add-member", "ml", "bob")).startswith(f"corral: ml: {message}")


# ---- tokens ---------------------------------------------------------------------------------

def test_token_create_prints_the_secret_once_on_stdout_and_warns_on_stderr(mock):
    mock.post(f"{SCHED}/tokens", json=dict(TOKEN, token=SECRET), status=201,
              match=body({"name": "laptop", "user": "alice"}))
    result = corral("admin", "token", "create", "--name", "laptop", "--user", "alice")
    assert result.exit_code == 0, result.output
    assert result.stdout == SECRET + "\n"
    assert result.output.count(SECRET) == 1
    assert result.stderr == ("tok-3f9a0c1b2d4e5f60 for alice (full, never expires): the secret is shown only "
                             "this once; keep it now\n")


def test_token_create_read_only_with_an_expiry(mock):
    answer = dict(TOKEN, scope="read", expires_at=iso(-90 * 86400), token=SECRET)
    mock.post(f"{SCHED}/tokens", json=answer, status=201,
              match=body({"name": "ci", "scope": "read", "expires_in_secs": 90 * 86400}))
    result = corral("admin", "token", "create", "--name", "ci", "--read-only", "--expires-in", "90d")
    assert result.exit_code == 0, result.output
    assert "(read, expires 2027-02-27 12:00:00Z)" in result.stderr


def test_token_create_json_is_the_answer_with_its_secret_once(mock):
    mock.post(f"{SCHED}/tokens", json=dict(TOKEN, token=SECRET), status=201)
    result = corral("admin", "token", "create", "--name", "laptop", "--json")
    assert json.loads(result.stdout)["token"] == SECRET
    assert result.output.count(SECRET) == 1


def test_token_create_is_not_resent_after_a_lost_answer(mock):
    import requests
    mock.assert_all_requests_are_fired = False  # the second address must not be asked
    mock.post(f"{SCHED}/tokens", body=requests.ReadTimeout("read timed out"))
    mock.post("http://sched-b.test/tokens", json=dict(TOKEN, token=SECRET), status=201)
    result = corral("--addr", f"{SCHED},http://sched-b.test", "admin", "token", "create", "--name", "laptop")
    assert result.exit_code == 1 and len(mock.calls) == 1


def test_a_bad_expiry_is_refused_before_anything_is_sent(mock):
    line = one_line_error(corral("admin", "token", "create", "--name", "x", "--expires-in", "soon"), code=2)
    assert line.startswith("corral: --expires-in 'soon': a duration")


def test_token_list_shows_state_without_secrets(mock):
    tokens = [dict(TOKEN, last_used_at=iso(120)),
              dict(TOKEN, token_id="tok-2", name="old", revoked_at=iso(60)),
              dict(TOKEN, token_id="tok-3", name="ci", scope="read", expires_at=iso(30))]
    mock.get(f"{SCHED}/tokens", json=tokens, match=[matchers.query_param_matcher({"user": "alice"})])
    lines = corral("admin", "token", "list", "--user", "alice").stdout.splitlines()
    assert lines[0].split() == ["TOKEN", "ID", "USER", "NAME", "SCOPE", "STATE", "CREATED", "EXPIRES", "LAST",
                                "USED"]
    assert lines[1].split() == ["tok-3f9a0c1b2d4e5f60", "alice", "laptop", "full", "active", "just", "now",
                                "never", "2m", "ago"]
    assert lines[2].split()[4] == "revoked"
    assert lines[3].split()[3:5] == ["read", "expired"]
    mock.get(f"{SCHED}/tokens", json=[], match=[matchers.query_param_matcher({})])
    assert corral("admin", "token", "list").stderr == "no tokens\n"


def test_token_revoke_deletes(mock):
    mock.delete(f"{SCHED}/tokens/tok-3f9a0c1b2d4e5f60", json=dict(TOKEN, revoked_at=iso(0)))
    assert corral("admin", "token", "revoke", "tok-3f9a0c1b2d4e5f60").stdout == "tok-3f9a0c1b2d4e5f60: revoked\n"
