"""Management commands of the accounts app."""
