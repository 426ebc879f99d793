"""``manage.py create_organization`` and ``manage.py create_token``."""
