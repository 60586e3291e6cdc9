"""The scheduler's routes, one module per resource.

Submits, jobs, arrays, schedules, concurrency limits, nodes and drains, agents'
claims/leases/reports, logs, the event stream and stats, each route declared once with
its access rule and OpenAPI operation (control-plane/server/routes.py)."""
