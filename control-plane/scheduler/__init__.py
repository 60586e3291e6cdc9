"""The scheduler: takes jobs, places them on healthy nodes, records their results."""
