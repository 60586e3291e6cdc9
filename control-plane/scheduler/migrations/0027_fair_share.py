"""Fair share (docs/scheduling.md, "Fair share"): each team's share; the core-seconds
each day's ended attempts reserved (cores asked times wall time: what fair share
counts); the waiting jobs by team in queue order, for placement to take each team's
turn (a partial index: only jobs waiting to be placed are in it, so that it costs a
submit and a placement one entry each, and nothing for the jobs that ran).
Nullable columns (null reads as a share of 1, no core-seconds): servers of the previous
release do not name them."""
import peewee


def up(migrator, db):
    steps = []
    if "share" not in {column.name for column in db.get_columns("team")}:
        steps.append(migrator.add_column("team", "share", peewee.IntegerField(null=True)))
    if "core_seconds" not in {column.name for column in db.get_columns("usage_day")}:
        steps.append(migrator.add_column("usage_day", "core_seconds", peewee.DoubleField(null=True)))
    if steps:
        migrator.migrate(*steps)
    # status and node_id lead although the predicate fixes them: SQLite, without statistics,
    # otherwise prefers the (status, node_id, queue_at, id) index, walking every waiting job.
    db.execute_sql('CREATE INDEX IF NOT EXISTS "job_waiting_by_team" ON "job" ("status", "node_id", "team", '
                   '"queue_at", "id") WHERE "status" = \'pending\' AND "node_id" IS NULL')
