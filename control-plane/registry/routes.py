"""The registry's routes.

The resource groups (api/), and the access table (control-plane/server/auth.py)
generated from their declarations."""
from corral.server.routes import access_table

from .api import discovery, nodes, services

GROUPS = (nodes.routes, services.routes, discovery.routes)

# Who may call each route, from each route's declaration. Agents register, heartbeat
# and record services for the node of their credential only (services of their own
# jobs: the scheduler's grant); operators drain and forget nodes; both read.
ACCESS = access_table(GROUPS)
