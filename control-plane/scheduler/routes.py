"""The scheduler's routes.

The resource groups (api/), and what is generated from their declarations: the access
table (control-plane/server/auth.py) and the routes that take raw bytes rather than JSON
(control-plane/server/guards.py)."""
from corral.server.routes import access_table, audited_actions, raw_routes

from .api import (accounts, agents, arrays, audit, concurrency, events, jobs, logs, nodes, quotas, schedules, stats,
                  submits, tokens, usage)

GROUPS = (stats.routes, nodes.routes, submits.routes, jobs.routes, arrays.routes, schedules.routes,
          concurrency.routes, events.routes, agents.routes, logs.routes, tokens.routes,
          accounts.routes, quotas.routes, audit.routes, usage.routes)

# Who may call each route, from each route's declaration. Agents: claims, leases,
# reports, live output and the original design's poll, each for the node of their
# credential only. The read-only token: every read (READ), with env var values hidden.
ACCESS = access_table(GROUPS)
RAW_ROUTES = raw_routes(GROUPS)
# The requests the audit log records: every one of a user that may change something.
AUDITED = audited_actions(GROUPS)
