"""The charts' samples (sampler.py): one row per STATS_INTERVAL_SECS, pruned after
STATS_RETENTION_SECS, read in time order (GET /stats/history)."""
import peewee


class StatsSample(peewee.Model):
    id = peewee.BigAutoField()
    at = peewee.DoubleField(index=True)
    since = peewee.DoubleField()
    data = peewee.TextField()

    class Meta:
        table_name = "stats_sample"


def up(migrator, db):
    db.bind([StatsSample])
    db.create_tables([StatsSample], safe=True)
