"""PlexRL's Python client: the platform's REST API from a user's machine, standard library only.

    from plexrl_client import ServiceClient

    client = ServiceClient("http://127.0.0.1:8000", token)
    job = client.submit({"task": "arith", "steps": 50}, name="first")
    for update in client.watch(job["id"]):
        print(update.kind, update.data)

Errors are ``PlexRLError``s: ``ApiError`` (and a subclass per status: ``BadRequest``,
``Unauthorized``, ``Forbidden``, ``NotFound``, ``Conflict``, ``PayloadTooLarge``, ``RateLimited``,
``ServerError``) carrying the HTTP status and the server's field messages, and ``Unreachable``.

Your own training loop runs against a session (``client.create_session(model=...)``): the
function API (generate, forward, forward_backward, optim_step, sync_weights, checkpoints, export,
log_metrics), each method with an ``_async`` twin (``plexrl_client.session``).
"""

from plexrl_client.client import TERMINAL_STATES, ServiceClient, Update
from plexrl_client.errors import (
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    PlexRLError,
    RateLimited,
    ServerError,
    Unauthorized,
    Unreachable,
)
from plexrl_client.session import Completion, Generation, LossResult, Session

__version__ = "0.1.0"
__all__ = [
    "TERMINAL_STATES",
    "ApiError",
    "BadRequest",
    "Completion",
    "Conflict",
    "Forbidden",
    "Generation",
    "LossResult",
    "NotFound",
    "PayloadTooLarge",
    "PlexRLError",
    "RateLimited",
    "ServerError",
    "ServiceClient",
    "Session",
    "Unauthorized",
    "Unreachable",
    "Update",
]
