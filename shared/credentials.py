"""Who may speak to the registry and the scheduler: the operators' token, node
credentials derived from the cluster's agent secret, and service grants
(docs/security.md has the formats, revocation by generation, and rotation).

Either no token at all (the services then listen on loopback only) or both
CORRAL_API_TOKEN and CORRAL_AGENT_TOKEN: with one alone a role would be open, so
the services refuse to start. Secrets are compared in constant time and never
shown in a repr, a log line or an error. No Flask here: the agent and the CLI use it.
"""
from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from corral.shared.errors import SettingError
from corral.shared.settings import Setting, read_all
from corral.shared.validate import NAME_RE

OPERATOR_ROLE = "operator"
AGENT_ROLE = "agent"
# Optional: reads only (lists, jobs, the event stream, discovery), for Prometheus and
# dashboards, so that they need not hold the operator token.
READER_ROLE = "reader"
MIN_SECRET_CHARS = 16
_MAC_RE = re.compile(r"^[0-9a-f]{64}\Z")
# A generation after the first: 2 and up, written one way only (no leading zero).
_GENERATION_RE = re.compile(r"^[1-9][0-9]{0,8}\Z")
FIRST_GENERATION = 1
MAX_GENERATION = 999_999_999


def node_token(secret: str, node_id: str, generation: int = FIRST_GENERATION) -> str:
    """The credential of `node_id` under the agent secret `secret`, of `generation`
    (the first one keeps the form credentials had before generations: no suffix).
    '~' is in no node id, so the subject reads one way only."""
    if not FIRST_GENERATION <= generation <= MAX_GENERATION:
        raise ValueError(f"a credential's generation is {FIRST_GENERATION} to {MAX_GENERATION}")
    subject = node_id if generation == FIRST_GENERATION else f"{node_id}~{generation}"
    return f"{subject}.{_mac(secret, subject)}"


def parse_node_token(token: str) -> tuple[str, int] | None:
    """The node id and generation a credential claims (its form only, nothing verified)."""
    subject, dot, mac = token.rpartition(".")
    if not dot or not _MAC_RE.match(mac):
        return None
    node_id, tilde, generation = subject.partition("~")
    if not NAME_RE.match(node_id):
        return None
    if not tilde:
        return node_id, FIRST_GENERATION
    if not _GENERATION_RE.match(generation) or int(generation) == FIRST_GENERATION:
        return None
    return node_id, int(generation)


def token_node(token: str) -> str | None:
    """The node id a credential claims to be for (its form only, nothing verified)."""
    parsed = parse_node_token(token)
    return None if parsed is None else parsed[0]


def _mac(secret: str, message: str) -> str:
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Caller:
    """Who a valid credential belongs to: an operator, or the agent of `node_id`."""

    role: str
    node_id: str | None = None
    generation: int = FIRST_GENERATION  # of a node credential


@dataclass(frozen=True)
class Credentials:
    """The servers' credentials. All None: the tokenless local mode (everything open,
    loopback only). Otherwise `operator` and `agent_secret` are both set, and
    `reader` may be."""

    operator: str | None = field(default=None, repr=False)
    agent_secret: str | None = field(default=None, repr=False)
    previous_secret: str | None = field(default=None, repr=False)
    reader: str | None = field(default=None, repr=False)

    @property
    def enabled(self) -> bool:
        return self.operator is not None

    def _secrets(self) -> tuple[str, ...]:
        return tuple(s for s in (self.agent_secret, self.previous_secret) if s is not None)

    def identify(self, presented: str) -> Caller | None:
        """The caller a bearer token stands for, or None when it is not valid."""
        given = presented.encode("utf-8", "surrogateescape")
        operator = self.operator is not None and hmac.compare_digest(given, self.operator.encode())
        reader = self.reader is not None and hmac.compare_digest(given, self.reader.encode())
        parsed = parse_node_token(presented) if given.isascii() else None
        node = False
        if parsed is not None:
            subject, _, mac = presented.rpartition(".")
            # Every secret is tried, so timing does not tell which one nearly matched.
            for secret in self._secrets():
                node = hmac.compare_digest(mac, _mac(secret, subject)) or node
        if operator:
            return Caller(OPERATOR_ROLE)
        if node and parsed is not None:
            return Caller(AGENT_ROLE, parsed[0], parsed[1])
        if reader:
            return Caller(READER_ROLE)
        return None

    def node_token(self, node_id: str, generation: int = FIRST_GENERATION) -> str:
        """A node's credential under the current secret (`node-token` commands)."""
        if self.agent_secret is None:
            raise SettingError("CORRAL_AGENT_TOKEN is not set: there is no secret to derive node credentials from")
        return node_token(self.agent_secret, node_id, generation)

    def service_grant(self, job_id: str, attempt: int, node_id: str) -> str | None:
        """The grant for a service record of this attempt on this node (None without tokens)."""
        if self.agent_secret is None:
            return None
        return _mac(self.agent_secret, _grant_message(job_id, attempt, node_id))

    def grant_valid(self, grant: str, job_id: str, attempt: int, node_id: str) -> bool:
        message = _grant_message(job_id, attempt, node_id)
        valid = False
        for secret in self._secrets():
            valid = hmac.compare_digest(grant.encode("utf-8", "surrogateescape"),
                                        _mac(secret, message).encode()) or valid
        return valid


def _grant_message(job_id: str, attempt: int, node_id: str) -> str:
    return f"corral-service\n{job_id}\n{attempt}\n{node_id}"


def server_credentials(env: Mapping[str, str]) -> Credentials:
    """CORRAL_API_TOKEN, CORRAL_AGENT_TOKEN and CORRAL_AGENT_TOKEN_PREVIOUS, checked.
    Raises SettingError (never showing a value) for a configuration that would leave
    a role open or let one credential stand for another."""
    tokens = read_all(TOKENS, env)
    operator, agent, previous = tokens["operator"], tokens["agent_secret"], tokens["previous_secret"]
    reader = tokens["reader"]
    if reader is not None and operator is None:
        raise SettingError("CORRAL_READ_TOKEN needs CORRAL_API_TOKEN and CORRAL_AGENT_TOKEN: without them "
                           "every route is open and a read-only token means nothing")
    if operator is not None and agent is None:
        raise SettingError("CORRAL_API_TOKEN is set but CORRAL_AGENT_TOKEN is not: set both (the agents' "
                           "routes would be open to anyone) or neither (loopback only)")
    if agent is not None and operator is None:
        raise SettingError("CORRAL_AGENT_TOKEN is set but CORRAL_API_TOKEN is not: set both (the operators' "
                           "routes would be open to anyone) or neither (loopback only)")
    if previous is not None and agent is None:
        raise SettingError("CORRAL_AGENT_TOKEN_PREVIOUS needs CORRAL_AGENT_TOKEN (the current secret)")
    if operator is not None and operator in (agent, previous):
        raise SettingError("CORRAL_API_TOKEN and the agent secret (CORRAL_AGENT_TOKEN, _PREVIOUS) must differ")
    if reader is not None and reader in (operator, agent, previous):
        raise SettingError("CORRAL_READ_TOKEN must differ from CORRAL_API_TOKEN and the agent secret")
    return Credentials(**tokens)


def _secret(name: str, value: str) -> str:
    if len(value) < MIN_SECRET_CHARS:
        raise SettingError(f"{name} must be at least {MIN_SECRET_CHARS} characters (e.g. `openssl rand -hex 32`)")
    if not all("!" <= c <= "~" for c in value):
        raise SettingError(f"{name} may hold only printable ASCII characters without spaces")
    return value


_SECRET_FORM = f"a secret of {MIN_SECRET_CHARS}+ printable characters"
# The servers' credentials, read into Credentials: both tokens or neither.
TOKENS = (
    Setting("CORRAL_API_TOKEN", "operator", "text", None,
            "the operators' bearer token ([security.md](security.md)); set both tokens or neither (then loopback only)",
            parse=_secret, form=_SECRET_FORM),
    Setting("CORRAL_AGENT_TOKEN", "agent_secret", "text", None,
            "the cluster's agent secret, held by the registry and the scheduler only (give both the same): "
            "node credentials are derived from it", parse=_secret, form=_SECRET_FORM),
    Setting("CORRAL_AGENT_TOKEN_PREVIOUS", "previous_secret", "text", None,
            "the previous agent secret, during a rotation: its node credentials stay valid",
            parse=_secret, form=_SECRET_FORM),
    Setting("CORRAL_READ_TOKEN", "reader", "text", None,
            "an optional read-only bearer token (lists, job reads, service discovery; nothing that changes "
            "anything) for Prometheus and dashboards; needs both tokens above",
            parse=_secret, form=_SECRET_FORM),
)
