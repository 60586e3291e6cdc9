"""Three users on two teams, with personal tokens, in the scheduler's app: the
tests of users, teams, tokens and the audit log share them."""
from scheduler_app import Clock, make_app

from corral.shared.credentials import Credentials

OPERATOR_TOKEN = "teams-test-operator-5e1d7c"
READER_TOKEN = "teams-test-reader-8b2a4f0"
AGENT_SECRET = "teams-test-agent-secret-3c9e"


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


def three_teams(database_url: str, **settings):
    """Two teams: ml (alice its admin, bob a member) and web (carol a member); dave reads
    everything. Each user holds a token of full scope; bob one of read scope too."""
    clock = Clock()
    app = make_app(database_url, clock,
                   credentials=Credentials(OPERATOR_TOKEN, AGENT_SECRET, reader=READER_TOKEN), **settings)
    store = app.extensions["corral.store"]
    accounts = store.accounts
    for team in ("ml", "web"):
        accounts.create_team(team, clock())
    accounts.create_user("alice", None, "ml", {"ml": "admin"}, clock())
    accounts.create_user("bob", None, None, {"ml": "member"}, clock())
    accounts.create_user("carol", None, None, {"web": "member"}, clock())
    accounts.create_user("dave", "reader", None, {}, clock())
    tokens = {name: accounts.create_token(name, "laptop", "full", None, "admin", clock())[1]
              for name in ("alice", "bob", "carol", "dave")}
    tokens["bob-read"] = accounts.create_token("bob", "ci", "read", None, "admin", clock())[1]
    tokens["operator"], tokens["reader"] = OPERATOR_TOKEN, READER_TOKEN
    client = app.test_client()

    def call(who, method, path, **kwargs):
        return client.open(path, method=method, headers=bearer(tokens[who]), **kwargs)

    call.app, call.store, call.clock, call.tokens = app, store, clock, tokens
    return call


def submit(call, who, **body):
    answer = call(who, "POST", "/jobs", json={"command": "true", **body})
    assert answer.status_code == 201, answer.json
    return answer.json


