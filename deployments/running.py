"""The requests a target replica is running, by the client's request id, so Abort can reach them.

A client's request_id is a label, not a key: the replica runs every request under an engine id of its
own (the label plus a random suffix), so two requests that share a label (a retry racing its original,
or the same id sent through two ingress replicas) never collide in the engine, and each streams apart.
Abort(label) stops all of them. Every ingress replica fans Abort out to every target replica
(Frontend.abort), so it needs no memory of which ingress admitted the request.

The suffix is the request's route key when the SLA router placed it (router/policy.py Newcomer.key):
the routing stats list the keys of what the engine runs, so a router can tell exactly which of the
requests it sent a snapshot already counts.
"""

from __future__ import annotations

import asyncio
import uuid

# Put into a request's event queue by `abort`: its stream ends with finish_reason "abort".
ABORTED = object()


def engine_request_id(label: str, key: str | None = None) -> str:
    """A fresh engine id for a request labelled `label`; readable in logs, unique per request."""
    return f"{label}.{key or uuid.uuid4().hex[:12]}"


def route_key(engine_id: str) -> str:
    """The unique suffix of an engine id (the route key of a routed request)."""
    return engine_id.rsplit(".", 1)[-1]


class RunningRequests:
    """label -> the event queues of the requests running under it (asyncio, one event loop)."""

    def __init__(self) -> None:
        self._by_label: dict[str, set[asyncio.Queue]] = {}

    def add(self, label: str, events: asyncio.Queue) -> None:
        """Make the request whose events arrive on `events` abortable by `label` (until `discard`)."""
        self._by_label.setdefault(label, set()).add(events)

    def discard(self, label: str, events: asyncio.Queue) -> None:
        queues = self._by_label.get(label)
        if queues is not None:  # None once aborted: the label may since run a newer request
            queues.discard(events)
            if not queues:
                del self._by_label[label]

    def __len__(self) -> int:
        """How many requests are running (an engine rebuild waits for none)."""
        return sum(len(queues) for queues in self._by_label.values())

    def abort_all(self) -> int:
        """Signal every running request to end; how many there were."""
        return sum(self.abort(label) for label in list(self._by_label))

    def abort(self, label: str) -> int:
        """Signal every request running under `label` to end; how many there were (0: none, or aborted)."""
        queues = self._by_label.pop(label, set())
        for events in queues:
            events.put_nowait(ABORTED)
        return len(queues)
