"""The Corral node agent.

Registers the node, heartbeats, pulls jobs from the scheduler, runs them as local
process groups and reports how they ended."""
