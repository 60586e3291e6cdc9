"""A job's disk limit and why its agent ended it: `disk_mb`, the most its work dir
may hold (null: JOB_DEFAULT_DISK_MB), and `ended_by` (disk, timeout, memory; null:
it exited on its own); both null for jobs submitted before."""
import peewee


def up(migrator, db):
    columns = {column.name for column in db.get_columns("job")}
    added = [migrator.add_column("job", name, field) for name, field in (
        ("disk_mb", peewee.IntegerField(null=True)),
        ("ended_by", peewee.CharField(max_length=16, null=True))) if name not in columns]
    if added:
        migrator.migrate(*added)
