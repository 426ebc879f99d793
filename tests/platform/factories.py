"""factory_boy factories for the platform tests.

``MembershipFactory(role=Role.ADMIN)`` makes a user and an organization around the membership;
pass ``organization=`` to put several people in one tenant. Factory organizations are on the
``unlimited`` plan (no limit, weight 1), so tests of other things never run into a quota; tests of
quotas give them a plan (``PlanFactory``, ``services.plan_assign``), and organizations made through
the services start on the default plan as they do in production. Tokens come from
``services.token_create`` (see the ``bearer`` fixture), which is what hands out plaintexts.
"""

import factory
from factory.django import DjangoModelFactory

from accounts.models import AuditLog, Membership, Organization, Plan, Role, User

PASSWORD = "correct horse battery staple"


class UserFactory(DjangoModelFactory):
    class Meta:
        model = User
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda user: f"{user.username}@example.com")
    password = factory.django.Password(PASSWORD)


class PlanFactory(DjangoModelFactory):
    """A plan; no limit unless given (``PlanFactory(max_concurrent_jobs=1)``)."""

    class Meta:
        model = Plan
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"plan-{n}")
    weight = 1.0


class OrganizationFactory(DjangoModelFactory):
    class Meta:
        model = Organization
        django_get_or_create = ("slug",)

    name = factory.Sequence(lambda n: f"Organization {n}")
    slug = factory.LazyAttribute(lambda org: org.name.lower().replace(" ", "-"))
    plan = factory.SubFactory(PlanFactory, name="unlimited", max_priority="high")


class MembershipFactory(DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    organization = factory.SubFactory(OrganizationFactory)
    role = Role.MEMBER


class AuditLogFactory(DjangoModelFactory):
    class Meta:
        model = AuditLog

    organization = factory.SubFactory(OrganizationFactory)
    actor = None
    action = "test.happened"
    target = factory.Sequence(lambda n: f"target{n}")
    data = factory.LazyFunction(dict)
