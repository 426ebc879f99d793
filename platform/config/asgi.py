"""ASGI entry point (daphne / uvicorn): ``config.asgi:application``: HTTP through Django, one
worker-thread hop a request (``config.http``), websockets through Channels (``config.routing``).

A server imports this as ``config.*``, so ``platform/`` is usually on the path already (often as
a relative entry such as the working directory); the helper then only pins its absolute path, so
later imports do not depend on the working directory.
"""

import os
import sys
from pathlib import Path

import django

try:
    import platform_path
except ModuleNotFoundError:  # a checkout that was never pip-installed: platform_path.py is at its root
    sys.path.append(str(Path(__file__).resolve().parents[2]))
    import platform_path

platform_path.add_platform_to_path()
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

django.setup(set_prefix=False)  # before anything imports models (the handler sets the prefix per request)

from channels.routing import ProtocolTypeRouter  # noqa: E402  (after Django is set up)

from config.http import OneHopASGIHandler  # noqa: E402
from config.routing import websocket_application  # noqa: E402

django_http = OneHopASGIHandler()

application = ProtocolTypeRouter({"http": django_http, "websocket": websocket_application})
