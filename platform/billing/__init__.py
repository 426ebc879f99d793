"""GPU-hour billing: the usage ledger, period summaries and savings reports."""
