"""factory_boy factories for the platform tests.

``MembershipFactory(role=Role.ADMIN)`` makes a user and an organization around the membership;
pass ``organization=`` to put several people in one tenant. Tokens come from
``services.token_create`` (see the ``bearer`` fixture), which is what hands out plaintexts.
"""

import factory
from factory.django import DjangoModelFactory

from accounts.models import AuditLog, Membership, Organization, Quota, Role, User

PASSWORD = "correct horse battery staple"


class UserFactory(DjangoModelFactory):
    class Meta:
        model = User
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda user: f"{user.username}@example.com")
    password = factory.django.Password(PASSWORD)


class OrganizationFactory(DjangoModelFactory):
    class Meta:
        model = Organization
        django_get_or_create = ("slug",)
        skip_postgeneration_save = True

    name = factory.Sequence(lambda n: f"Organization {n}")
    slug = factory.LazyAttribute(lambda org: org.name.lower().replace(" ", "-"))

    @factory.post_generation
    def quota(self, create, extracted, **kwargs):
        """Every organization has a quota (``services.organization_create`` makes it): unlimited."""
        if create:
            Quota.objects.get_or_create(organization=self, defaults=kwargs)


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
