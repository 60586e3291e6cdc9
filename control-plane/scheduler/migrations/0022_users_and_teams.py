"""Users and teams (docs/security.md, "Users and teams"): the `team`, `corral_user`,
`membership` and `api_token` tables, and each job's `team` and `submitted_by`.

Jobs stored before this step belong to the team `default` and were submitted by
`admin` (the bootstrap token's user): the columns are added with those values as
their defaults, which both databases apply without rewriting the table. The
`default` team is made here, so a cluster that configures no teams has its one.

Frozen copies, not the live models (0001_initial says why)."""
import time

import peewee


class Team(peewee.Model):
    name = peewee.CharField(primary_key=True, max_length=128)
    created_at = peewee.DoubleField()

    class Meta:
        table_name = "team"


class User(peewee.Model):
    name = peewee.CharField(primary_key=True, max_length=128)
    cluster_role = peewee.CharField(max_length=16, null=True)
    default_team = peewee.CharField(max_length=128, null=True)
    created_at = peewee.DoubleField()

    class Meta:
        table_name = "corral_user"


class Membership(peewee.Model):
    user = peewee.CharField(max_length=128)
    team = peewee.CharField(max_length=128, index=True)
    role = peewee.CharField(max_length=16)

    class Meta:
        table_name = "membership"
        primary_key = peewee.CompositeKey("user", "team")


class ApiToken(peewee.Model):
    token_id = peewee.CharField(primary_key=True, max_length=32)
    user = peewee.CharField(max_length=128, index=True)
    name = peewee.CharField(max_length=128)
    secret_sha256 = peewee.CharField(max_length=64, unique=True)
    scope = peewee.CharField(max_length=8)
    created_at = peewee.DoubleField()
    created_by = peewee.CharField(max_length=128)
    expires_at = peewee.DoubleField(null=True)
    revoked_at = peewee.DoubleField(null=True)
    last_used_at = peewee.DoubleField(null=True)

    class Meta:
        table_name = "api_token"


MODELS = [Team, User, Membership, ApiToken]


def up(migrator, db):
    db.bind(MODELS)
    db.create_tables(MODELS, safe=True)
    columns = {column.name for column in db.get_columns("job")}
    if "team" not in columns:
        db.execute_sql("ALTER TABLE job ADD COLUMN team VARCHAR(128) NOT NULL DEFAULT 'default'")
    if "submitted_by" not in columns:
        db.execute_sql("ALTER TABLE job ADD COLUMN submitted_by VARCHAR(128) NOT NULL DEFAULT 'admin'")
    if "job_team_id" not in {index.name for index in db.get_indexes("job")}:
        db.execute_sql("CREATE INDEX job_team_id ON job (team, id)")
    Team.insert(name="default", created_at=time.time()).on_conflict_ignore().execute()
