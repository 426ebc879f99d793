"""PlexRL engine: model execution as a shared, time-sliced service.

Never imports Django or anything under ``platform/``; the platform reaches the engine only through
``engine.client`` (function API) and, later, the service client.
"""
