"""Drop the (status, node_id) index of the job table.

(status, node_id, id), which migration 0002 added, begins with the same columns
and serves every query the older index served. Every update of a job's status or
node (placed, claimed, ended: three per job) writes an entry into each index on
those columns, so the redundant one only cost writes.
"""


def up(migrator, db):
    if any(tuple(index.columns) == ("status", "node_id") for index in db.get_indexes("job")):
        migrator.migrate(migrator.drop_index("job", "job_status_node_id"))
