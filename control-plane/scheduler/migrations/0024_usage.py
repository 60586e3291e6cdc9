"""Usage accounting (docs/scheduling.md, "Usage"): what the ended attempts of each
user's jobs in each team used, per UTC day, kept beyond the jobs' retention.

Frozen copy, not the live model (0001_initial says why)."""
import peewee


class UsageDay(peewee.Model):
    day = peewee.IntegerField()                 # days since 1970-01-01, UTC
    team = peewee.CharField(max_length=128)
    user = peewee.CharField(max_length=128)
    attempts = peewee.BigIntegerField(default=0)
    cpu_seconds = peewee.DoubleField(default=0.0)
    wall_seconds = peewee.DoubleField(default=0.0)
    memory_mb_seconds = peewee.DoubleField(default=0.0)
    gpu_seconds = peewee.DoubleField(default=0.0)

    class Meta:
        table_name = "usage_day"
        primary_key = peewee.CompositeKey("day", "team", "user")


def up(migrator, db):
    db.bind([UsageDay])
    db.create_tables([UsageDay], safe=True)
