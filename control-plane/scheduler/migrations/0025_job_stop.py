"""How a job is stopped and warned (docs/scheduling.md, "Time limits"): the signal
and grace of every end Corral causes, the warning before its timeout, a stop the
scheduler asks of a running attempt (a drain's deadline); a team's largest timeout;
`ended_by` of every attempt's end, with `oom` for the old `memory`.
Nullable columns: servers of the previous release do not name them."""
import peewee


def up(migrator, db):
    jobs = {column.name for column in db.get_columns("job")}
    teams = {column.name for column in db.get_columns("team")}
    steps = [migrator.add_column("job", name, field) for name, field in (
        ("warn_signal", peewee.CharField(max_length=8, null=True)),
        ("warn_secs", peewee.DoubleField(null=True)),
        ("kill_signal", peewee.CharField(max_length=8, null=True)),
        ("kill_grace_secs", peewee.DoubleField(null=True)),
        ("stop_reason", peewee.CharField(max_length=16, null=True)),
        ("stop_at", peewee.DoubleField(null=True))) if name not in jobs]
    if "max_timeout_secs" not in teams:
        steps.append(migrator.add_column("team", "max_timeout_secs", peewee.DoubleField(null=True)))
    if steps:
        migrator.migrate(*steps)
    db.execute_sql("UPDATE job SET ended_by = 'oom' WHERE ended_by = 'memory'")
