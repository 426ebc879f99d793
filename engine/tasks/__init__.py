"""What a job learns: problems and datasets, their verifiers (rewards) and the calculator tool."""
