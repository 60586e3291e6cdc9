"""A job's own list of the jobs it waits for, as the API shows it.

job_dependency holds the conditions for placement to decide (one row each, its
state); a job's answer shows what was asked, in the order asked, without a read
of that table for every job of a list: `depends_on`, a JSON list of
[job row id, condition], null for a job that waits for none.
"""
import peewee


def up(migrator, db):
    if "depends_on" not in {column.name for column in db.get_columns("job")}:
        migrator.migrate(migrator.add_column("job", "depends_on", peewee.TextField(null=True)))
