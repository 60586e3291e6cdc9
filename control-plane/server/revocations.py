"""Revoking one node's credential without rotating the cluster's agent secret
(docs/security.md, "Revoking one node's credential").

Each service keeps in its own database (`node_credential`) the lowest credential
generation it still accepts per node, since each checks every request alone; the
floor only rises. Each process reads the small table at most once per
FLOORS_TTL_SECS, so a revocation is in force everywhere within that time, and at
once in the process that made it.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import peewee
from pydantic import Field

from corral.shared.contract import Answer, Request
from corral.shared.credentials import FIRST_GENERATION, MAX_GENERATION
from corral.shared.errors import BadRequest, Conflict
from corral.shared.timeutil import iso
from corral.shared.validate import NAME_RE

FLOORS_TTL_SECS = 1.0
TABLE = "node_credential"


def credential_model(database: peewee.DatabaseProxy) -> Any:
    """The `node_credential` table, bound to a service's database proxy (each service
    has a model class of its own: both may live in one process, as in tests). Typed
    Any: its fields are made here, where a type checker cannot see them."""

    class NodeCredential(peewee.Model):
        node_id = peewee.CharField(primary_key=True, max_length=128)
        min_generation = peewee.IntegerField()  # older credentials of the node are refused
        revoked_at = peewee.DoubleField()

        class Meta:
            table_name = TABLE

    NodeCredential._meta.set_database(database)
    return NodeCredential


class Revocation(Request):
    """An optional body of a revocation; an empty body raises the floor by one."""

    min_generation: int | None = Field(None, ge=FIRST_GENERATION + 1, le=MAX_GENERATION)
    """Refuse the node's credentials below this generation (never lowers the current floor): the
    same request sent twice changes nothing more."""


class CredentialFloor(Answer):
    """Which of a node's credentials a service accepts."""

    node_id: str
    min_generation: int
    """The lowest generation accepted: issue the node's next credential with
    `corral-scheduler node-token NODE --generation N`."""
    revoked_at: str | None = None
    """When it was last raised (ISO 8601)."""


def check_node_id(node_id: str) -> None:
    if not NAME_RE.match(node_id):
        raise BadRequest("the node id must be letters, digits, '.', '_' or '-' (at most 128), "
                         "starting with a letter or digit")


def next_floor(current: int, at_least: int | None) -> int:
    """The floor a revocation asks for, from the node's current one: `at_least` when
    higher (never lower), or one more; a Conflict past the last generation."""
    if at_least is not None:
        return max(current, at_least)
    if current >= MAX_GENERATION:
        raise Conflict(f"the credentials of this node are at the last generation ({MAX_GENERATION}); none is "
                       f"left to issue: rotate the agent secret instead")
    return current + 1


def raise_floor(db: peewee.Database, model: Any, node_id: str, at_least: int | None,
                now: float) -> tuple[int, float]:
    """Raise `node_id`'s floor to `at_least` (when higher), or by one; the floor after
    and when it was last raised.
    Two statements that each read and write the row at once, so revocations at the
    same moment (workers, replicas) never lower one another."""
    with db.atomic():
        model.insert(node_id=node_id, min_generation=FIRST_GENERATION, revoked_at=now).on_conflict_ignore().execute()
        next_floor(model.get_by_id(node_id).min_generation, at_least)  # the Conflict at the last one
        if at_least is None:
            model.update(min_generation=model.min_generation + 1, revoked_at=now).where(
                (model.node_id == node_id) & (model.min_generation < MAX_GENERATION)).execute()
        else:
            model.update(min_generation=at_least, revoked_at=now).where(
                (model.node_id == node_id) & (model.min_generation < at_least)).execute()
        row = model.get_by_id(node_id)
        return row.min_generation, row.revoked_at


def revoke(db: peewee.Database, model: Any, floors: Floors, node_id: str, at_least: int | None,
           now: float) -> CredentialFloor:
    """A service's own revocation: its floor raised, this process's copy forgotten."""
    floor, at = raise_floor(db, model, node_id, at_least, now)
    floors.forget()
    return CredentialFloor(node_id=node_id, min_generation=floor, revoked_at=iso(at))


def revocation_request(node_id: str, raw: bytes, body: Callable[[], dict]) -> int | None:
    """The generation a revocation request names (None: raise by one), or a BadRequest.
    `raw`: the request's bytes (an empty body is allowed); `body()`: them as a JSON object."""
    check_node_id(node_id)
    return Revocation.check(body() if raw.strip() else {}).min_generation


def load_floors(db: peewee.Database, model: Any) -> dict[str, int]:
    """Every node whose floor is above the first generation, on a connection of its own
    (the request check runs before the request's connection is taken)."""
    with db.connection_context():
        query = model.select(model.node_id, model.min_generation).where(model.min_generation > FIRST_GENERATION)
        return {row.node_id: row.min_generation for row in query}


class Floors:
    """This process's copy of the floors, read again once older than `ttl` seconds.
    Called with a node id: the lowest generation of its credentials accepted."""

    def __init__(self, load: Callable[[], dict[str, int]], ttl: float = FLOORS_TTL_SECS,
                 clock: Callable[[], float] = time.monotonic):
        self._load, self._ttl, self._clock = load, ttl, clock
        self._lock = threading.Lock()
        self._floors: dict[str, int] = {}
        self._read_at: float | None = None

    def __call__(self, node_id: str) -> int:
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= self._ttl:
                self._floors = self._load()  # a failure propagates: no stale "accept"
                self._read_at = now
            return self._floors.get(node_id, FIRST_GENERATION)

    def forget(self) -> None:
        """Read the table again at the next request (after this process changed it)."""
        with self._lock:
            self._read_at = None


def refusal(node_id: str, generation: int, floor: int) -> str | None:
    """Why a credential of `generation` for `node_id` is refused under `floor` (None: it is not)."""
    if generation >= floor:
        return None
    return (f"the credential of node {node_id!r} (generation {generation}) was revoked; an operator issues "
            f"its current one with `corral-scheduler node-token {node_id} --generation {floor}`")
