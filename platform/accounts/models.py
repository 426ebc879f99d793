"""Account models. Organizations, memberships, tokens and quotas come with the accounts issue."""

from django.contrib.auth.models import AbstractUser


class User(AbstractUser):
    """The project's own user model, in place before the first migration so it can grow later
    (Django cannot swap ``AUTH_USER_MODEL`` once tables exist)."""
