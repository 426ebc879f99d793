"""Tenants for the platform tests: ``make_tenant("acme")`` is one organization (slug ``acme``) with a
member of each role, named ``acme-owner``, ``acme-admin``, ``acme-member`` and ``acme-viewer``.
The ``tenant`` and ``other_tenant`` fixtures (conftest) are acme and globex."""

from dataclasses import dataclass

from accounts.models import Organization, Plan, Role, User
from tests.platform.factories import MembershipFactory, OrganizationFactory, PlanFactory


@dataclass
class Tenant:
    """One organization with a member of each role."""

    organization: Organization
    owner: User
    admin: User
    member: User
    viewer: User

    def user(self, role: str) -> User:
        return getattr(self, role)


def make_tenant(name: str) -> Tenant:
    organization = OrganizationFactory(name=name.capitalize(), slug=name)
    users = {
        role: MembershipFactory(organization=organization, role=role, user__username=f"{name}-{role}").user
        for role in (Role.OWNER, Role.ADMIN, Role.MEMBER, Role.VIEWER)
    }
    return Tenant(organization=organization, **users)


def give_plan(organization: Organization, **limits) -> Plan:
    """Put ``organization`` on a plan of its own with ``limits`` (unlimited otherwise), as staff
    would; change its limits later with ``Plan.objects.filter(pk=plan.pk).update(...)``."""
    plan = PlanFactory(name=f"{organization.slug}-plan", **limits)
    Organization.objects.filter(pk=organization.pk).update(plan=plan)
    organization.plan = plan
    return plan
