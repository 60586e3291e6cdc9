"""What GPUs jobs use, as their agents read it through NVML (docs/scheduling.md, "GPUs
and other resources"): per ended attempt, its devices' peak memory and mean
utilisation; per node, its devices' memory in use and utilisation with the last lease
renewal. Nullable columns (null: not read): servers of the previous release do not name them."""
import peewee


def up(migrator, db):
    for table, columns in (("job", (("peak_gpu_memory_mb", peewee.IntegerField(null=True)),
                                    ("gpu_utilization_percent", peewee.DoubleField(null=True)))),
                           ("node_lease", (("used_gpu_memory_mb", peewee.IntegerField(null=True)),
                                           ("used_gpu_percent", peewee.DoubleField(null=True))))):
        present = {column.name for column in db.get_columns(table)}
        steps = [migrator.add_column(table, name, field) for name, field in columns if name not in present]
        if steps:
            migrator.migrate(*steps)
