"""The event stream's table, `stream_event` (models.StreamEvent, events.py).

Every row inserted into job_event is copied into it by a trigger, in the same
transaction, whatever code path wrote it: the stream cannot miss a transition,
and the hot paths of submit and placement pay no extra round trip. Node and log
events are written by the scheduler itself.

On PostgreSQL, `tx` defaults to the writing transaction's id, and the copy is a
statement-level trigger (one insert per statement, not one per row of a batch).
"""
import peewee

from corral.server.backends.lookup import backend_of


class StreamEvent(peewee.Model):
    id = peewee.BigAutoField()
    tx = peewee.BigIntegerField(null=True, index=True)
    at = peewee.DoubleField()
    type = peewee.CharField(max_length=8)
    job_id = peewee.BigIntegerField(null=True)
    node_id = peewee.CharField(max_length=128, null=True)
    data = peewee.TextField()

    class Meta:
        table_name = "stream_event"


SQLITE_TRIGGER = """
CREATE TRIGGER IF NOT EXISTS job_event_to_stream AFTER INSERT ON job_event BEGIN
    INSERT INTO stream_event (at, type, job_id, node_id, data)
    VALUES (NEW.at, 'job', NEW.job_id, NEW.node_id,
            json_object('from', NEW.from_status, 'to', NEW.to_status, 'attempt', NEW.attempt,
                        'reason', NEW.reason));
END
"""

POSTGRES_FUNCTION = """
CREATE OR REPLACE FUNCTION job_event_to_stream() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO stream_event (at, type, job_id, node_id, data)
    SELECT at, 'job', job_id, node_id,
           json_build_object('from', from_status, 'to', to_status, 'attempt', attempt, 'reason', reason)::text
    FROM inserted ORDER BY id;
    RETURN NULL;
END $$
"""

POSTGRES_TRIGGER = """
CREATE TRIGGER job_event_to_stream AFTER INSERT ON job_event
REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION job_event_to_stream()
"""


def up(migrator, db):
    db.bind([StreamEvent])
    db.create_tables([StreamEvent], safe=True)
    for sql in backend_of(db).pick(
            sqlite=[SQLITE_TRIGGER],
            postgresql=["ALTER TABLE stream_event ALTER COLUMN tx SET DEFAULT pg_current_xact_id()::text::bigint",
                        POSTGRES_FUNCTION, "DROP TRIGGER IF EXISTS job_event_to_stream ON job_event",
                        POSTGRES_TRIGGER]):
        db.execute_sql(sql)
