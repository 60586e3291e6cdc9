"""Preemption (docs/scheduling.md, "Preemption"): whether a job may run on capacity its
team borrowed (and so be preempted), and how many times it was preempted.
Nullable columns (null reads as preemptible, never preempted): servers of the previous
release do not name them."""
import peewee


def up(migrator, db):
    jobs = {column.name for column in db.get_columns("job")}
    steps = [migrator.add_column("job", name, field) for name, field in (
        ("preemptible", peewee.BooleanField(null=True)),
        ("preemptions", peewee.IntegerField(null=True))) if name not in jobs]
    if steps:
        migrator.migrate(*steps)
