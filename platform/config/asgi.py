"""ASGI entry point (daphne / uvicorn): ``config.asgi:application``.

A server imports this as ``config.*``, so ``platform/`` is usually on the path already (often as
a relative entry such as the working directory); the helper then only pins its absolute path, so
later imports do not depend on the working directory.
"""

import os
import sys
from pathlib import Path

from django.core.asgi import get_asgi_application

try:
    import plexrl
except ModuleNotFoundError:  # a checkout that was never pip-installed: plexrl.py is at its root
    sys.path.append(str(Path(__file__).resolve().parents[2]))
    import plexrl

plexrl.add_platform_to_path()
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

application = get_asgi_application()
