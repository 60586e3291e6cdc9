"""Indexes for placement over a long queue.

Placement asks for the oldest unplaced jobs (status 'pending', no node, in id
order) and for those pinned to the nodes with a free slot. With only the
(status, node_id) index, both read every unplaced job on each pass: with tens of
thousands queued, that was most of a pass. (status, node_id, id) hands out the
oldest first and stops at the limit; instance_id finds the pinned ones directly.

A database made before versioned migrations gets its first step's tables with
the indexes of the models of its time, which may include these: each is made
only when missing.
"""
INDEXES = (("status", "node_id", "id"), ("instance_id",))


def up(migrator, db):
    have = {tuple(index.columns) for index in db.get_indexes("job")}
    migrator.migrate(*[migrator.add_index("job", columns, False) for columns in INDEXES if columns not in have])
