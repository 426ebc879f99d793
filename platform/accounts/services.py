"""Writes of the accounts app: organizations, members, tokens, plans, with their audit rows.

Called by the REST views (``accounts.views``), the management commands and, for ``audit_record``,
the other apps' services. Every function takes keyword-only arguments, runs in one transaction
and writes its audit row in that transaction. ``actor`` is the user acting (None: the system, such
as a management command, which skips the role checks).

Errors are Django's: ``ValidationError`` for invalid requests (the API answers 400) and
``PermissionDenied`` for rules about who may do what (403).

Plans are the platform's, not the tenants': only platform staff (or the system) create, change and
assign them. A change that reaches organizations sends ``signals.plan_changed`` after commit, on
which the jobs app starts the jobs a raised concurrency limit lets through and sends the new
weight and budget to the engine.
"""

from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.core.exceptions import ImproperlyConfigured, PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from accounts import signals, websocket
from accounts.models import (
    TOKEN_DISPLAY_CHARS,
    TOKEN_MAX_DAYS,
    ApiToken,
    AuditLog,
    Membership,
    Organization,
    Plan,
    Priority,
    Role,
    User,
    default_plan,
    token_digest,
    token_generate,
)


def audit_record(
    *, organization: Organization | None, actor: User | None, action: str, target: str = "",
    data: dict | None = None,
) -> AuditLog:
    """Append an audit row; call it inside the transaction of the change it records.

    Used by every service here and by the jobs app (job.created, job.cancelled, job.paused).
    ``organization`` None: a platform-wide change (a plan created or changed).
    """
    return AuditLog.objects.create(
        organization=organization, actor=actor, action=action, target=target[:200], data=data or {}
    )


def _lock(organization: Organization) -> Organization:
    """Lock the organization row, so concurrent membership changes cannot both remove the last
    owner (each would see the other owner still there)."""
    return Organization.objects.select_for_update().get(pk=organization.pk)


def _role_of(*, user: User, organization: Organization) -> Role | None:
    role = Membership.objects.filter(user=user, organization=organization).values_list("role", flat=True).first()
    return Role(role) if role else None


def _check_owner_rights(*, actor: User | None, organization: Organization, what: str) -> None:
    """Only owners (or the system) may grant, change or remove the owner role."""
    if actor is None:
        return
    if _role_of(user=actor, organization=organization) != Role.OWNER:
        raise PermissionDenied(f"Only owners of {organization.name} may {what}.")


def _check_keeps_an_owner(*, organization: Organization, losing: Membership) -> None:
    """An organization always keeps at least one owner; call with the organization locked."""
    if losing.role != Role.OWNER:
        return
    others = Membership.objects.filter(organization=organization, role=Role.OWNER).exclude(pk=losing.pk)
    if not others.exists():
        raise ValidationError(
            f"{losing.user.username} is the last owner of {organization.name}; make another member owner first."
        )


# --- organizations ------------------------------------------------------------------------------


@transaction.atomic
def organization_create(*, name: str, owner: User, actor: User | None = None, slug: str = "") -> Organization:
    """Create an organization with ``owner`` as its first owner, on the default plan
    (``settings.PLEXRL_DEFAULT_PLAN``).

    Called by the organizations API (platform staff) and ``manage.py create_organization``.
    """
    name = name.strip()
    if not name:
        raise ValidationError({"name": "The name must not be empty."})
    slug = slugify(slug or name)
    if not slug:
        raise ValidationError({"slug": "Give a slug of letters, digits, hyphens or underscores."})
    if Organization.objects.filter(name=name).exists():
        raise ValidationError({"name": f"An organization named {name!r} already exists."})
    if Organization.objects.filter(slug=slug).exists():
        raise ValidationError({"slug": f"An organization with the slug {slug!r} already exists."})
    try:
        plan = default_plan()
    except ImproperlyConfigured as exc:
        raise ValidationError({"plan": str(exc)}) from None
    organization = Organization.objects.create(name=name, slug=slug, plan=plan)
    Membership.objects.create(user=owner, organization=organization, role=Role.OWNER)
    audit_record(
        organization=organization,
        actor=actor,
        action="organization.created",
        target=organization.slug,
        data={"name": name, "owner": owner.username, "plan": plan.name},
    )
    return organization


# --- members ------------------------------------------------------------------------------------


@transaction.atomic
def member_add(*, organization: Organization, actor: User | None, user: User, role: Role | str) -> Membership:
    """Add ``user`` with ``role``; only owners may add an owner. Called by the members API."""
    role = Role(role)
    organization = _lock(organization)
    if role == Role.OWNER:
        _check_owner_rights(actor=actor, organization=organization, what="add owners")
    if Membership.objects.filter(organization=organization, user=user).exists():
        raise ValidationError({"username": f"{user.username} is already a member of {organization.name}."})
    membership = Membership.objects.create(organization=organization, user=user, role=role)
    audit_record(
        organization=organization,
        actor=actor,
        action="member.added",
        target=user.username,
        data={"user_id": user.pk, "role": role.value},
    )
    return membership


@transaction.atomic
def member_set_role(*, organization: Organization, actor: User | None, user: User, role: Role | str) -> Membership:
    """Change a member's role; granting or taking away the owner role needs an owner, and the last
    owner keeps it. Called by the members API."""
    role = Role(role)
    organization = _lock(organization)
    membership = Membership.objects.select_related("user").get(organization=organization, user=user)
    old = Role(membership.role)
    if old == role:
        return membership
    if Role.OWNER in (old, role):
        _check_owner_rights(actor=actor, organization=organization, what="grant or take away the owner role")
        _check_keeps_an_owner(organization=organization, losing=membership)
    membership.role = role
    membership.save(update_fields=["role"])
    audit_record(
        organization=organization,
        actor=actor,
        action="member.role_changed",
        target=user.username,
        data={"user_id": user.pk, "from": old.value, "to": role.value},
    )
    return membership


@transaction.atomic
def member_remove(*, organization: Organization, actor: User | None, user: User) -> None:
    """Remove a member and revoke their tokens of this organization (so re-adding them later does
    not bring old tokens back); their open sockets in it close after commit. Only owners remove
    owners; the last owner stays. Called by the members API."""
    organization = _lock(organization)
    membership = Membership.objects.select_related("user").get(organization=organization, user=user)
    if membership.role == Role.OWNER:
        _check_owner_rights(actor=actor, organization=organization, what="remove owners")
        _check_keeps_an_owner(organization=organization, losing=membership)
    revoked = ApiToken.objects.filter(organization=organization, user=user, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    membership.delete()
    websocket.close_sockets_on_commit(websocket.member_group(user.pk, organization.pk))
    audit_record(
        organization=organization,
        actor=actor,
        action="member.removed",
        target=user.username,
        data={"user_id": user.pk, "role": membership.role, "tokens_revoked": revoked},
    )


# --- tokens -------------------------------------------------------------------------------------


@transaction.atomic
def token_create(
    *, user: User, organization: Organization, name: str, expires_in_days: int | None = None
) -> tuple[ApiToken, str]:
    """Create a token of ``user`` for ``organization``; returns it with its plaintext, the only
    time the plaintext exists (only the digest is stored).

    Called by ``POST auth/token/``, ``POST tokens/`` and ``manage.py create_token``.
    """
    if not Membership.objects.filter(user=user, organization=organization).exists():
        raise ValidationError(f"{user.username} is not a member of {organization.name}.")
    if expires_in_days is not None and not 1 <= expires_in_days <= TOKEN_MAX_DAYS:
        raise ValidationError({"expires_days": f"Give 1 to {TOKEN_MAX_DAYS} days, or none for no expiry."})
    plaintext = token_generate()
    token = ApiToken.objects.create(
        user=user,
        organization=organization,
        name=name,
        prefix=plaintext[:TOKEN_DISPLAY_CHARS],
        digest=token_digest(plaintext),
        expires_at=timezone.now() + timedelta(days=expires_in_days) if expires_in_days else None,
    )
    audit_record(
        organization=organization,
        actor=user,
        action="token.created",
        target=token.prefix,
        data={"token_id": token.pk, "name": name, "user": user.username, "expires_at": token.expires_at},
    )
    return token, plaintext


@transaction.atomic
def token_revoke(*, token: ApiToken, actor: User | None) -> ApiToken:
    """Revoke a token, closing the sockets it opened after commit; its user or an admin/owner of its
    organization may. Revoking a revoked token changes nothing. Called by ``POST tokens/{id}/revoke/``."""
    token = ApiToken.objects.select_for_update().select_related("user", "organization").get(pk=token.pk)
    if actor is not None and actor.pk != token.user_id:
        role = _role_of(user=actor, organization=token.organization)
        if role is None or not role.at_least(Role.ADMIN):
            raise PermissionDenied("Only the token's user or an admin of its organization may revoke it.")
    if token.revoked_at is not None:
        return token
    token.revoked_at = timezone.now()
    token.save(update_fields=["revoked_at"])
    websocket.close_sockets_on_commit(websocket.token_group(token.pk))
    audit_record(
        organization=token.organization,
        actor=actor,
        action="token.revoked",
        target=token.prefix,
        data={"token_id": token.pk, "name": token.name, "user": token.user.username},
    )
    return token


# --- plans (platform staff) ---------------------------------------------------------------------


def _check_staff(actor: User | None, what: str) -> None:
    """Plans are the platform's: only staff (or the system, ``actor`` None) change them."""
    if actor is not None and not actor.is_staff:
        raise PermissionDenied(f"Only platform staff may {what}.")


def _plan_fields(plan: Plan, fields: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Set ``fields`` on ``plan`` (validated); returns what changed, ``{name: {"from", "to"}}``."""
    unknown = sorted(set(fields) - set(Plan.EDITABLE_FIELDS))
    if unknown:
        raise ValidationError(dict.fromkeys(unknown, "Not a field of a plan."))
    changes = {}
    for name, value in fields.items():
        if value is not None and name == "device_hours_per_month":
            value = Decimal(str(value))
        if name == "max_priority":
            value = Priority(value).value if value in Priority.values else value
        old = getattr(plan, name)
        if old != value:
            changes[name] = {"from": old, "to": value}
            setattr(plan, name, value)
    plan.full_clean()
    return changes


@transaction.atomic
def plan_create(*, actor: User | None, name: str, **fields: Any) -> Plan:
    """A new plan (assigned to nobody yet). Called by ``POST plans/`` and ``manage.py plan create``."""
    _check_staff(actor, "create plans")
    if Plan.objects.filter(name=name).exists():
        raise ValidationError({"name": f"A plan named {name!r} already exists."})
    plan = Plan(name=name)
    _plan_fields(plan, fields)
    plan.save()
    audit_record(organization=None, actor=actor, action="plan.created", target=plan.name,
                 data={"plan_id": plan.pk, **{k: getattr(plan, k) for k in Plan.EDITABLE_FIELDS}})
    return plan


@transaction.atomic
def plan_update(*, plan: Plan, actor: User | None, **fields: Any) -> Plan:
    """Change a plan's limits, weight or allowed priority; every organization on it gets an audit
    row naming the staff member, and the change reaches them after commit (``plan_changed``).
    Called by ``PATCH plans/{id}/`` and ``manage.py plan set``."""
    _check_staff(actor, "change plans")
    plan = Plan.objects.select_for_update().get(pk=plan.pk)
    changes = _plan_fields(plan, fields)
    if not changes:
        return plan
    plan.save()
    audit_record(organization=None, actor=actor, action="plan.changed", target=plan.name, data=changes)
    organizations = list(plan.organizations.all())
    for organization in organizations:
        audit_record(organization=organization, actor=actor, action="plan.changed", target=plan.name, data=changes)
    ids = [organization.pk for organization in organizations]
    transaction.on_commit(lambda: signals.plan_changed.send(sender=Plan, organization_ids=ids))
    return plan


@transaction.atomic
def plan_assign(*, organization: Organization, plan: Plan, actor: User | None) -> Organization:
    """Put the organization on ``plan``; audited with the staff member, effective after commit.
    Called by ``PUT organizations/{id}/plan/``, the admin and ``manage.py plan assign``."""
    _check_staff(actor, "assign plans")
    given, organization = organization, _lock(organization)
    old = organization.plan
    if old.pk == plan.pk:
        return organization
    organization.plan = given.plan = plan  # the caller's instance shows it too
    organization.save(update_fields=["plan"])
    audit_record(organization=organization, actor=actor, action="plan.assigned", target=plan.name,
                 data={"from": old.name, "to": plan.name})
    ids = [organization.pk]
    transaction.on_commit(lambda: signals.plan_changed.send(sender=Plan, organization_ids=ids))
    return organization
