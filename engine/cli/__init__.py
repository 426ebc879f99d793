"""The ``plexrl`` command's engine and platform subcommands (``plexrl.py`` composes them)."""
