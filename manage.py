#!/usr/bin/env python
"""Django's command-line utility for the PlexRL platform (run from anywhere)."""

import os
import sys


def main() -> None:
    # Run as a script, sys.path[0] is this file's folder (the repo root), so platform_path imports even
    # without an install.
    import platform_path

    platform_path.add_platform_to_path()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
