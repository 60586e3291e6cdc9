"""Storage backends (see shared/db.py)."""
