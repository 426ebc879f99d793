"""Settings come from the environment: SQLite by default, loud when production lacks a secret."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test starts Django in a subprocess (~1 s)

PRODUCTION = {
    "PLEXRL_ENV": "production",
    "DJANGO_SECRET_KEY": "a-test-secret-that-is-long-enough-for-the-check-0123456789abcdef",
    "DJANGO_ALLOWED_HOSTS": "plexrl.example.com",
}


def test_default_settings_pass_check_and_use_sqlite_in_plexrl_home(manage, tmp_path):
    result = manage("check")
    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout

    result = manage(
        "shell", "-c", "from django.db import connection; print(connection.settings_dict['NAME'])"
    )
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip().splitlines()[-1]) == tmp_path / "plexrl-home" / "db.sqlite3"


def test_migrations_are_complete_and_apply_on_sqlite(manage, tmp_path):
    result = manage("makemigrations", "--check", "--dry-run")
    assert result.returncode == 0, "a model change has no migration:\n" + result.stdout
    result = manage("migrate", "--noinput")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "plexrl-home" / "db.sqlite3").is_file()


def test_production_with_its_variables_passes_check(manage):
    result = manage("check", env=PRODUCTION)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("missing", ["DJANGO_SECRET_KEY", "DJANGO_ALLOWED_HOSTS"])
def test_production_without_a_mandatory_variable_fails_loudly(manage, missing):
    env = {k: v for k, v in PRODUCTION.items() if k != missing}
    result = manage("check", env=env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert f"{missing} must be set when PLEXRL_ENV=production" in result.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PLEXRL_ENV": "prod"}, "PLEXRL_ENV='prod' is not one of"),
        ({"DJANGO_DEBUG": "maybe"}, "DJANGO_DEBUG='maybe' is not a boolean"),
    ],
)
def test_invalid_values_fail_loudly(manage, env, message):
    result = manage("check", env=env)
    assert result.returncode != 0
    assert message in result.stderr


# Run by manage.py shell: the PostgreSQL server processes that served six connections in a row,
# each closed as Django closes its connection after a request, and the pool's bound.
_REOPEN = """
from django.db import connection
backends = set()
for _ in range(6):
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backends.add(cursor.fetchone()[0])
    connection.close()
print(len(backends), connection.pool.max_size)
"""


def test_postgresql_connections_come_from_a_bounded_pool(manage):
    """Closing a connection (Django does after every ASGI request) returns it to the process's
    pool instead of ending it: requests do not pay to connect, and the connections in use stay
    under ``DATABASE_POOL_SIZE`` however many requests are in flight (one each ran PostgreSQL out
    of connections at 200 requests/s)."""
    env = {"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres", "DATABASE_POOL_SIZE": "3"}
    result = manage("shell", "-c", _REOPEN, env=env)
    assert result.returncode == 0, result.stderr
    backends, bound = map(int, result.stdout.strip().splitlines()[-1].split())
    assert bound == 3
    assert backends <= 3  # without the pool, six connections: six server processes


# Run by manage.py shell: three requests' worth of signals around a read, on one thread, as the
# web server's threads serve requests one after another; the connections they read on.
_SQLITE_REQUESTS = """
from django.core.signals import request_finished, request_started
from django.db import connection
used = []
for _ in range(3):
    request_started.send(sender=None)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    used.append(connection.connection)  # held, so that no later connection can reuse its address
    request_finished.send(sender=None)
print(len({id(c) for c in used}), connection.settings_dict["CONN_HEALTH_CHECKS"])
"""


def test_the_embedded_sqlite_connection_outlives_a_request(manage):
    """SQLite has no pool: a thread keeps its connection from one request to the next instead of
    opening one per request (0.9 ms of a 3.5 ms API request), and checks it as it is taken."""
    result = manage("shell", "-c", _SQLITE_REQUESTS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-2:] == ["1", "True"]  # opened once, not three times


# Run by manage.py shell: a pool used by the parent, then the hook a prefork child runs first; the
# child's next connection must come from a pool of its own.
_FORKED = """
from django.db import connection
from config.celery import _own_connection_pools
with connection.cursor() as cursor:
    cursor.execute("SELECT 1")
connection.close()
inherited = connection.pool
_own_connection_pools()
with connection.cursor() as cursor:
    cursor.execute("SELECT 1")
print(inherited.closed, connection.pool is not inherited, connection.settings_dict["CONN_HEALTH_CHECKS"])
"""


def test_a_celery_child_process_opens_a_pool_of_its_own_and_pooled_connections_are_checked(manage):
    env = {"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres"}
    result = manage("shell", "-c", _FORKED, env=env)
    assert result.returncode == 0, result.stderr
    # checked as taken: one a PostgreSQL restart broke is replaced, not handed to a request
    assert result.stdout.split()[-3:] == ["True", "True", "True"]


# Run by manage.py shell: one parameterised read three times on a pooled connection, then the
# statements PostgreSQL holds prepared for that connection.
_PREPARED = """
from django.db import connection
for n in range(3):
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_class WHERE relpages > %s", [n])
with connection.cursor() as cursor:
    cursor.execute("SELECT statement FROM pg_prepared_statements")
    print(sum("relpages" in row[0] for row in cursor.fetchall()))
"""


def test_postgresql_plans_a_repeated_read_once_per_connection(manage):
    """Parameters are bound by the server and a statement run twice on a connection is prepared:
    PostgreSQL stops parsing and planning the reads every request makes."""
    env = {"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres"}
    result = manage("shell", "-c", _PREPARED, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "1"
