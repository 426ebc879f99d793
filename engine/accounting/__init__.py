"""Metering (usage records, ledgers, savings) and the pre-run estimate: what a job costs, one implementation."""
