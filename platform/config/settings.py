"""Django settings, read from the environment.

Defaults give the embedded setup (SQLite under the data directory, no servers); the environment
switches parts to production services. Variables:

- ``PLEXRL_ENV``: ``development`` (default) or ``production``.
- ``PLEXRL_HOME``: the data directory (default ``<repo>/.plexrl``, shared with the engine).
- ``DJANGO_SECRET_KEY``: mandatory in production; development uses a fixed, public key.
- ``DJANGO_DEBUG``: ``true``/``false`` (default: true in development, false in production).
- ``DJANGO_ALLOWED_HOSTS``: comma-separated (default: localhost names in development).
- ``DATABASE_URL``: e.g. ``postgres://user@host:5432/db``; unset means SQLite.
- ``DATABASE_POOL_SIZE``: most PostgreSQL connections each process keeps open (default 10).
- ``REDIS_URL``, ``RAY_ADDRESS``: read here for the channel layer, Celery and the engine client.
- ``EMAIL_BACKEND``: Django's e-mail backend (default: the console, which prints password-reset
  mails); ``DEFAULT_FROM_EMAIL``: their sender (default ``plexrl@localhost``).
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
# The plan new organizations start on (accounts.models.Plan; platform staff manage plans with
# `manage.py plan` or the admin). The migrations create "starter"; it must limit every quota.
PLEXRL_DEFAULT_PLAN = os.environ.get("PLEXRL_DEFAULT_PLAN", "starter")

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


def _env_seconds(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    try:
        seconds = float(value) if value else default
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ImproperlyConfigured(f"{name}={value!r} is not a positive number of seconds.")
    return seconds


# A session no call has come for this long is closed by the engine, its states dropped and its
# billing stopped (the engine service takes it when it starts: the first platform process's value).
SESSION_IDLE_S = _env_seconds("PLEXRL_SESSION_IDLE_S", 600.0)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files, served locally: /api/docs/ works offline
    "accounts",
    "jobs",
    "billing",
    "notifications",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # frontend/static served by the ASGI process itself (embedded mode has no other web server)
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # last and synchronous only, so the whole stack runs in one thread under ASGI (config.security)
    "config.security.SecurityHeadersMiddleware",
]

# Response headers (config.security): scripts from this origin only, nothing may frame the pages,
# no powerful browser features. Websockets are same-origin ('self' covers ws:/wss: to this host).
CONTENT_SECURITY_POLICY = "; ".join((
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data: blob:",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'self'",
    "form-action 'self'",
    "frame-ancestors 'none'",
))
PERMISSIONS_POLICY = "camera=(), microphone=(), geolocation=(), payment=(), usb=()"
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
# Production is served over TLS (behind a proxy that terminates it): browsers keep to HTTPS.
SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_HSTS_SECONDS", 31536000 if PRODUCTION else 0))

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
                "config.pages.navigation",  # the site header's organizations (lazy)
            ],
        },
    },
]

DATABASE_URL = os.environ.get("DATABASE_URL", "")
if DATABASE_URL:
    # conn_max_age=0: the web tier is ASGI, where Django advises against persistent connections
    # (a request's thread is not the next one's, so a thread's own connection would sit idle).
    # conn_health_checks: a pooled connection is checked as it is taken, so one broken by a
    # PostgreSQL restart is replaced instead of failing the request that got it.
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0, conn_health_checks=True)}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        # Instead, a per-process pool (psycopg_pool): closing a connection returns it. Opening one
        # costs several ms of the server's CPU a request, and under load one connection per request
        # in flight ran PostgreSQL out of connections (500s); a request beyond the pool waits for one.
        # Parameters bound by the server and statements prepared once a connection has run them
        # twice: PostgreSQL then plans the API's few hot reads once per pooled connection, not on
        # every request (PostgreSQL's CPU a REST answer: 1.8 -> 1.1 ms; README "REST under load").
        # Django's default (client-side binding, nothing prepared) is for transaction-mode
        # connection poolers such as PgBouncer, which this deployment does not put in between.
        DATABASES["default"].setdefault("OPTIONS", {}).update(server_side_binding=True, prepare_threshold=2)
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": 2,
            "max_size": int(os.environ.get("DATABASE_POOL_SIZE", "10")),
            "timeout": 30,
        }
else:
    # SQLite does not create missing folders; a fresh machine has no data directory yet.
    PLEXRL_HOME.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": PLEXRL_HOME / "db.sqlite3",
            # Kept open by the thread that opened it (SQLite has no pool; the web server's threads,
            # the Celery worker's and the beat's are few and long-lived: at most one connection
            # each). Opening one per request and closing it (a WAL checkpoint when it was the last)
            # cost 0.9 ms of every API request's 3.5 ms (a token list over loopback, p50).
            "CONN_MAX_AGE": 600,
            "CONN_HEALTH_CHECKS": True,
            # The embedded platform writes from several threads (web, Celery worker, beat): WAL lets
            # readers run beside the writer, IMMEDIATE transactions take the write lock up front
            # (no lock upgrade that fails mid-transaction), and a writer waits up to 30 s for it.
            "OPTIONS": {
                "timeout": 30,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
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
# WhiteNoise serves straight from the finders (frontend/static, the apps' static folders): the
# embedded platform runs without `collectstatic`; a production deployment may still collect.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# Websocket fan-out (jobs/consumers.py): Redis across processes (web, Celery worker) when REDIS_URL
# is set; in memory for the embedded platform, whose web server and Celery worker share a process.
if REDIS_URL:
    # socket_timeout above channels-redis's 5 s blocking receive: redis-py 8 defaults to 5 s, so an
    # idle socket's receive timed out and daphne closed it with 1011 (channels_redis issue 422);
    # the connect timeout bounds how long a push after commit waits for a Redis that is down.
    _REDIS_HOST = {"address": REDIS_URL, "socket_timeout": 15, "socket_connect_timeout": 5}
    CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [_REDIS_HOST]}},
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "config.layers.LoopSafeInMemoryChannelLayer"}}

# Every API view derives from accounts.api's OrgAPIView family (the tenant, resolved once).
REST_FRAMEWORK = {
    # Bearer first: DRF then answers 401 (with WWW-Authenticate) to missing or bad credentials.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # Closed by default: an endpoint that forgets its permissions must not become public.
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "accounts.pagination.StandardPagination",
    "PAGE_SIZE": 50,
    # Services raise Django's ValidationError; the API answers it as a 400 like a serializer's.
    "EXCEPTION_HANDLER": "accounts.api.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # Password guessing at POST /api/v1/auth/token/ and the sign-in page, per client address (counted
    # in the cache).
    "DEFAULT_THROTTLE_RATES": {"auth-token": "20/minute", "login": "20/minute"},
}

SPECTACULAR_SETTINGS = {
    "TITLE": "PlexRL API",
    "DESCRIPTION": "Multiplexed RLVR training as a shared cluster service. Every request acts within one "
    "organization: the token's, or a browser session's current one.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "COMPONENT_SPLIT_REQUEST": True,  # separate request and response shapes (write-only password, ...)
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # one schema name for a choice set used under several field names (a job's priority, a plan's max)
    "ENUM_NAME_OVERRIDES": {"PriorityEnum": "accounts.models.Priority",
                            "JobStateEnum": "jobs.models.JobState",
                            "DeliveryStateEnum": "notifications.models.DeliveryState"},
}

# django.contrib.auth's login, logout and password change/reset pages live under /accounts/.
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "pages:jobs"
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "plexrl@localhost")

SESSION_ENGINE = "config.sessions"  # database sessions; a key of characters Django never issues is none
SESSION_COOKIE_SECURE = PRODUCTION
CSRF_COOKIE_SECURE = PRODUCTION

# Celery: Redis when REDIS_URL is set; else an in-memory broker for the embedded, one-process setup.
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_TASK_IGNORE_RESULT = True  # tasks write their outcome to the database; nobody waits on results
CELERY_TASK_ACKS_LATE = True  # a worker lost mid-task gets it redelivered: every task is idempotent
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# How often billing.tasks.record_capacity samples the cluster's capacity (seconds). The latest sample
# counts for at most two periods: no newer one means the engine (or the beat) was down.
BILLING_CAPACITY_PERIOD_S = 60.0
# The beat's record of when each periodic task last ran: in the data directory, not the working one.
CELERY_BEAT_SCHEDULE_FILENAME = str(PLEXRL_HOME / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE = {
    # each active job's event log, read by cursor into metrics, events and the usage ledger
    "pull-job-events": {"task": "jobs.tasks.pull_all_events", "schedule": 2.0},
    # organizations over their monthly device-hour budget: pause their jobs (and resume them later)
    "enforce-quotas": {"task": "billing.tasks.enforce_quotas", "schedule": 30.0},
    # the cluster's device capacity, for the idle row of the cluster billing report
    "record-capacity": {"task": "billing.tasks.record_capacity", "schedule": BILLING_CAPACITY_PERIOD_S},
    # webhook deliveries whose back-off is over, sent again
    "deliver-webhooks": {"task": "notifications.tasks.deliver_due", "schedule": 15.0},
}
# Keep the worker's real stdout/stderr: Ray (the engine client in the worker) needs their file
# descriptors, which Celery's logging proxies do not have.
CELERY_WORKER_REDIRECT_STDOUTS = False
