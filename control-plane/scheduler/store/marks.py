"""Cheap marks a waiting claim compares to tell whether anything was placed meanwhile.

Read by longpoll.py: the placement mark (where every commit wakes the watchers: SQLite)
and the newest event's id."""
from peewee import fn

from ..models import JobEvent, SchedulerState
from .context import StoreContext

# Changes (to a new random value) in every transaction that places jobs, where every
# commit wakes the watchers of waiting claims (SQLite): they need a look at the
# database only after a placement. On PostgreSQL only placements notify them, and a
# row every placement writes would make placements on different nodes queue on it.
PLACEMENT_MARK = "placement_mark"


class Marks:
    def __init__(self, ctx: StoreContext):
        self.ctx = ctx

    @property
    def marks_placements(self) -> bool:
        """Whether placements change the placement mark (placing.py writes it)."""
        return self.ctx.marks_placements

    def placement_mark(self) -> str | None:
        """A value that changes whenever jobs are placed (None before the first placement),
        where placements are marked (`marks_placements`)."""
        rows = self.ctx.sql.rows(self.ctx.db, "placement mark", lambda: SchedulerState.select(
            SchedulerState.value).where(SchedulerState.key == PLACEMENT_MARK))
        return rows[0][0] if rows else None

    def event_mark(self) -> int | None:
        """The newest job event's id (None: none yet). Every placement writes an event,
        so an unchanged mark means no placement committed since, save one whose event
        id was drawn earlier and committed later (ids are drawn before the commit)."""
        mark: int | None = self.ctx.sql.rows(self.ctx.db, "event mark",
                                             lambda: JobEvent.select(fn.MAX(JobEvent.id)))[0][0]
        return mark
