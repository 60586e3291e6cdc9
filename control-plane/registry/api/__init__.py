"""The registry's routes, one module per resource.

Nodes, services and Prometheus discovery, each route declared once with its access rule
and OpenAPI operation (control-plane/server/routes.py)."""
