"""The registry's schema migrations, recorded in `registry_schema_migration`
(control-plane/server/migrations.py says how they are written and applied)."""
import os

from corral.server.migrations import MigrationSet

MIGRATIONS = MigrationSet(service="registry", directory=os.path.dirname(os.path.abspath(__file__)),
                          lock_key=0x436F7272_616C4D02)  # its PostgreSQL advisory lock: "CorralM", 2
