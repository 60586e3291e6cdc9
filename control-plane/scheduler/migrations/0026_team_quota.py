"""A team's quota (docs/scheduling.md, "Quotas"): what it is guaranteed, may borrow and
lends, as JSON. Nullable: servers of the previous release do not name it."""
from corral.server.db import JSONField


def up(migrator, db):
    if "quota" not in {column.name for column in db.get_columns("team")}:
        migrator.migrate(migrator.add_column("team", "quota", JSONField(null=True)))
