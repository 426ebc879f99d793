"""``manage.py create_organization NAME --owner USERNAME [--password PW]``: bootstrap a tenant.

For operators on a fresh install (before any staff user can use the API) and for scripts; errors
are one line with exit status 2.
"""

from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from accounts import services
from accounts.models import User


def _one_line(error: ValidationError) -> str:
    return " ".join(error.messages)


class Command(BaseCommand):
    help = "Create an organization owned by USERNAME (the user is created when absent)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("name", help="the organization's name (its slug is made from it)")
        parser.add_argument("--owner", required=True, help="username of the first owner")
        parser.add_argument(
            "--password",
            help="password for a user created here (without it the user cannot log in until a password is set)",
        )

    def handle(self, *args, name: str, owner: str, password: str | None, **options) -> None:
        if not name.strip():
            raise CommandError("NAME must not be empty.", returncode=2)
        if not owner.strip():
            raise CommandError("--owner must not be empty.", returncode=2)
        try:
            with transaction.atomic():
                user = User.objects.filter(username=owner).first()
                if user is None:
                    user = User(username=owner)
                    if password is None:
                        user.set_unusable_password()
                    else:
                        validate_password(password, user)
                        user.set_password(password)
                    user.full_clean(exclude=["password"])
                    user.save()
                    created = " (new user)"
                elif password is not None:
                    raise CommandError(
                        f"User {owner!r} exists; --password only sets the password of a user created here.",
                        returncode=2,
                    )
                else:
                    created = ""
                organization = services.organization_create(name=name, owner=user)
        except ValidationError as error:
            raise CommandError(_one_line(error), returncode=2) from None
        self.stdout.write(
            f"Created organization {organization.name} (id {organization.pk}, slug {organization.slug}) "
            f"owned by {user.username}{created}."
        )
