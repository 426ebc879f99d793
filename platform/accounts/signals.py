"""Signals of the accounts app, for the apps above it (which accounts never imports at load time).

``plan_changed(organization_ids=[...])``: sent after commit when the plan of these organizations
changed (assigned, or its limits or weight edited). The jobs app starts the queued jobs a raised
concurrency limit lets through and sends the new weight and budget to the engine.
"""

from django.dispatch import Signal

plan_changed = Signal()
