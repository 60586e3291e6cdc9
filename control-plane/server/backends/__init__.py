"""Storage backends (see control-plane/server/db.py)."""
