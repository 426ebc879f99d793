"""Who may do what, as one table (issue 30): every REST operation of the OpenAPI schema and every
websocket route of ``config.routing``, by role, with the answer it gets. ``test_role_table`` checks
that the table names exactly the operations there are, and that each role gets its answer.

The roles (the columns, in this order):

- ``owner``, ``admin``, ``member``, ``viewer``: members of acme with that role, each with a bearer
  token of acme;
- ``outsider``: the owner of globex with a globex token, addressing acme's objects (which must look
  absent: 404) and listing globex's own data;
- ``no_org``: a user of no organization, logged in by a browser session;
- ``staff``: platform staff (``is_staff``) of no organization, logged in by a browser session;
- ``anonymous``: no credentials; ``expired``, ``revoked``: an expired or revoked token of acme's owner.

An answer is the HTTP status of a valid request, or for a websocket ``open`` (accepted, and the
connection stays open) or the code it is closed with. The objects in the paths are acme's: a job, a
dataset and a token of another acme member (members act on their own, admins and owners on
anyone's), a member to show, change or remove, acme's own id, acme's plan.

A new operation needs one line here; an answer that is right but not yet what the code does goes in
``KNOWN_WRONG`` too (the case is then an expected failure until the code is fixed).
"""

from __future__ import annotations

ROLES = ("owner", "admin", "member", "viewer", "outsider", "no_org", "staff", "anonymous", "expired", "revoked")
ACME_ROLES = ("owner", "admin", "member", "viewer")  # acme's members, each with an acme token
ACCEPT = "accept"  # a websocket accepted and left open (``open`` in the table)

# One line an operation: the method (WS: a websocket route, * its catch-all) and the path, then one
# answer a role, in the order of ROLES:
#
#                                                                   owner     member    outsider  staff     expired
#                                                                        admin     viewer    no_org    anonymous revoked
_TABLE = """
# logging in: the credentials in the body decide, whoever sends them
POST   /api/v1/auth/token/                                          201  201  201  201  201  201  201  201  201  201
# tokens are personal: anyone in an organization manages theirs; admins revoke anyone's, for the
# others another member's token is not there (404)
GET    /api/v1/tokens/                                              200  200  200  200  200  403  403  401  401  401
POST   /api/v1/tokens/                                              201  201  201  201  201  403  403  401  401  401
POST   /api/v1/tokens/{token_id}/revoke/                            200  200  404  404  404  403  403  401  401  401
POST   /api/v1/ws-ticket/                                           200  200  200  200  200  403  200  401  401  401
# organizations: staff create them; a token cannot switch (403 whatever the id), a session switches
# to its own only
GET    /api/v1/organizations/                                       200  200  200  200  200  200  200  401  401  401
POST   /api/v1/organizations/                                       403  403  403  403  403  403  201  401  401  401
POST   /api/v1/organizations/{organization_id}/switch/              403  403  403  403  403  404  404  401  401  401
GET    /api/v1/organizations/{organization_id}/members/             200  200  200  200  404  404  404  401  401  401
POST   /api/v1/organizations/{organization_id}/members/             201  201  403  403  404  404  404  401  401  401
GET    /api/v1/organizations/{organization_id}/members/{user_id}/   200  200  200  200  404  404  404  401  401  401
PATCH  /api/v1/organizations/{organization_id}/members/{user_id}/   200  200  403  403  404  404  404  401  401  401
DELETE /api/v1/organizations/{organization_id}/members/{user_id}/   204  204  403  403  404  404  404  401  401  401
# the quota: the organization reads it; its limits are its plan's, which only platform staff set or
# assign (403 to every other role, whatever the id: plans are not a tenant's objects)
GET    /api/v1/quota/                                               200  200  200  200  200  403  403  401  401  401
PATCH  /api/v1/quota/                                               403  403  403  403  403  403  403  401  401  401
GET    /api/v1/plans/                                               403  403  403  403  403  403  200  401  401  401
POST   /api/v1/plans/                                               403  403  403  403  403  403  201  401  401  401
GET    /api/v1/plans/{plan_id}/                                     403  403  403  403  403  403  200  401  401  401
PATCH  /api/v1/plans/{plan_id}/                                     403  403  403  403  403  403  200  401  401  401
GET    /api/v1/organizations/{organization_id}/plan/                403  403  403  403  403  403  200  401  401  401
PUT    /api/v1/organizations/{organization_id}/plan/                403  403  403  403  403  403  200  401  401  401
GET    /api/v1/audit/                                               200  200  403  403  200  403  403  401  401  401
# jobs: viewers read, members create and act on their own (this job is another member's)
GET    /api/v1/jobs/                                                200  200  200  200  200  403  403  401  401  401
POST   /api/v1/jobs/                                                201  201  201  403  201  403  403  401  401  401
POST   /api/v1/jobs/estimate/                                       200  200  200  403  200  403  403  401  401  401
GET    /api/v1/jobs/tensorboard.zip                                 200  200  200  200  200  403  403  401  401  401
GET    /api/v1/jobs/{job_id}/                                       200  200  200  200  404  403  403  401  401  401
POST   /api/v1/jobs/{job_id}/cancel/                                200  200  403  403  404  403  403  401  401  401
POST   /api/v1/jobs/{job_id}/pause/                                 200  200  403  403  404  403  403  401  401  401
POST   /api/v1/jobs/{job_id}/resume/                                200  200  403  403  404  403  403  401  401  401
GET    /api/v1/jobs/{job_id}/metrics/                               200  200  200  200  404  403  403  401  401  401
GET    /api/v1/jobs/{job_id}/events/                                200  200  200  200  404  403  403  401  401  401
GET    /api/v1/jobs/{job_id}/artifacts/                             200  200  200  200  404  403  403  401  401  401
GET    /api/v1/jobs/{job_id}/tensorboard.zip                        200  200  200  200  404  403  403  401  401  401
GET    /api/v1/jobs/{job_id}/artifacts/{name}/{filename}            200  200  200  200  404  403  403  401  401  401
GET    /api/v1/jobs/{job_id}/artifacts/{name}.zip                   200  200  200  200  404  403  403  401  401  401
# sessions: members open them and call their own (this one is another member's, and has ended: an
# allowed call is told so, 409, without reaching the engine)
POST   /api/v1/sessions/                                            201  201  201  403  201  403  403  401  401  401
POST   /api/v1/sessions/{session_id}/calls/                         409  409  403  403  404  403  403  401  401  401
GET    /api/v1/sessions/{session_id}/calls/{seq}/                   409  409  403  403  404  403  403  401  401  401
# datasets: like jobs (this dataset is another member's)
GET    /api/v1/datasets/                                            200  200  200  200  200  403  403  401  401  401
POST   /api/v1/datasets/                                            201  201  201  403  201  403  403  401  401  401
GET    /api/v1/datasets/{dataset_id}/                               200  200  200  200  404  403  403  401  401  401
DELETE /api/v1/datasets/{dataset_id}/                               204  204  403  403  404  403  403  401  401  401
# the models and the cluster: everyone in an organization reads (others' jobs anonymised), staff too;
# staff register models
GET    /api/v1/models/                                              200  200  200  200  200  403  200  401  401  401
POST   /api/v1/models/                                              403  403  403  403  403  403  201  401  401  401
# an organization's own models: members upload (outsiders into their own organization) and delete
# their own (this one is another member's), admins and owners any; staff see the published ones
# only, and publish an upload to every organization
POST   /api/v1/models/upload/                                       201  201  201  403  201  403  403  401  401  401
GET    /api/v1/models/{model_id}/                                   200  200  200  200  404  403  404  401  401  401
DELETE /api/v1/models/{model_id}/                                   204  204  403  403  404  403  404  401  401  401
POST   /api/v1/models/{model_id}/publish/                           403  403  403  403  403  403  200  401  401  401
GET    /api/v1/cluster/                                             200  200  200  200  200  403  200  401  401  401
# billing: the organization's own figures; the cluster's report is staff's
GET    /api/v1/billing/usage/                                       200  200  200  200  200  403  403  401  401  401
GET    /api/v1/billing/savings/                                     200  200  200  200  200  403  403  401  401  401
GET    /api/v1/billing/summary/                                     200  200  200  200  200  403  403  401  401  401
GET    /api/v1/billing/cluster/                                     403  403  403  403  403  403  200  401  401  401
# notifications: admins and owners manage the organization's webhooks and read their delivery log;
# everyone chooses their own e-mails
GET    /api/v1/webhooks/                                            200  200  403  403  200  403  403  401  401  401
POST   /api/v1/webhooks/                                            201  201  403  403  201  403  403  401  401  401
DELETE /api/v1/webhooks/{webhook_id}/                               204  204  403  403  404  403  403  401  401  401
GET    /api/v1/webhooks/{webhook_id}/deliveries/                    200  200  403  403  404  403  403  401  401  401
GET    /api/v1/notifications/email/                                 200  200  200  200  200  403  403  401  401  401
PUT    /api/v1/notifications/email/                                 200  200  200  200  200  403  403  401  401  401
# websockets: closed with 4401 (no or ended credentials), 4403 (no organization), 4404 (not yours)
WS     /ws/jobs/{job_id}/                                           open open open open 4404 4404 4404 4401 4401 4401
WS     /ws/cluster/                                                 open open open open open 4403 open 4401 4401 4401
WS     *                                                            4404 4404 4404 4404 4404 4404 4404 4404 4404 4404
"""

# (operation, role) -> why today's answer differs from the table's, which is the right one: those
# cases are expected to fail (strictly: once the code is fixed they pass, and the line here goes).
KNOWN_WRONG: dict[tuple[str, str], str] = {}


def parse(text: str) -> dict[str, dict[str, int | str]]:
    """``{"GET /api/v1/jobs/": {"owner": 200, ...}, "WS /ws/cluster/": {"owner": ACCEPT, ...}}``."""
    table: dict[str, dict[str, int | str]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        method, path, *answers = line.split()
        operation = f"{method} {path}"
        if len(answers) != len(ROLES):
            raise ValueError(f"role table line {number} ({operation}): {len(answers)} answers for {len(ROLES)} roles")
        if operation in table:
            raise ValueError(f"role table line {number}: a second row for {operation}")
        table[operation] = {role: _answer(method, answer, operation) for role, answer in zip(ROLES, answers,
                                                                                              strict=True)}
    return table


def _answer(method: str, answer: str, operation: str) -> int | str:
    if method == "WS":
        if answer == "open":
            return ACCEPT
        if answer.isdigit() and 4000 <= int(answer) <= 4999:
            return int(answer)
    elif answer.isdigit() and 200 <= int(answer) <= 599:
        return int(answer)
    raise ValueError(f"role table, {operation}: {answer!r} is no answer")


TABLE = parse(_TABLE)
