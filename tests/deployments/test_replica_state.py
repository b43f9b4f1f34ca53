"""A target replica's published routing stats (deployments/replica_state.py Republisher)."""

from __future__ import annotations

from deployments.replica_state import Republisher

READING = {"running_requests": 0, "queued_requests": 0, "prefix_cache": {"hashes": ["ab"]}, "healthy": True}


def test_an_unchanged_reading_is_the_previous_one_until_it_is_max_age_old():
    published = Republisher(max_age_s=0.4)
    first = published.publish({**READING, "ts": 10.0})
    # Equal but for its time: Serve's controller sees the same stats and broadcasts nothing.
    assert published.publish({**READING, "ts": 10.25}) is first
    assert published.publish({**READING, "ts": 10.39}) is first
    renewed = published.publish({**READING, "ts": 10.5})  # old enough: out again, fresh
    assert renewed is not first and renewed["ts"] == 10.5
    assert published.publish({**READING, "ts": 10.6}) is renewed


def test_a_changed_reading_goes_out_at_once():
    published = Republisher(max_age_s=0.4)
    published.publish({**READING, "ts": 10.0})
    busy = published.publish({**READING, "running_requests": 1, "ts": 10.1})
    assert busy["running_requests"] == 1 and busy["ts"] == 10.1
    pages = published.publish({**busy, "prefix_cache": {"hashes": ["cd", "ab"]}, "ts": 10.2})
    assert pages["prefix_cache"]["hashes"] == ["cd", "ab"]
    extra = published.publish({**pages, "recent_forward_sps": 3.5, "ts": 10.3})  # a new field
    assert extra["ts"] == 10.3
    fewer = {k: v for k, v in extra.items() if k != "recent_forward_sps"}
    assert published.publish({**fewer, "ts": 10.35})["ts"] == 10.35  # a field gone
