"""Plumbing every part of the engine uses: node-local socket framing, the GC pause, progress output,
where the control plane's actors go."""
