"""The scheduler's schema migrations, recorded in `scheduler_schema_migration`
(control-plane/server/migrations.py says how they are written and applied)."""
import os

from corral.server.migrations import MigrationSet

MIGRATIONS = MigrationSet(service="scheduler", directory=os.path.dirname(os.path.abspath(__file__)),
                          lock_key=0x436F7272_616C4D01)  # its PostgreSQL advisory lock: "CorralM", 1
