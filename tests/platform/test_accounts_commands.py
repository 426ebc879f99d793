"""``manage.py create_organization`` and ``manage.py create_token``: output, errors, exit status."""

from io import StringIO

import pytest
from django.contrib.auth import authenticate
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from accounts.models import ApiToken, Membership, Organization, Role, User, token_digest
from tests.platform.factories import MembershipFactory

pytestmark = pytest.mark.django_db


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def command_error(*args: str) -> CommandError:
    with pytest.raises(CommandError) as error:
        run(*args)
    assert error.value.returncode == 2
    assert "\n" not in str(error.value)
    return error.value


# --- create_organization ------------------------------------------------------------------------


def test_create_organization_creates_the_owner_when_absent():
    out, _ = run("create_organization", "Hooli Labs", "--owner", "gavin", "--password", "a-long-enough-passphrase")
    organization = Organization.objects.get(slug="hooli-labs")
    assert out == (
        f"Created organization Hooli Labs (id {organization.pk}, slug hooli-labs) owned by gavin (new user).\n"
    )
    assert Membership.objects.get(organization=organization).role == Role.OWNER
    assert organization.plan.name == "starter"  # the default plan
    assert authenticate(username="gavin", password="a-long-enough-passphrase") == User.objects.get(username="gavin")


def test_create_organization_with_an_existing_owner(tenant):
    out, _ = run("create_organization", "Second", "--owner", "acme-viewer")
    assert out.endswith("owned by acme-viewer.\n")
    assert Membership.objects.get(organization__slug="second").user == tenant.viewer


def test_create_organization_without_password_makes_a_user_who_cannot_log_in_yet():
    run("create_organization", "Pied Piper", "--owner", "richard")
    assert not User.objects.get(username="richard").has_usable_password()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("Acme", "--owner", "someone"), "already exists"),
        (("New", "--owner", "acme-owner", "--password", "another-long-password"), "--password only sets"),
        (("New", "--owner", "fresh", "--password", "123"), "too short"),
        (("New", "--owner", "bad name!"), "username"),
        (("  ", "--owner", "fresh"), "NAME must not be empty"),
    ],
    ids=["taken-name", "password-of-existing-user", "weak-password", "bad-username", "blank-name"],
)
def test_create_organization_errors(tenant, args, message):
    error = command_error("create_organization", *args)
    assert message in str(error)
    assert Organization.objects.count() == 1
    assert not User.objects.filter(username__in=["someone", "fresh", "bad name!"]).exists()


# --- create_token -------------------------------------------------------------------------------


def test_create_token_prints_only_a_working_token(tenant):
    out, err = run("create_token", "acme-member", "--name", "ci", "--expires-days", "30")
    plaintext = out.strip()
    assert out == plaintext + "\n"
    assert plaintext.startswith("plx_")
    assert err == ""
    token = ApiToken.objects.get(digest=token_digest(plaintext))
    assert (token.user, token.organization, token.name) == (tenant.member, tenant.organization, "ci")
    assert token.expires_at is not None
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    assert client.get("/api/v1/tokens/").status_code == 200


def test_create_token_needs_org_when_the_user_has_several(tenant, other_tenant):
    MembershipFactory(user=tenant.member, organization=other_tenant.organization)
    error = command_error("create_token", "acme-member")
    assert "choose one with --org" in str(error)
    assert "(acme, globex)" in str(error)
    assert not ApiToken.objects.exists()
    for org in ("globex", "Globex"):  # slug or name
        out, _ = run("create_token", "acme-member", "--org", org)
        assert ApiToken.objects.get(digest=token_digest(out.strip())).organization == other_tenant.organization


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nobody",), "No user named 'nobody'"),
        (("acme-member", "--org", "globex"), "not a member of an organization named 'globex'"),
        (("acme-member", "--expires-days", "0"), "--expires-days must be between"),
        (("acme-member", "--name", " "), "--name must not be empty"),
    ],
    ids=["unknown-user", "not-a-member", "zero-days", "blank-name"],
)
def test_create_token_errors(tenant, other_tenant, args, message):
    assert message in str(command_error("create_token", *args))
    assert not ApiToken.objects.exists()


def test_create_token_for_a_user_of_no_organization(db):
    User.objects.create_user(username="loner")
    assert "not a member of any organization" in str(command_error("create_token", "loner"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [("create_token", "ada", "--expires-days", "-1"), ("create_organization", " ", "--owner", "ada")],
    ids=["create_token", "create_organization"],
)
def test_bad_input_exits_with_status_2_and_one_line(manage, args):
    result = manage(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("CommandError: ")
