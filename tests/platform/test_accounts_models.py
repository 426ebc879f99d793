"""Account models: role order, token format and every model's string form."""

import pytest

from accounts import services
from accounts.models import AuditLog, Role, token_digest, token_generate


def test_roles_are_ordered_viewer_member_admin_owner():
    assert [r.value for r in sorted(Role, key=lambda r: r.rank)] == ["viewer", "member", "admin", "owner"]
    assert Role.OWNER.at_least("admin")
    assert Role.ADMIN.at_least(Role.ADMIN)
    assert not Role.MEMBER.at_least(Role.ADMIN)
    assert not Role.VIEWER.at_least("member")


def test_tokens_are_random_and_digested_with_sha256():
    first, second = token_generate(), token_generate()
    assert first != second
    assert first.startswith("plx_")
    assert len(first) == 4 + 43  # 32 random bytes, URL-safe base64
    assert token_digest("plx_abc") == "9305b7f2eac76fbc236d0e563326d5711fd085e4e2f8f4ed2e4765bc5ce3040f"


@pytest.mark.django_db
def test_every_model_has_a_readable_string(tenant):
    token, _ = services.token_create(user=tenant.member, organization=tenant.organization, name="ci")
    assert str(tenant.organization) == "Acme"
    assert str(tenant.organization.memberships.get(user=tenant.viewer)) == "acme-viewer in Acme (viewer)"
    assert str(token) == f"ci ({token.prefix}…) of acme-member in Acme"
    assert str(tenant.organization.plan) == (
        "Plan unlimited: device_hours_per_month=unlimited, max_concurrent_jobs=unlimited, "
        "max_devices_per_job=unlimited, weight=1, max_priority=high"
    )
    assert str(AuditLog.objects.get()).endswith(f"Acme: token.created {token.prefix}")
    assert str(tenant.viewer) == "acme-viewer"
