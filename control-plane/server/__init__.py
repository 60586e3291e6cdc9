"""What the registry and the scheduler share and the agent and the CLI do not: the gunicorn
worker and its HTTP framing, request guards and access rules, the database, its backends and
migrations, leases, metrics and the OpenAPI builder."""
