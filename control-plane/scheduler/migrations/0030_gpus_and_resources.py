"""GPUs and other countable resources (docs/scheduling.md, "GPUs and other resources").

A job's request (`gpus`, `gpu_model`, `gpu_memory_mb`, `resources`) and the devices
placement reserved for it on its node (`gpus_assigned`, their UUIDs); a node's devices
and declared resources, copied from the registry's list. Nullable columns (null: none
asked, none reserved, none advertised): servers of the previous release do not name them."""
import peewee

from corral.server.db import JSONField


def up(migrator, db):
    for table, columns in (("job", (("gpus", peewee.IntegerField(null=True)),
                                    ("gpu_model", peewee.CharField(max_length=128, null=True)),
                                    ("gpu_memory_mb", peewee.IntegerField(null=True)),
                                    ("resources", JSONField(null=True)),
                                    ("gpus_assigned", JSONField(null=True)))),
                           ("node", (("gpus", JSONField(null=True)), ("resources", JSONField(null=True))))):
        present = {column.name for column in db.get_columns(table)}
        steps = [migrator.add_column(table, name, field) for name, field in columns if name not in present]
        if steps:
            migrator.migrate(*steps)
