"""Who a bearer token that is none of the cluster's own stands for: a personal token
(personal_tokens.py) or, with single sign-on configured, a JWT of the identity
provider (oidc.py). Each is cached TOKEN_TTL per process, so neither costs a
database read or a signature check on most requests."""
from __future__ import annotations

import logging
from collections.abc import Callable

from corral.server import audit_trail
from corral.server.principals import Principal

from . import oidc, personal_tokens
from .store import Store

log = logging.getLogger(__name__)


class Identities:
    """`identities(presented)`: the principal, or None (not a token of ours, or not
    valid); Unavailable when the identity provider's keys cannot be had."""

    def __init__(self, store: Store, config: oidc.OidcSettings | None, clock: Callable[[], float]):
        self.personal = personal_tokens.TokenCache(lambda digest: store.accounts.principal_for(digest, clock()))
        self.sso: personal_tokens.TokenCache | None = None
        if config is not None:
            verifier = oidc.Verifier(config)

            def load(token: str) -> Principal | None:
                try:
                    claims = verifier.verify(token)
                    base = oidc.claims_principal(claims, config)
                except oidc.Refused as exc:
                    log.info("refused a bearer JWT: %s", exc)
                    return None
                login = audit_trail.login_entry(base.user, str(claims.get("sub") or base.user), clock())
                return store.accounts.sso_principal(base, login, clock())

            self.sso = personal_tokens.TokenCache(load, accepts=oidc.looks_like_jwt, by_secret=True)

    def __call__(self, presented: str) -> Principal | None:
        if personal_tokens.looks_personal(presented):
            return self.personal(presented)
        return self.sso(presented) if self.sso is not None else None

    def forget(self) -> None:
        """Read every token again (after this process revoked one or changed a user)."""
        self.personal.forget()
        if self.sso is not None:
            self.sso.forget()
