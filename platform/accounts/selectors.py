"""Reads of the accounts app. Each starts from the organization (the tenant) and filters on it
first; the only exceptions are a user's own organizations and memberships, which start from the
user. Called by the REST views, the tenancy layer (``accounts.api``) and the management commands.
"""

from django.db import connections
from django.db.models import Count, OuterRef, QuerySet, Subquery

from accounts.models import ApiToken, AuditLog, Membership, Organization, Plan, User
from accounts.sql import ModelColumns, fetch_one


def organizations_of(*, user: User) -> QuerySet[Organization]:
    """The organizations ``user`` belongs to, by id, each annotated with ``role`` (the user's)."""
    role = Membership.objects.filter(organization=OuterRef("pk"), user=user).values("role")[:1]
    return Organization.objects.filter(memberships__user=user).annotate(role=Subquery(role)).order_by("id")


# The token read's four models, under the aliases of its SQL (``token_by_digest``).
_TOKEN, _USER, _ORGANIZATION, _MEMBERSHIP = (
    ModelColumns(ApiToken, "t"), ModelColumns(User, "u"), ModelColumns(Organization, "o"),
    ModelColumns(Membership, "m"),
)
_token_sql: dict[str, str] = {}  # {database vendor: the token read's SQL}


def _token_read(connection) -> str:
    sql = _token_sql.get(connection.vendor)
    if sql is None:
        q = connection.ops.quote_name
        token, user, org, member = (q(c.model._meta.db_table) for c in (_TOKEN, _USER, _ORGANIZATION, _MEMBERSHIP))
        sql = _token_sql[connection.vendor] = (
            # table and column names from the models, quoted; the digest is a parameter
            f"SELECT {_TOKEN.sql(connection)}, {_USER.sql(connection)}, {_ORGANIZATION.sql(connection)}, "  # noqa: S608
            f"{_MEMBERSHIP.sql(connection)} "
            f"FROM {token} t JOIN {user} u ON u.id = t.user_id JOIN {org} o ON o.id = t.organization_id "
            f"LEFT JOIN {member} m ON m.user_id = t.user_id AND m.organization_id = t.organization_id "
            "WHERE t.digest = %s"
        )
    return sql


def token_by_digest(*, digest: str) -> ApiToken | None:
    """The token with this digest, with its user, its organization and, as ``token.membership``,
    its user's membership there (None if they are no longer a member), all in one query; None if
    no token has it. The one read that cannot start from the tenant: it is how a request finds its
    tenant (``accounts.authentication``). Every API request by token makes it, so it is fixed SQL
    (``accounts.sql``: compiling it as a queryset cost more than the rest of a simple request's
    queries) and the membership comes along instead of costing a query of its own
    (``accounts.api.token_membership``)."""
    connection = connections["default"]
    row = fetch_one(_token_read(connection), [digest])
    if row is None:
        return None
    parts, start = [], 0
    for columns in (_TOKEN, _USER, _ORGANIZATION, _MEMBERSHIP):
        parts.append(row[start:start + columns.width])
        start += columns.width
    token = _TOKEN.instance(parts[0], connection)
    token.user = _USER.instance(parts[1], connection)
    token.organization = _ORGANIZATION.instance(parts[2], connection)
    token.membership = None
    if parts[3][0] is not None:  # the LEFT JOIN found the membership
        token.membership = _MEMBERSHIP.instance(parts[3], connection)
        token.membership.user, token.membership.organization = token.user, token.organization
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


def quota_of(*, organization: Organization) -> Plan:
    """The organization's quota: its plan's limits (null: unlimited), weight and highest priority
    (read once per organization instance: the foreign key caches it)."""
    return organization.plan


def plans() -> QuerySet[Plan]:
    """Every plan, with how many organizations are on it (platform staff only)."""
    return Plan.objects.annotate(organization_count=Count("organizations")).order_by("name")


def quota_usage(*, organization: Organization) -> dict[str, object]:
    """What the organization uses against its quota: device-hours billed this calendar month (the
    usage ledger), its jobs holding a slot (``concurrent_jobs``: sent to the engine and not ended)
    and those waiting for one (``queued_jobs``), and how far the month's
    use went past its device-hour budget (``over_budget_device_hours``: 0 within it, None without
    one). The engine starts no call past the budget, so the overrun is the calls running as it ran
    out: at most one call a job, plus the usage of the last event pull."""
    from django.utils import timezone

    from billing.selectors import device_hours_in_month  # the apps above accounts, imported late
    from jobs.selectors import slot_counts

    used = round(device_hours_in_month(organization=organization, when=timezone.now()), 6)
    budget = quota_of(organization=organization).device_hours_per_month
    holding, waiting = slot_counts(organization=organization)
    return {"device_hours_this_month": used,
            "over_budget_device_hours": None if budget is None else max(0.0, round(used - float(budget), 6)),
            "concurrent_jobs": holding, "queued_jobs": waiting}


def audit_of(*, organization: Organization) -> QuerySet[AuditLog]:
    """The organization's audit log, newest first."""
    return AuditLog.objects.filter(organization=organization).select_related("actor").order_by("-created_at", "-id")
