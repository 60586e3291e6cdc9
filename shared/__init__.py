"""Code shared by the registry, the scheduler and the agent."""
