"""Per-node credential revocation (control-plane/server/revocations.py): the lowest generation of
each node's credential the scheduler still accepts. A table only: servers of the
previous release do not read it, and accept every credential as before."""
import peewee


class NodeCredential(peewee.Model):
    node_id = peewee.CharField(primary_key=True, max_length=128)
    min_generation = peewee.IntegerField()
    revoked_at = peewee.DoubleField()

    class Meta:
        table_name = "node_credential"


def up(migrator, db):
    db.bind([NodeCredential])
    db.create_tables([NodeCredential], safe=True)
