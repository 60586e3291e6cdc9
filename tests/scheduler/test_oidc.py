"""Single sign-on (scheduler/oidc.py, identities.py): bearer JWTs of an OpenID Connect
provider whose discovery document and JWKS are served over real HTTP on loopback,
with test keys. A valid token's groups become Corral roles; every forged, stale or
misdirected token is refused with 401; a key rotated at the provider is picked up."""
import base64
import hashlib
import hmac
import json
import time

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from oidc_support import AUDIENCE, Provider
from scheduler_app import Clock, make_app

from corral.scheduler import oidc
from corral.scheduler.oidc import OidcSettings
from corral.shared.credentials import Credentials
from corral.shared.errors import SettingError

OPERATOR_TOKEN = "oidc-test-operator-1f2e3d"
AGENT_SECRET = "oidc-test-agent-4c5b6a"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest.fixture
def provider():
    made = Provider()
    made.add_key("k1")
    yield made
    made.close()


@pytest.fixture
def sso(provider, tmp_path):
    app = make_app(f"sqlite:///{tmp_path}/corral.db", Clock(time.time()),
                   credentials=Credentials(OPERATOR_TOKEN, AGENT_SECRET),
                   oidc=OidcSettings(issuer=provider.issuer, audience=AUDIENCE, leeway_secs=5.0))
    client = app.test_client()

    def call(token, method="GET", path="/whoami", **kwargs):
        return client.open(path, method=method, headers={"Authorization": f"Bearer {token}"}, **kwargs)

    call.app = app
    return call


@pytest.mark.slow
def test_a_valid_token_is_the_user_its_groups_make_them(sso, provider):
    me = sso(provider.token(groups=["corral:ml", "corral:web:admin", "corral:reader", "other"])).json
    assert me["user"] == "alice" and me["cluster_role"] == "reader" and me["token_id"] is None
    assert {t["team"]: t["role"] for t in me["teams"]} == {"ml": "member", "web": "admin"}
    job = sso(provider.token(), "POST", "/jobs", json={"command": "true"})
    assert job.status_code == 201 and (job.json["team"], job.json["submitted_by"]) == ("ml", "alice")
    # A team a group names exists from then on; `sub` names the user when the claim is missing.
    assert "ml" in {t["name"] for t in sso(OPERATOR_TOKEN, path="/teams").json}
    assert sso(provider.token(preferred_username=None, sub="bob"), path="/whoami").json["user"] == "bob"
    assert sso(provider.token(groups=["corral:admin"])).json["cluster_role"] == "admin"


@pytest.mark.slow
def test_a_first_login_by_a_subject_is_audited_once(sso, provider):
    for _ in range(2):
        assert sso(provider.token(sub="00u-carol", preferred_username="carol", jti="x" + str(_))).status_code == 200
    logins = [e for e in sso(OPERATOR_TOKEN, path="/audit").json["events"] if e["action"] == "oidcLogin"]
    assert [(e["user"], e["target"]) for e in logins] == [("carol", "00u-carol")]


@pytest.mark.slow
def test_an_account_of_the_same_name_adds_its_roles(sso, provider):
    assert sso(OPERATOR_TOKEN, "POST", "/teams", json={"name": "ops"}).status_code == 201
    assert sso(OPERATOR_TOKEN, "POST", "/users", json={"name": "alice", "teams": {"ops": "admin"},
                                                       "default_team": "ops"}).status_code == 201
    me = sso(provider.token()).json
    assert {t["team"]: t["role"] for t in me["teams"]} == {"ml": "member", "ops": "admin"}
    assert me["default_team"] == "ops"


def forged(provider, alg_header, payload_key=None, signature=b""):
    now = int(time.time())
    header = b64(json.dumps({"alg": alg_header, "kid": "k1", "typ": "JWT"}).encode())
    payload = b64(json.dumps({"iss": provider.issuer, "aud": AUDIENCE, "sub": "mallory", "exp": now + 600,
                              "groups": ["corral:admin"]}).encode())
    if payload_key is not None:
        signature = hmac.new(payload_key, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{b64(signature)}"


def refusals(provider):
    now = int(time.time())
    public_pem = provider.keys["k1"].public_key().public_bytes(serialization.Encoding.PEM,
                                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    good = provider.token()
    head, body, _ = good.split(".")
    return {
        "expired": provider.token(exp=now - 60, iat=now - 700),
        "not yet valid": provider.token(nbf=now + 300),
        "wrong issuer": provider.token(iss="https://evil.example.com"),
        "wrong audience": provider.token(aud="another-app"),
        "no expiry": provider.token(exp=None),
        "unknown key": provider.token(kid="k-unknown", key=stranger),
        "bad signature": provider.token(key=stranger),  # kid k1, another key
        "changed claims": f"{head}.{b64(json.dumps({'sub': 'x', 'groups': ['corral:admin']}).encode())}."
                          f"{good.split('.')[2]}",
        "alg none": forged(provider, "none"),
        "HS256 keyed with the public key": forged(provider, "HS256", payload_key=public_pem),
        "not a user name": provider.token(preferred_username="a b", sub="c d"),
    }


@pytest.mark.slow
def test_forged_stale_and_misdirected_tokens_are_refused(sso, provider):
    assert sso(provider.token()).status_code == 200  # the provider's keys are fetched
    for why, token in refusals(provider).items():
        answer = sso(token)
        assert answer.status_code == 401, why
        assert answer.json == {"error": "the bearer token is not valid"}, why
        assert sso(token, "POST", "/jobs", json={"command": "true"}).status_code == 401, why


@pytest.mark.slow
def test_a_rotated_key_is_fetched_and_a_retired_one_refused(sso, provider, monkeypatch):
    old = provider.token()
    assert sso(old).status_code == 200 and provider.fetches == 1
    # Made-up key ids do not make the scheduler fetch again and again.
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    for n in range(5):
        assert sso(provider.token(kid=f"made-up-{n}", key=stranger)).status_code == 401
    assert provider.fetches == 1
    monkeypatch.setattr(oidc, "REFRESH_MIN_SECS", 0.0)
    provider.add_key("k2", kind="ec")
    del provider.keys["k1"]
    assert sso(provider.token(kid="k2")).status_code == 200 and provider.fetches == 2
    sso.app.extensions["corral.tokens"].forget()  # past the 2 s the answer for `old` is kept
    assert sso(old).status_code == 401


@pytest.mark.slow
def test_a_provider_that_is_down_is_503_until_its_keys_are_had_then_held(sso, provider):
    provider.down = True
    answer = sso(provider.token())
    assert answer.status_code == 503 and "identity provider" in answer.json["error"]
    provider.down = False
    assert sso(provider.token(jti="a")).status_code == 200
    provider.down = True  # keys held: tokens still checked
    assert sso(provider.token(jti="b")).status_code == 200


@pytest.mark.slow
def test_personal_and_bootstrap_tokens_work_beside_it(sso, provider):
    assert sso(OPERATOR_TOKEN).json["user"] == "admin"
    assert sso("eyJhbGciOiJSUzI1NiJ9.e30.x").status_code == 401  # no provider call for garbage
    assert sso("not-a-token").status_code == 401


@pytest.mark.parametrize("env, message", [
    ({"CORRAL_OIDC_ISSUER": "https://id.example.com"}, "CORRAL_OIDC_AUDIENCE"),
    ({"CORRAL_OIDC_ISSUER": "http://id.example.com", "CORRAL_OIDC_AUDIENCE": "x"}, "https://"),
    ({"CORRAL_OIDC_ISSUER": "https://id.example.com", "CORRAL_OIDC_AUDIENCE": "x",
      "CORRAL_OIDC_ALGORITHMS": "RS256,HS256"}, "asymmetric"),
])
def test_settings_that_would_weaken_it_are_refused(env, message):
    with pytest.raises(SettingError, match=message):
        oidc.oidc_settings(env)


def test_settings_read():
    assert oidc.oidc_settings({})["oidc"] is None
    config = oidc.oidc_settings({"CORRAL_OIDC_ISSUER": "https://id.example.com/", "CORRAL_OIDC_AUDIENCE": "corral",
                                 "CORRAL_OIDC_GROUP_PREFIX": "hpc"})["oidc"]
    assert (config.issuer, config.group_prefix, config.algorithms) == ("https://id.example.com/", "hpc",
                                                                      ("RS256", "ES256"))
