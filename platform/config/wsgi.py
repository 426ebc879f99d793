"""WSGI entry point (gunicorn and friends): ``config.wsgi:application``.

A server imports this as ``config.*``, so ``platform/`` is usually on the path already (often as
a relative entry such as the working directory); the helper then only pins its absolute path, so
later imports do not depend on the working directory.
"""

import os
import sys
from pathlib import Path

from django.core.wsgi import get_wsgi_application

try:
    import platform_path
except ModuleNotFoundError:  # a checkout that was never pip-installed: platform_path.py is at its root
    sys.path.append(str(Path(__file__).resolve().parents[2]))
    import platform_path

platform_path.add_platform_to_path()
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

application = get_wsgi_application()
