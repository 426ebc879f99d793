"""The engine service: the controller actor, jobs' drivers, the local runtime, event logs and artifacts."""
