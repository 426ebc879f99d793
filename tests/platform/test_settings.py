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
