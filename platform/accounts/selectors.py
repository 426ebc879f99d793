"""Reads of the accounts app. Each starts from the organization (the tenant) and filters on it
first; the only exceptions are a user's own organizations and memberships, which start from the
user. Called by the REST views, the tenancy layer (``accounts.api``) and the management commands.
"""

from django.db.models import OuterRef, QuerySet, Subquery

from accounts.models import ApiToken, AuditLog, Membership, Organization, Quota, User


def organizations_of(*, user: User) -> QuerySet[Organization]:
    """The organizations ``user`` belongs to, by id, each annotated with ``role`` (the user's)."""
    role = Membership.objects.filter(organization=OuterRef("pk"), user=user).values("role")[:1]
    return Organization.objects.filter(memberships__user=user).annotate(role=Subquery(role)).order_by("id")


def token_by_digest(*, digest: str) -> ApiToken | None:
    """The token with this digest, with its user, its organization and, as ``token.membership``,
    its user's membership there (None if they are no longer a member), all in one query; None if
    no token has it. The one read that cannot start from the tenant: it is how a request finds its
    tenant (``accounts.authentication``). Every API request by token makes it, so the membership
    comes along instead of costing a query of its own (``accounts.api.token_membership``)."""
    member = Membership.objects.filter(user=OuterRef("user_id"), organization=OuterRef("organization_id"))
    token = (
        ApiToken.objects.select_related("user", "organization")
        .filter(digest=digest)
        .annotate(
            membership_pk=Subquery(member.values("pk")[:1]),
            membership_role=Subquery(member.values("role")[:1]),
            membership_created_at=Subquery(member.values("created_at")[:1]),
        )
        .first()
    )
    if token is not None:
        token.membership = None if token.membership_pk is None else Membership(
            pk=token.membership_pk, user=token.user, organization=token.organization,
            role=token.membership_role, created_at=token.membership_created_at,
        )
    return token


def membership_of(*, user: User, organization: Organization | int) -> Membership | None:
    """``user``'s membership of ``organization`` (an instance or an id), with the organization
    loaded, or None."""
    organization_id = organization if isinstance(organization, int) else organization.pk
    return (
        Membership.objects.select_related("organization")
        .filter(organization_id=organization_id, user=user)
        .first()
    )


def first_membership_of(*, user: User) -> Membership | None:
    """The membership a browser session starts in: the user's organization with the lowest id."""
    return Membership.objects.select_related("organization").filter(user=user).order_by("organization_id").first()


def members_of(*, organization: Organization) -> QuerySet[Membership]:
    """The organization's memberships with their users, oldest first."""
    return Membership.objects.filter(organization=organization).select_related("user").order_by("id")


def tokens_for(*, user: User, organization: Organization) -> QuerySet[ApiToken]:
    """``user``'s tokens in ``organization``, newest first (revoked ones included)."""
    return ApiToken.objects.filter(organization=organization, user=user).select_related("user").order_by(
        "-created_at", "-id"
    )


def tokens_of(*, organization: Organization) -> QuerySet[ApiToken]:
    """Every token of the organization, newest first: what its admins and owners may revoke."""
    return ApiToken.objects.filter(organization=organization).select_related("user").order_by("-created_at", "-id")


def quota_of(*, organization: Organization) -> Quota:
    """The organization's quota; an unsaved, unlimited one if none was stored."""
    return Quota.objects.filter(organization=organization).first() or Quota(organization=organization)


def quota_usage(*, organization: Organization) -> dict[str, object]:
    """What the organization uses against its quota: device-hours billed this calendar month (the
    usage ledger), its active jobs (queued, profiling, running or paused), and how far the month's
    use went past its device-hour budget (``over_budget_device_hours``: 0 within it, None without
    one). The engine starts no call past the budget, so the overrun is the calls running as it ran
    out: at most one call a job, plus the usage of the last event pull."""
    from django.utils import timezone

    from billing.selectors import device_hours_in_month  # the apps above accounts, imported late
    from jobs.selectors import active_jobs_count

    used = round(device_hours_in_month(organization=organization, when=timezone.now()), 6)
    budget = quota_of(organization=organization).device_hours_per_month
    return {"device_hours_this_month": used,
            "over_budget_device_hours": None if budget is None else max(0.0, round(used - float(budget), 6)),
            "concurrent_jobs": active_jobs_count(organization=organization)}


def audit_of(*, organization: Organization) -> QuerySet[AuditLog]:
    """The organization's audit log, newest first."""
    return AuditLog.objects.filter(organization=organization).select_related("actor").order_by("-created_at", "-id")
