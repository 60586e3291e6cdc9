"""Multi-node jobs (docs/scheduling.md, "Multi-node jobs"): a job's node count and
since when it holds nodes; a member's job and place in its gang. Nullable columns (null:
a job of one node), and a partial index on the members' job: only members are in it, so
the jobs of one node pay no upkeep for it."""
import peewee

from corral.server.db import JSONField

GANG_MEMBERS = "job_gang_members"  # models.GANG_MEMBERS as this step made it


def up(migrator, db):
    present = {column.name for column in db.get_columns("job")}
    columns = (("nodes", peewee.IntegerField(null=True)), ("gang_held_since", peewee.DoubleField(null=True)),
               ("gang_id", peewee.BigIntegerField(null=True)), ("gang", JSONField(null=True)))
    steps = [migrator.add_column("job", name, field) for name, field in columns if name not in present]
    if steps:
        migrator.migrate(*steps)
    if GANG_MEMBERS not in {index.name for index in db.get_indexes("job")}:
        db.execute_sql(f'CREATE INDEX IF NOT EXISTS "{GANG_MEMBERS}" ON "job" ("gang_id", "attempt") '
                       'WHERE "gang_id" IS NOT NULL')
