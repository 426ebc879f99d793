"""Project configuration: settings from the environment, URLs, ASGI and WSGI entry points."""
