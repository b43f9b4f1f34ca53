"""Whether a deployment's class runs as a Serve replica, which owns its process, or is called directly."""

from __future__ import annotations

from ray import serve


def replica_context():
    """Serve's context for this replica, or None outside Serve (tests and benches calling the class)."""
    try:
        return serve.get_replica_context()
    except Exception:
        return None
