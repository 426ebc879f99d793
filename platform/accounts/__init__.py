"""Tenants and people: organizations, memberships, API tokens, quotas."""
