"""Billing models (usage ledger, period summaries) come with the billing issue."""
