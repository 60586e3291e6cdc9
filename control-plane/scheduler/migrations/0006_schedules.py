"""Schedules: jobs run at the slots of a cron expression or an interval.

Two tables: `schedule` (the definition, its next slot, the job of its last run)
and `schedule_run` (one row per slot that fired or was skipped, unique per
schedule and slot). A job a schedule created names it and its slot: two job
columns, `schedule` and `slot`.
"""
import peewee



class Schedule(peewee.Model):
    id = peewee.BigAutoField()
    name = peewee.CharField(max_length=128, unique=True)
    cron = peewee.CharField(max_length=256, null=True)
    interval_secs = peewee.DoubleField(null=True)
    start_at = peewee.DoubleField(null=True)
    time_zone = peewee.CharField(max_length=64)
    job = peewee.TextField()
    overlap = peewee.CharField(max_length=16)
    catch_up = peewee.CharField(max_length=8)
    enabled = peewee.BooleanField()
    next_run_at = peewee.DoubleField(null=True, index=True)
    last_job_id = peewee.BigIntegerField(null=True)
    created_at = peewee.DoubleField()
    updated_at = peewee.DoubleField()

    class Meta:
        table_name = "schedule"


class ScheduleRun(peewee.Model):
    id = peewee.BigAutoField()
    schedule_id = peewee.BigIntegerField()
    slot = peewee.DoubleField()
    job_id = peewee.BigIntegerField(null=True)
    skipped = peewee.TextField(null=True)
    created_at = peewee.DoubleField()

    class Meta:
        table_name = "schedule_run"
        indexes = ((("schedule_id", "slot"), True),)


JOB_COLUMNS = {
    "schedule": peewee.CharField(max_length=128, null=True),
    "slot": peewee.DoubleField(null=True),
}


def up(migrator, db):
    have = {column.name for column in db.get_columns("job")}
    migrator.migrate(*[migrator.add_column("job", name, field) for name, field in JOB_COLUMNS.items()
                       if name not in have])
    models = [Schedule, ScheduleRun]
    db.bind(models)
    db.create_tables(models, safe=True)


