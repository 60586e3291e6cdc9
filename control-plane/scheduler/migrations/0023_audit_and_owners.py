"""The audit log, the OIDC subjects seen, and who owns each schedule and concurrency
limit (docs/security.md, "Audit log" and "Users and teams").

`audit_event`: one row per state-changing request of a user (control-plane/server/audit_trail.py).
`oidc_subject`: each identity-provider subject seen, so that a first login is recorded.
Schedules and concurrency limits made before this step belong to the team `default`;
schedules were made by `admin` (the bootstrap token's user). The columns are added
with those values as their defaults, as 0022 did for jobs.

Frozen copies, not the live models (0001_initial says why)."""
import peewee


class AuditEvent(peewee.Model):
    id = peewee.BigAutoField()
    at = peewee.DoubleField(index=True)
    user = peewee.CharField(max_length=128)
    team = peewee.CharField(max_length=128, null=True)
    action = peewee.CharField(max_length=64)
    target = peewee.CharField(max_length=256, null=True)
    method = peewee.CharField(max_length=8)
    path = peewee.CharField(max_length=256)
    address = peewee.CharField(max_length=64, null=True)
    status = peewee.IntegerField()
    token_id = peewee.CharField(max_length=32, null=True)

    class Meta:
        table_name = "audit_event"
        indexes = ((("user", "id"), False), (("team", "id"), False))


class OidcSubject(peewee.Model):
    subject = peewee.CharField(primary_key=True, max_length=255)
    user = peewee.CharField(max_length=128)
    first_seen_at = peewee.DoubleField()

    class Meta:
        table_name = "oidc_subject"


MODELS = [AuditEvent, OidcSubject]
OWNERS = (("schedule", "team", "'default'"), ("schedule", "created_by", "'admin'"),
          ("concurrency_limit", "team", "'default'"))


def up(migrator, db):
    db.bind(MODELS)
    db.create_tables(MODELS, safe=True)
    for table, column, default in OWNERS:
        if column not in {c.name for c in db.get_columns(table)}:
            db.execute_sql(f"ALTER TABLE {table} ADD COLUMN {column} VARCHAR(128) NOT NULL DEFAULT {default}")
