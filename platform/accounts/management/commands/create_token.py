"""``manage.py create_token USERNAME [--org NAME] [--name N] [--expires-days D]``: print a new API
token, and nothing else on stdout, so scripts can capture it (``TOKEN=$(manage.py create_token
ada)``). Errors are one line with exit status 2.
"""

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Q

from accounts import selectors, services
from accounts.models import TOKEN_MAX_DAYS, User


class Command(BaseCommand):
    help = "Create an API token of USERNAME in one of their organizations and print it (shown only this once)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("--org", help="organization name or slug; needed when the user belongs to several")
        parser.add_argument("--name", default="cli", help="the token's name, shown in token lists (default: cli)")
        parser.add_argument("--expires-days", type=int, help="days until the token expires (default: never)")

    def handle(self, *args, username: str, org: str | None, name: str, expires_days: int | None, **options) -> None:
        if expires_days is not None and not 1 <= expires_days <= TOKEN_MAX_DAYS:
            raise CommandError(f"--expires-days must be between 1 and {TOKEN_MAX_DAYS}.", returncode=2)
        if not name.strip():
            raise CommandError("--name must not be empty.", returncode=2)
        user = User.objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named {username!r}.", returncode=2)
        organizations = selectors.organizations_of(user=user)
        if org is not None:
            organization = organizations.filter(Q(name=org) | Q(slug=org)).first()
            if organization is None:
                raise CommandError(f"{username} is not a member of an organization named {org!r}.", returncode=2)
        else:
            found = list(organizations[:2])
            if not found:
                raise CommandError(f"{username} is not a member of any organization.", returncode=2)
            if len(found) > 1:
                slugs = ", ".join(organizations.values_list("slug", flat=True))
                raise CommandError(
                    f"{username} belongs to several organizations ({slugs}); choose one with --org.", returncode=2
                )
            organization = found[0]
        try:
            _, plaintext = services.token_create(
                user=user, organization=organization, name=name.strip(), expires_in_days=expires_days
            )
        except ValidationError as error:
            raise CommandError(" ".join(error.messages), returncode=2) from None
        self.stdout.write(plaintext)
