"""Single sign-on: bearer JWTs from the company's OpenID Connect provider
(docs/security.md, "Single sign-on").

With `CORRAL_OIDC_ISSUER` and `CORRAL_OIDC_AUDIENCE` set, a bearer token that is a
JWT is checked by PyJWT against the issuer's keys: its signature (asymmetric
algorithms only, so no `none` and no HMAC keyed with a public key), `iss`, `aud`,
`exp` and `nbf` with a small leeway. The keys come from the issuer's JWKS (its URL
from the issuer's discovery document unless set), fetched with a timeout, kept
JWKS_LIFESPAN_SECS, and fetched again when a token names a key id not among them
(a key rotated at the provider), at most once per REFRESH_MIN_SECS (made-up key ids
cannot make the scheduler hammer the provider).

The user is a claim (`preferred_username`, else `sub`); their roles come from a
groups claim, where, with the prefix `corral`, `corral:TEAM` makes them a member
of TEAM, `corral:TEAM:admin` its admin, `corral:admin` a cluster admin and
`corral:reader` a cluster-wide reader. `claims_principal` is that mapping, pure.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping

import jwt
import requests

from corral.server import principals
from corral.server.principals import Principal
from corral.shared import settings as s
from corral.shared.errors import SettingError, Unavailable

FETCH_TIMEOUT_SECS = 5.0
JWKS_LIFESPAN_SECS = 300.0
REFRESH_MIN_SECS = 10.0
MAX_TOKEN_CHARS = 16_384
# Asymmetric only: a token's own `alg` is never trusted beyond this list.
ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")


@dataclasses.dataclass(frozen=True)
class OidcSettings:
    issuer: str
    audience: str
    jwks_url: str | None = None          # None: the `jwks_uri` of the issuer's discovery document
    user_claim: str = "preferred_username"
    groups_claim: str = "groups"
    group_prefix: str = "corral"
    algorithms: tuple[str, ...] = ("RS256", "ES256")
    leeway_secs: float = 30.0


def _algorithms(name: str, value: str) -> tuple[str, ...]:
    chosen = tuple(part.strip() for part in value.split(",") if part.strip())
    wrong = [alg for alg in chosen if alg not in ASYMMETRIC]
    if not chosen or wrong:
        raise SettingError(f"{name} takes asymmetric JWS algorithms ({', '.join(ASYMMETRIC)}), comma-separated; "
                           f"got {value!r}")
    return chosen


def _https_or_loopback(name: str, url: str) -> str:
    if not url.startswith(("https://", "http://127.0.0.1", "http://localhost", "http://[::1]")):
        raise SettingError(f"{name} must be an https:// URL (http:// only on loopback), got {url!r}")
    return url  # as given: an issuer is compared with `iss` exactly


OIDC = (
    s.Setting("CORRAL_OIDC_ISSUER", "issuer", "text", None,
              "accept bearer JWTs from this OpenID Connect issuer (its `iss`, exactly); unset: no single sign-on",
              parse=_https_or_loopback, form="a URL"),
    s.Setting("CORRAL_OIDC_AUDIENCE", "audience", "text", None,
              "the `aud` Corral's tokens carry (the client id registered at the provider); needed with the issuer",
              form="a string"),
    s.Setting("CORRAL_OIDC_JWKS_URL", "jwks_url", "text", None,
              "where the issuer's signing keys are; unset: the `jwks_uri` of "
              "`ISSUER/.well-known/openid-configuration`", parse=_https_or_loopback, form="a URL"),
    s.Setting("CORRAL_OIDC_USER_CLAIM", "user_claim", "text", "preferred_username",
              "the claim that names the user (`sub` when a token lacks it)", form="a claim name"),
    s.Setting("CORRAL_OIDC_GROUPS_CLAIM", "groups_claim", "text", "groups",
              "the claim listing the user's groups", form="a claim name"),
    s.Setting("CORRAL_OIDC_GROUP_PREFIX", "group_prefix", "text", "corral",
              "groups `PREFIX:TEAM`, `PREFIX:TEAM:admin`, `PREFIX:admin` and `PREFIX:reader` give Corral roles; "
              "others are ignored", form="a word"),
    s.Setting("CORRAL_OIDC_ALGORITHMS", "algorithms", "text", "RS256,ES256",
              "the signature algorithms accepted (asymmetric only)", parse=_algorithms, form="a list"),
    s.Setting("CORRAL_OIDC_LEEWAY_SECS", "leeway_secs", "float", 30.0,
              "clock skew allowed on `exp` and `nbf`", minimum=0.0, maximum=300.0),
)


def oidc_settings(env: Mapping[str, str]) -> dict:
    """The `oidc` field of SchedulerSettings: None without CORRAL_OIDC_ISSUER."""
    values = s.read_all(OIDC, env)
    if values["issuer"] is None:
        return {"oidc": None}
    if not values["audience"]:
        raise SettingError("CORRAL_OIDC_AUDIENCE must be set with CORRAL_OIDC_ISSUER (the client id tokens are "
                           "issued for)")
    return {"oidc": OidcSettings(**values)}


def looks_like_jwt(presented: str) -> bool:
    """Three base64url parts: what is worth a signature check (others never reach one)."""
    return len(presented) <= MAX_TOKEN_CHARS and presented.count(".") == 2 and presented.startswith("ey")


class Refused(Exception):
    """A token that is not valid: the message says why (logged, never answered in full)."""


def claims_principal(claims: Mapping, config: OidcSettings) -> Principal:
    """Who a verified token's claims stand for."""
    user = claims.get(config.user_claim) or claims.get("sub")
    if not isinstance(user, str) or not principals.USER_RE.match(user):
        raise Refused(f"the token's {config.user_claim!r} (or 'sub') is not a user name Corral takes")
    groups = claims.get(config.groups_claim) or []
    if isinstance(groups, str):
        groups = [groups]
    if not isinstance(groups, list):
        raise Refused(f"the token's {config.groups_claim!r} is not a list of groups")
    cluster_role: str | None = None
    teams: dict[str, str] = {}
    prefix = config.group_prefix + ":"
    for group in groups:
        if not isinstance(group, str) or not group.startswith(prefix):
            continue
        name, _, role = group[len(prefix):].partition(":")
        if not role and name == principals.ADMIN:
            cluster_role = principals.ADMIN
        elif not role and name == principals.READER:
            cluster_role = cluster_role or principals.READER
        elif principals.TEAM_RE.match(name) and role in ("", principals.TEAM_ADMIN):
            if role or teams.get(name) != principals.TEAM_ADMIN:
                teams[name] = principals.TEAM_ADMIN if role else principals.MEMBER
    return Principal(user, cluster_role, teams)


class Verifier:
    """Checks JWTs against the issuer's keys; `verify(token)` answers the claims or
    raises Refused (a bad token) or Unavailable (the provider's keys could not be had)."""

    def __init__(self, config: OidcSettings, clock: Callable[[], float] = time.monotonic,
                 get: Callable[..., requests.Response] = requests.get):
        self.config = config
        self._clock, self._get = clock, get
        self._lock = threading.Lock()
        self._keys: dict[str | None, tuple[jwt.PyJWK, str | None]] = {}  # kid -> the key, its stated alg
        self._fetched_at: float | None = None
        self._jwks_url = config.jwks_url

    def verify(self, token: str) -> dict:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise Refused(f"not a JWT: {exc}") from None
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in self.config.algorithms:
            raise Refused(f"the algorithm {str(alg)[:16]!r} is not accepted")
        key, stated = self._key(kid if isinstance(kid, str) else None)
        if stated is not None and stated != alg:
            raise Refused(f"key {kid!r} is for {stated}, not {alg}")
        try:
            return jwt.decode(token, key.key, algorithms=[alg], audience=self.config.audience,
                              issuer=self.config.issuer, leeway=self.config.leeway_secs,
                              options={"require": ["exp", "iss", "aud"]})
        except jwt.PyJWTError as exc:
            raise Refused(str(exc)) from None

    def _key(self, kid: str | None) -> tuple[jwt.PyJWK, str | None]:
        """The issuer's key `kid` (None: the issuer's only key) and the algorithm it states."""
        with self._lock:
            now = self._clock()
            stale = self._fetched_at is None or now - self._fetched_at >= JWKS_LIFESPAN_SECS
            if stale or (kid not in self._keys and now - (self._fetched_at or 0.0) >= REFRESH_MIN_SECS):
                self._fetch(now)
            found = self._keys.get(kid)
            if found is None and kid is None and len(self._keys) == 1:
                found = next(iter(self._keys.values()))
        if found is None:
            raise Refused(f"no key {str(kid)[:64]!r} at the issuer")
        return found

    def _fetch(self, now: float) -> None:
        try:
            if self._jwks_url is None:
                discovery = self._json(self.config.issuer.rstrip("/") + "/.well-known/openid-configuration")
                self._jwks_url = _https_or_loopback("jwks_uri", str(discovery["jwks_uri"]))
            listed = self._json(self._jwks_url)["keys"]
            if not isinstance(listed, list):
                raise ValueError("its 'keys' is not a list")
        except (requests.RequestException, ValueError, KeyError, TypeError, SettingError) as exc:
            if self._fetched_at is not None:
                self._fetched_at = now  # keep the keys held while the provider is down; try again later
                return
            raise Unavailable(f"the identity provider's keys could not be fetched: {exc}") from None
        keys: dict[str | None, tuple[jwt.PyJWK, str | None]] = {}
        for data in listed:
            if not isinstance(data, dict) or data.get("use", "sig") != "sig":
                continue  # encryption keys sign nothing
            try:
                keys[data.get("kid")] = (jwt.PyJWK(data), data.get("alg"))
            except jwt.PyJWTError:
                continue  # a key type this build cannot use
        self._keys, self._fetched_at = keys, now

    def _json(self, url: str) -> dict:
        answer = self._get(url, timeout=FETCH_TIMEOUT_SECS)
        answer.raise_for_status()
        found = answer.json()
        if not isinstance(found, dict):
            raise ValueError(f"{url} did not answer a JSON object")
        return found
