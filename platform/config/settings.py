"""Django settings, read from the environment.

Defaults give the embedded setup (SQLite under the data directory, no servers); the environment
switches parts to production services. Variables:

- ``PLEXRL_ENV``: ``development`` (default) or ``production``.
- ``PLEXRL_HOME``: the data directory (default ``<repo>/.plexrl``, shared with the engine).
- ``DJANGO_SECRET_KEY``: mandatory in production; development uses a fixed, public key.
- ``DJANGO_DEBUG``: ``true``/``false`` (default: true in development, false in production).
- ``DJANGO_ALLOWED_HOSTS``: comma-separated (default: localhost names in development).
- ``DATABASE_URL``: e.g. ``postgres://user@host:5432/db``; unset means SQLite.
- ``REDIS_URL``, ``RAY_ADDRESS``: read here for the channel layer, Celery and the engine client.
"""

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from engine.paths import plexrl_home  # one definition of the data directory, shared with the engine

BASE_DIR = Path(__file__).resolve().parents[2]  # the repo root (platform/config/settings.py)

PLEXRL_ENV = os.environ.get("PLEXRL_ENV", "development")
if PLEXRL_ENV not in {"development", "production"}:
    raise ImproperlyConfigured(
        f"PLEXRL_ENV={PLEXRL_ENV!r} is not one of 'development', 'production'."
    )
PRODUCTION = PLEXRL_ENV == "production"


def _mandatory_in_production(name: str, development_default: str) -> str:
    """The variable's value; in production a missing or empty one stops start-up (Zulip-style)."""
    value = os.environ.get(name, "")
    if value:
        return value
    if PRODUCTION:
        raise ImproperlyConfigured(
            f"{name} must be set when PLEXRL_ENV=production (see platform/config/settings.py)."
        )
    return development_default


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use true or false).")


PLEXRL_HOME = plexrl_home()

SECRET_KEY = _mandatory_in_production(
    "DJANGO_SECRET_KEY",
    "django-insecure-plexrl-development-only-never-use-in-production",
)
DEBUG = _env_bool("DJANGO_DEBUG", default=not PRODUCTION)
_hosts = _mandatory_in_production("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
ALLOWED_HOSTS = [host.strip() for host in _hosts.split(",") if host.strip()]

# Reserved: the Channels layer and Celery use Redis when set, in-memory / in-process otherwise;
# the engine client joins a Ray cluster at RAY_ADDRESS, else starts a local one.
REDIS_URL = os.environ.get("REDIS_URL") or None
RAY_ADDRESS = os.environ.get("RAY_ADDRESS") or None

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "accounts",
    "jobs",
    "billing",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "frontend" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = os.environ.get("DATABASE_URL", "")
if DATABASE_URL:
    # conn_max_age=0: the web tier is ASGI, where Django advises against persistent connections.
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
else:
    # SQLite does not create missing folders; a fresh machine has no data directory yet.
    PLEXRL_HOME.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": PLEXRL_HOME / "db.sqlite3",
        }
    }

# Set before the first migration: swapping the user model later means rewriting migrations.
AUTH_USER_MODEL = "accounts.User"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "frontend" / "static"]
STATIC_ROOT = PLEXRL_HOME / "static"

REST_FRAMEWORK = {
    # Closed by default: an endpoint that forgets its permissions must not become public.
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
}

SESSION_COOKIE_SECURE = PRODUCTION
CSRF_COOKIE_SECURE = PRODUCTION
