"""A job's W3C trace context (shared/tracecontext.py): `traceparent`, the span of
its submit in the trace the request came with (or a new one), and the request's
`tracestate`; null for jobs submitted before."""
import peewee


def up(migrator, db):
    columns = {column.name for column in db.get_columns("job")}
    added = [migrator.add_column("job", name, field) for name, field in (
        ("traceparent", peewee.CharField(max_length=55, null=True)),
        ("tracestate", peewee.TextField(null=True))) if name not in columns]
    if added:
        migrator.migrate(*added)
