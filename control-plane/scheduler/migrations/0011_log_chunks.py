"""Complete logs (job_logs.py): every chunk of every attempt's stdout and stderr, as
its agent shipped it. The bytes are in `data`, or in S3 under `object_key` when
CORRAL_LOG_BUCKET is set. One row per (job, attempt, stream, seq): a chunk sent
twice is stored once."""
import peewee


class LogChunk(peewee.Model):
    id = peewee.BigAutoField()
    job_id = peewee.BigIntegerField()
    attempt = peewee.IntegerField()
    stream = peewee.CharField(max_length=8)
    seq = peewee.IntegerField()
    start = peewee.BigIntegerField()
    size = peewee.IntegerField()
    final = peewee.BooleanField()
    sha256 = peewee.CharField(max_length=64)
    data = peewee.BlobField(null=True)
    object_key = peewee.TextField(null=True)
    at = peewee.DoubleField()

    class Meta:
        table_name = "log_chunk"
        indexes = ((("job_id", "attempt", "stream", "seq"), True),)


def up(migrator, db):
    db.bind([LogChunk])
    db.create_tables([LogChunk], safe=True)
