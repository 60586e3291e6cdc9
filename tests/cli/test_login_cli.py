"""`corral login`, `corral logout` and `corral whoami`: the token checked before it is kept,
the config file only its owner may read (made so, its folder too), which token a request
carries, and who a credential stands for."""
import json
import os
import stat

import pytest
from click.testing import CliRunner
from responses import matchers

from cli_support import SCHED, corral, one_line_error
from corral.cli import selection
from corral.cli.main import cli

SECRET = "corral_pat_0123456789abcdef"
ALICE = {"user": "alice", "cluster_role": None, "teams": [{"team": "ml", "role": "admin"},
                                                          {"team": "web", "role": "member"}],
         "default_team": "ml", "token_id": "tok-3f9a0c1b2d4e5f60", "read_only": False}


def with_input(*args, stdin="", env=None):
    full = {"CORRAL_ADDR": SCHED, "CORRAL_TOKEN": None, "FORCE_COLOR": None, "NO_COLOR": None,
            "TTY_COMPATIBLE": None, **(env or {})}
    return CliRunner().invoke(cli, list(args), input=stdin, env=full, prog_name="corral")


def bearer(token):
    return [matchers.header_matcher({"Authorization": f"Bearer {token}"})]


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def log_in(mock, own_config, token=SECRET):
    mock.get(f"{SCHED}/whoami", json=ALICE, match=bearer(token))
    result = with_input("login", "--with-token", stdin=token + "\n")
    assert result.exit_code == 0, result.output
    return result


def test_login_checks_the_token_then_stores_it_with_the_address_readable_by_its_owner_alone(mock, own_config):
    result = log_in(mock, own_config)
    assert json.loads(own_config.read_text()) == {"addr": SCHED, "token": SECRET, "token_id": ALICE["token_id"],
                                                  "user": "alice"}
    assert mode(own_config) == 0o600
    assert mode(own_config.parent) == 0o700 and mode(own_config.parent.parent) == 0o700
    assert os.listdir(own_config.parent) == ["config.json"]  # no temporary file left behind
    assert result.stdout == ""
    assert SECRET not in result.output  # the secret is never printed
    assert f"logged in to {SCHED} as alice (tok-3f9a0c1b2d4e5f60)" in result.stderr


def test_the_file_is_0600_whatever_the_umask_and_a_relogin_replaces_the_token(mock, own_config):
    old = os.umask(0)
    try:
        log_in(mock, own_config)
        log_in(mock, own_config, token="corral_pat_second")
    finally:
        os.umask(old)
    assert mode(own_config) == 0o600 and mode(own_config.parent) == 0o700
    assert json.loads(own_config.read_text())["token"] == "corral_pat_second"


def test_the_xdg_config_home_holds_the_file_when_corral_config_is_unset(mock, tmp_path, monkeypatch):
    monkeypatch.delenv("CORRAL_CONFIG")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    mock.get(f"{SCHED}/whoami", json=ALICE)
    assert with_input("login", "--with-token", stdin=SECRET).exit_code == 0
    stored = tmp_path / "xdg" / "corral" / "config.json"
    assert json.loads(stored.read_text())["token"] == SECRET
    assert mode(stored) == 0o600 and mode(stored.parent) == 0o700


def test_without_xdg_config_home_the_file_is_under_the_home(mock, tmp_path, monkeypatch):
    monkeypatch.delenv("CORRAL_CONFIG")
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    mock.get(f"{SCHED}/whoami", json=ALICE)
    assert with_input("login", "--with-token", stdin=SECRET).exit_code == 0
    assert mode(tmp_path / ".config" / "corral" / "config.json") == 0o600


@pytest.mark.parametrize("status", [401, 403])
def test_a_token_the_scheduler_refuses_is_one_line_and_nothing_is_written(mock, own_config, status):
    mock.get(f"{SCHED}/whoami", json={"error": "token is not valid"}, status=status)
    line = one_line_error(with_input("login", "--with-token", stdin="corral_pat_wrong\n"))
    assert line == f"corral: the scheduler at {SCHED} refused the token (token is not valid); nothing was stored"
    assert not own_config.exists() and not own_config.parent.exists()


def test_a_refused_token_leaves_the_stored_one_as_it_was(mock, own_config):
    log_in(mock, own_config)
    before = own_config.read_text()
    mock.get(f"{SCHED}/whoami", json={"error": "token is not valid"}, status=401)
    assert with_input("login", "--with-token", stdin="corral_pat_wrong").exit_code == 1
    assert own_config.read_text() == before


def test_an_unreachable_scheduler_writes_nothing(mock, own_config):
    import requests
    mock.get(f"{SCHED}/whoami", body=requests.ConnectionError("Connection refused"))
    line = one_line_error(with_input("login", "--with-token", stdin=SECRET))
    assert line == f"corral: cannot reach the scheduler at {SCHED}: connection refused"
    assert not own_config.exists()


@pytest.mark.parametrize("stdin, message", [("", "no token was read"), ("  \n", "no token was read"),
                                            ("two words", "a token is one word of printable ASCII"),
                                            ("tok\u00e9n", "a token is one word of printable ASCII")])
def test_a_missing_or_malformed_token_is_refused_before_any_request(mock, own_config, stdin, message):
    assert one_line_error(with_input("login", "--with-token", stdin=stdin), code=2) == f"corral: {message}"
    assert not own_config.exists()


def test_login_without_with_token_asks_a_terminal_without_echo_and_refuses_a_pipe(mock, own_config, monkeypatch):
    refused = with_input("login", stdin=SECRET)
    assert refused.exit_code == 2 and "give --with-token" in refused.stderr
    monkeypatch.setattr(selection, "interactive", lambda: True)
    mock.get(f"{SCHED}/whoami", json=ALICE, match=bearer(SECRET))
    asked = with_input("login", stdin=SECRET + "\n")
    assert asked.exit_code == 0, asked.output
    assert SECRET not in asked.output  # hidden input is not echoed
    assert json.loads(own_config.read_text())["token"] == SECRET


def test_commands_send_the_stored_token_to_the_stored_address(mock, own_config):
    log_in(mock, own_config)
    mock.get(f"{SCHED}/jobs", json=[], match=bearer(SECRET))
    # No --addr and no CORRAL_ADDR: the address is the stored one.
    result = with_input("job", "list", env={"CORRAL_ADDR": None})
    assert result.exit_code == 0, result.output


def test_a_given_token_wins_over_the_stored_one(mock, own_config):
    log_in(mock, own_config)
    mock.get(f"{SCHED}/jobs", json=[], match=bearer("from-the-flag"))
    assert with_input("--token", "from-the-flag", "job", "list").exit_code == 0
    mock.get(f"{SCHED}/whoami", json=ALICE, match=bearer("from-the-env"))
    assert corral("whoami", token="from-the-env").exit_code == 0


def test_the_stored_token_is_not_sent_to_another_address_nor_to_the_registry(mock, own_config):
    log_in(mock, own_config)
    mock.get("http://elsewhere.test/jobs", json=[])
    mock.get("http://reg.test/nodes", json=[])
    assert with_input("--addr", "http://elsewhere.test", "job", "list").exit_code == 0
    assert with_input("--registry-addr", "http://reg.test", "node", "list").exit_code == 0
    assert all("Authorization" not in call.request.headers for call in mock.calls[1:])


def test_a_stored_token_refused_later_says_where_it_came_from(mock, own_config):
    log_in(mock, own_config)
    mock.get(f"{SCHED}/jobs", json={"error": "token is not valid"}, status=401)
    assert one_line_error(with_input("job", "list")) == \
        "corral: token is not valid (check the token `corral login` stored, or give --token / CORRAL_TOKEN)"


def test_a_file_others_may_read_is_used_with_a_warning(mock, own_config):
    log_in(mock, own_config)
    os.chmod(own_config, 0o644)
    mock.get(f"{SCHED}/jobs", json=[], match=bearer(SECRET))
    result = with_input("job", "list")
    assert result.exit_code == 0
    assert f"corral: warning: {own_config} is open to others (mode 0644); it may hold a token: " \
           f"chmod 600 {own_config}" in result.stderr


def test_a_file_that_is_not_json_is_ignored_with_a_warning(mock, own_config):
    own_config.parent.mkdir(parents=True)
    own_config.write_text("{not json")
    os.chmod(own_config, 0o600)
    mock.get(f"{SCHED}/jobs", json=[])
    result = with_input("job", "list")
    assert result.exit_code == 0
    assert f"corral: warning: ignoring {own_config}: not a JSON object" in result.stderr
    assert "Authorization" not in mock.calls[0].request.headers


def test_logout_removes_the_token_and_keeps_the_address(mock, own_config):
    log_in(mock, own_config)
    result = with_input("logout")
    assert result.exit_code == 0
    assert result.stderr == f"removed tok-3f9a0c1b2d4e5f60 of alice for {SCHED} from {own_config}\n"
    assert json.loads(own_config.read_text()) == {"addr": SCHED}
    assert mode(own_config) == 0o600
    mock.get(f"{SCHED}/jobs", json=[])
    assert with_input("job", "list").exit_code == 0
    assert "Authorization" not in mock.calls[-1].request.headers
    again = with_input("logout")
    assert again.exit_code == 0 and again.stderr == f"no token stored in {own_config}\n"


def test_whoami_prints_the_user_role_teams_default_team_and_token_id(mock):
    mock.get(f"{SCHED}/whoami", json=ALICE)
    result = corral("whoami")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["user          alice", "cluster_role  -",
                                          "teams         ml (admin), web (member)", "default_team  ml",
                                          "token_id      tok-3f9a0c1b2d4e5f60", "read_only     no"]
    assert json.loads(corral("whoami", "--json").stdout) == ALICE


def test_whoami_of_a_cluster_token(mock):
    admin = {"user": "admin", "cluster_role": "admin", "teams": [], "default_team": None, "token_id": None,
             "read_only": False}
    mock.get(f"{SCHED}/whoami", json=admin)
    out = corral("whoami", token="bootstrap").stdout
    assert "cluster_role  admin" in out and "token_id      - (a cluster token)" in out and "teams         -" in out


# ---- the console script against a real scheduler with tokens --------------------------------

OPERATOR = "login-test-operator-token-0123456789"
AGENT = "login-test-agent-token-9876543210"


@pytest.mark.e2e
def test_login_with_a_personal_token_then_whoami_and_my_jobs_on_a_real_scheduler(tmp_path, own_config):
    import subprocess
    import sys

    import requests

    from cluster import Cluster
    c = Cluster(tmp_path)
    try:
        c.start_registry(CORRAL_API_TOKEN=OPERATOR, CORRAL_AGENT_TOKEN=AGENT)
        c.start_scheduler(CORRAL_API_TOKEN=OPERATOR, CORRAL_AGENT_TOKEN=AGENT)
        api = requests.Session()
        api.headers["Authorization"] = f"Bearer {OPERATOR}"
        for path, made in (("/teams", {"name": "ml"}),
                           ("/users", {"name": "alice", "teams": {"ml": "admin"}, "default_team": "ml"})):
            assert api.post(c.scheduler_url + path, json=made, timeout=5).status_code == 201
        answer = api.post(c.scheduler_url + "/tokens", json={"name": "laptop", "user": "alice"}, timeout=5)
        assert answer.status_code == 201, answer.text
        secret, token_id = answer.json()["token"], answer.json()["token_id"]
        assert api.post(c.scheduler_url + "/jobs", json={"command": "true"}, timeout=5).status_code == 201  # admin's

        corral_bin = os.path.join(os.path.dirname(sys.executable), "corral")
        env = {k: v for k, v in os.environ.items() if k not in ("CORRAL_TOKEN", "CORRAL_ADDR")}

        def run(*args, stdin=None):
            return subprocess.run([corral_bin, *args], env=env, input=stdin, capture_output=True, text=True,
                                  timeout=30)

        refused = run("--addr", c.scheduler_url, "login", "--with-token", stdin="corral_pat_not-a-token\n")
        assert refused.returncode == 1 and "refused the token" in refused.stderr
        assert not own_config.exists()
        logged_in = run("--addr", c.scheduler_url, "login", "--with-token", stdin=secret + "\n")
        assert logged_in.returncode == 0, logged_in.stderr
        assert secret not in logged_in.stdout + logged_in.stderr
        assert mode(own_config) == 0o600
        # From here on no address and no token are given: both are the stored ones.
        who = json.loads(run("whoami", "--json").stdout)
        assert (who["user"], who["token_id"], who["default_team"]) == ("alice", token_id, "ml")
        assert "teams         ml (admin)" in run("whoami").stdout
        submitted = run("job", "run", "--team", "ml", "--", "true")
        assert submitted.returncode == 0, submitted.stderr
        mine = run("job", "list", "--mine", "--json")
        assert mine.returncode == 0, mine.stderr
        assert [(j["job_id"], j["team"], j["submitted_by"]) for j in json.loads(mine.stdout)] == \
            [(submitted.stdout.strip(), "ml", "alice")]
        header, row = run("job", "list", "--mine").stdout.splitlines()
        assert "  TEAM  SUBMITTED BY" in header
        assert row.split()[10:12] == ["ml", "alice"]
        assert run("logout").returncode == 0
        assert "token" not in json.loads(own_config.read_text())
    finally:
        c.stop()
