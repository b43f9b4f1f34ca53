"""Print traces as span trees: an OTLP/gRPC receiver on the console.

    python -m dspark.telemetry.dump --port 4317 [--seconds 30]
    OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317 make serve      # in another shell

Every trace that arrives is printed once it has been quiet for `--settle` seconds: each span with its
kind, duration, the process it came from and its attributes; span events (sampled engine steps)
under it. A span whose parent was never received (the client's own span) is shown as a root.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict

from dspark.telemetry.receiver import OTLPReceiver, ReceivedSpan

_PROCESS_KEYS = ("dspark.role", "process.pid", "dspark.replica.id")


def format_trace(spans: list[ReceivedSpan], max_events: int = 3) -> str:
    """One trace as an indented tree, children in start order; at most `max_events` events a span."""
    if not spans:
        return ""
    ids = {s.span_id for s in spans}
    children: dict[str, list[ReceivedSpan]] = defaultdict(list)
    roots = []
    for s in sorted(spans, key=lambda s: s.start_ns):
        (children[s.parent_span_id] if s.parent_span_id in ids else roots).append(s)
    lines = [f"trace {spans[0].trace_id}"]

    def walk(span: ReceivedSpan, depth: int) -> None:
        pad = "   " * depth
        process = " ".join(f"{k}={span.resource[k]}" for k in _PROCESS_KEYS if k in span.resource)
        remote = f" (remote parent {span.parent_span_id})" if span.parent_span_id and depth == 0 else ""
        ms = (span.end_ns - span.start_ns) / 1e6
        lines.append(f"{pad}└─ {span.name}  [{span.kind}, {ms:.1f} ms]  {process}{remote}")
        for key in sorted(span.attributes):
            lines.append(f"{pad}      {key} = {span.attributes[key]}")
        for name, at_ns, attrs in span.events[:max_events]:
            shown = ", ".join(f"{k.removeprefix('dspark.step.')}={v}" for k, v in sorted(attrs.items()))
            lines.append(f"{pad}      • {name} @+{(at_ns - span.start_ns) / 1e6:.1f} ms: {shown}")
        if len(span.events) > max_events:
            lines.append(f"{pad}      • ... {len(span.events) - max_events} more events")
        for child in children[span.span_id]:
            walk(child, depth + 1)

    for root in roots:
        walk(root, 0)
    return "\n".join(lines)


def traces(spans: list[ReceivedSpan]) -> dict[str, list[ReceivedSpan]]:
    by_trace: dict[str, list[ReceivedSpan]] = defaultdict(list)
    for s in spans:
        by_trace[s.trace_id].append(s)
    return dict(by_trace)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4317)
    parser.add_argument("--http-port", type=int, default=4318, help="OTLP/HTTP port; 0: any, -1: none")
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long (default: Ctrl-C)")
    parser.add_argument("--settle", type=float, default=2.0, help="print a trace once quiet this long")
    args = parser.parse_args(argv)
    receiver = OTLPReceiver(args.host, args.port, None if args.http_port < 0 else args.http_port)
    http = f", OTLP/HTTP on {receiver.http_endpoint}" if receiver.http_endpoint else ""
    print(f"[dump] OTLP/gRPC receiver on {receiver.endpoint}{http}", flush=True)
    printed: set[str] = set()
    seen: dict[str, tuple[int, float]] = {}  # trace -> (span count, when it last grew)
    stop = None if args.seconds is None else time.monotonic() + args.seconds
    try:
        while stop is None or time.monotonic() < stop:
            time.sleep(0.2)
            now = time.monotonic()
            for trace_id, spans in traces(receiver.spans()).items():
                if trace_id in printed:
                    continue
                count, since = seen.get(trace_id, (0, now))
                if len(spans) != count:
                    seen[trace_id] = (len(spans), now)
                elif now - since >= args.settle:
                    print(format_trace(spans) + "\n", flush=True)
                    printed.add(trace_id)
    except KeyboardInterrupt:
        pass
    finally:
        for trace_id, spans in traces(receiver.spans()).items():
            if trace_id not in printed:
                print(format_trace(spans) + "\n", flush=True)
        receiver.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
