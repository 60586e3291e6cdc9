"""A job's own `timeout_secs` (null: JOB_TIMEOUT_SECS, as every job before), and the
indexes GET /jobs?name= and ?schedule= find their jobs by."""
import peewee


def up(migrator, db):
    steps = []
    if "timeout_secs" not in {column.name for column in db.get_columns("job")}:
        steps.append(migrator.add_column("job", "timeout_secs", peewee.DoubleField(null=True)))
    indexes = {tuple(index.columns) for index in db.get_indexes("job")}
    steps += [migrator.add_index("job", columns, False) for columns in (("name",), ("schedule",))
              if columns not in indexes]
    if steps:
        migrator.migrate(*steps)
