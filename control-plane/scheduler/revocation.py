"""Revoking one node's credential through the scheduler, on both services at once.

control-plane/server/revocations.py says how a credential's generation and each
service's floor work.

One call revokes on both services: the registry's floor is raised first, to the
generation asked for (or to the scheduler's floor plus one), and then the
scheduler's own to whatever the registry answers (its floor may be higher). When
the registry cannot be told, nothing changes here and the answer says so (503);
sending the revocation again is safe."""
from __future__ import annotations

import peewee

from corral.server import revocations
from corral.shared.clients import ClientError, Rejected, RegistryClient
from corral.shared.credentials import FIRST_GENERATION
from corral.shared.errors import Unavailable

from .models import NodeCredential


def floors(db: peewee.Database) -> revocations.Floors:
    """This process's copy of the scheduler's floors, for the request check."""
    return revocations.Floors(lambda: revocations.load_floors(db, NodeCredential))


def revoke(db: peewee.Database, registry: RegistryClient, cache: revocations.Floors, node_id: str,
           at_least: int | None, now: float) -> revocations.CredentialFloor:
    row = NodeCredential.get_or_none(NodeCredential.node_id == node_id)
    own = row.min_generation if row is not None else FIRST_GENERATION
    wanted = revocations.next_floor(own, at_least)
    try:
        answer = registry.revoke_credential(node_id, wanted)
        floor = int(answer["min_generation"])
    except Rejected as exc:
        raise Unavailable(f"the registry refused the revocation ({exc.status}: {exc.message}); nothing was "
                          f"changed on the scheduler") from None
    except (ClientError, KeyError, TypeError, ValueError) as exc:
        raise Unavailable(f"the registry did not take the revocation ({exc}); nothing was changed on the "
                          f"scheduler: send it again") from None
    return revocations.revoke(db, NodeCredential, cache, node_id, max(floor, wanted), now)
