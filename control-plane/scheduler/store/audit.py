"""The audit log's rows (control-plane/server/audit_trail.py writes them as requests
commit): written, read a page at a time, and deleted past the jobs' retention."""
from __future__ import annotations

from dataclasses import dataclass

from ..models import AuditEvent
from .context import StoreContext


@dataclass(frozen=True)
class AuditFilter:
    """What `GET /audit` asks for: each field narrows (None: any). `teams`: the teams
    whose entries the caller may see (None: every team's, and those of no team)."""

    user: str | None = None
    team: str | None = None
    action: str | None = None
    since: float | None = None
    until: float | None = None
    before: int | None = None
    teams: frozenset[str] | None = None


# The columns of an entry, in the order of the compiled INSERT.
COLUMNS = ("at", "user", "team", "action", "target", "method", "path", "address", "status", "token_id")


class AuditLog:
    def __init__(self, ctx: StoreContext):
        self.ctx = ctx
        self._sql: str | None = None

    def write(self, row: dict) -> int:
        """Insert one entry in the current transaction; its id. One statement written once:
        a state-changing request pays its execution only (peewee building an INSERT cost
        each submit a fifth of its time)."""
        cursor = self.ctx.db.execute_sql(self._insert(), [row[name] for name in COLUMNS])
        return int(cursor.fetchone()[0])

    def _insert(self) -> str:
        if self._sql is None:
            param = self.ctx.db.param
            self._sql = (f'INSERT INTO "audit_event" ({", ".join(f"{chr(34)}{name}{chr(34)}" for name in COLUMNS)}) '
                         f'VALUES ({", ".join(param for _ in COLUMNS)}) RETURNING "id"')
        return self._sql

    def set_status(self, entry_id: int, status: int) -> None:
        with self.ctx.tx():
            AuditEvent.update(status=status).where(AuditEvent.id == entry_id).execute()

    @staticmethod
    def page(where: AuditFilter, limit: int) -> list[AuditEvent]:
        """Up to `limit` entries, newest first."""
        query = AuditEvent.select()
        for field, value in ((AuditEvent.user, where.user), (AuditEvent.team, where.team),
                             (AuditEvent.action, where.action)):
            if value is not None:
                query = query.where(field == value)
        if where.since is not None:
            query = query.where(AuditEvent.at >= where.since)
        if where.until is not None:
            query = query.where(AuditEvent.at < where.until)
        if where.before is not None:
            query = query.where(AuditEvent.id < where.before)
        if where.teams is not None:
            query = query.where(AuditEvent.team.in_(sorted(where.teams)))
        return list(query.order_by(AuditEvent.id.desc()).limit(limit))

    def purge(self, older_than: float, limit: int) -> int:
        """Delete up to `limit` entries older than `older_than`; how many."""
        with self.ctx.tx():
            self.ctx.check_fence()
            ids = [row.id for row in AuditEvent.select(AuditEvent.id).where(AuditEvent.at < older_than)
                   .order_by(AuditEvent.id).limit(limit)]
            return AuditEvent.delete().where(AuditEvent.id.in_(ids)).execute() if ids else 0
