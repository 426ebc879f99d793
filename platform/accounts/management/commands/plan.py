"""``manage.py plan``: platform staff manage plans (quotas and scheduler weights) from a shell.

    manage.py plan list
    manage.py plan create NAME [--device-hours H] [--concurrent-jobs N] [--devices-per-job N]
                               [--weight W] [--max-priority low|normal|high] [--description TEXT]
    manage.py plan set NAME [the same options; "unlimited" clears a limit]
    manage.py plan assign ORGANIZATION_SLUG NAME

``--by USERNAME`` (a staff user) puts that person in the audit log; without it the change is the
system's. Errors are one line with exit status 2.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management.base import BaseCommand, CommandError

from accounts import selectors, services
from accounts.models import Organization, Plan, Priority, User

UNLIMITED = "unlimited"


def _limit(kind: type):
    """An argparse type: a number of ``kind``, or "unlimited" (None)."""

    def parse(text: str) -> Any:
        if text == UNLIMITED:
            return None
        try:
            return kind(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a number or {UNLIMITED!r}") from None

    parse.__name__ = f"{kind.__name__} or {UNLIMITED}"
    return parse


class Command(BaseCommand):
    help = "List, create, change and assign plans (an organization's quota and scheduler weight)."

    def add_arguments(self, parser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list", help="every plan and how many organizations are on it")
        for action in ("create", "set"):
            edit = sub.add_parser(action, help=f"{action} a plan")
            edit.add_argument("name")
            given = {"default": argparse.SUPPRESS}  # absent unless given ("unlimited" is None)
            edit.add_argument("--description", **given)
            edit.add_argument("--device-hours", dest="device_hours_per_month", type=_limit(float), **given)
            edit.add_argument("--concurrent-jobs", dest="max_concurrent_jobs", type=_limit(int), **given)
            edit.add_argument("--devices-per-job", dest="max_devices_per_job", type=_limit(int), **given)
            edit.add_argument("--weight", type=float, **given)
            edit.add_argument("--max-priority", choices=Priority.values, **given)
            edit.add_argument("--model-bytes", dest="max_model_bytes", type=int, **given,
                              help="the largest model folder its members may upload")
            edit.add_argument("--dataset-bytes", dest="max_dataset_bytes", type=int, **given,
                              help="the largest dataset file its members may upload")
            edit.add_argument("--by", help="the staff user making the change (for the audit log)")
        assign = sub.add_parser("assign", help="put an organization on a plan")
        assign.add_argument("organization", help="the organization's slug")
        assign.add_argument("name", help="the plan's name")
        assign.add_argument("--by", help="the staff user making the change (for the audit log)")

    def handle(self, *args, action: str, **options) -> None:
        try:
            if action == "list":
                self._list()
                return
            actor = self._actor(options.get("by"))
            if action == "assign":
                self._assign(options["organization"], options["name"], actor)
                return
            fields = {name: options[name] for name in Plan.EDITABLE_FIELDS if name in options}
            if action == "create":
                plan = services.plan_create(actor=actor, name=options["name"], **fields)
            else:
                plan = services.plan_update(plan=self._plan(options["name"]), actor=actor, **fields)
        except ValidationError as error:
            messages = ([f"{field}: {' '.join(errors)}" for field, errors in error.message_dict.items()]
                        if hasattr(error, "error_dict") else error.messages)
            raise CommandError(" ".join(messages), returncode=2) from None
        except PermissionDenied as error:
            raise CommandError(str(error), returncode=2) from None
        self.stdout.write(str(plan))

    def _list(self) -> None:
        for plan in selectors.plans():
            self.stdout.write(f"{plan} ({plan.organization_count} organizations)")

    @staticmethod
    def _actor(username: str | None) -> User | None:
        if username is None:
            return None
        user = User.objects.filter(username=username).first()
        if user is None or not user.is_staff:
            raise CommandError(f"--by {username!r} is not a staff user.", returncode=2)
        return user

    @staticmethod
    def _plan(name: str) -> Plan:
        plan = Plan.objects.filter(name=name).first()
        if plan is None:
            raise CommandError(f"No plan named {name!r} (see `manage.py plan list`).", returncode=2)
        return plan

    def _assign(self, slug: str, name: str, actor: User | None) -> None:
        organization = Organization.objects.filter(slug=slug).first()
        if organization is None:
            raise CommandError(f"No organization with the slug {slug!r}.", returncode=2)
        organization = services.plan_assign(organization=organization, plan=self._plan(name), actor=actor)
        self.stdout.write(f"{organization.name} is on plan {organization.plan.name}.")
