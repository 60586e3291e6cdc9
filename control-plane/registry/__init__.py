"""The registry: which nodes and services exist, and whether they are healthy."""
