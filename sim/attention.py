"""What a step's attention costs beyond its SPS table's price: the engine pads every request to the longest
(dspark/attention.py gathers keys into [requests, longest context] and queries into [requests, most new
tokens] once a step), so a forward's time grows with its requests times its longest context, not with its
tokens alone.

The SPS table prices a step by its tokens, timed on dummy requests that each hold the same context
(dspark.cost_table.ProfileShape.context_len, 256 on the demo stack). On this machine a forward of 8
one-token requests took 5.3 ms at a context of 32 and 9.3 ms at 384, and one request at 384 beside seven
at 48 took 8.5 ms: nearly what eight at 384 took (bench/results/attention_cost.json, 2026-12-06 18:14).
The validation's requests hold 50-380 tokens, and the more of them decode together, the longer their
longest one, so the real TPOT grows with company more steeply than a table of tokens alone prices it.

Model: a step of B tokens whose forward runs R requests, the longest holding K keys (its context and its
new tokens) and the most new tokens being Q, takes

    s_per_key (R K - its table step's) + s_per_query_key (R Q K - its table step's)

seconds beyond the table's 1 / SPS(B): the keys gathered for every request, and the attention scores of
every request's padded queries against them (the engine's `attention_keys` and `attention_query_keys`
counters). The table's step of B tokens is as dspark.cost_table._time_forward shapes it: min(max_seqs, B,
ceil(B / (gamma + 1))) requests at `table_context` plus their share of the B tokens. Both prices are on
the table's clock: the profile's forward_scale scales them with it (sim/profiles.py). They are measured on
the engine's own runner (bench/attention_cost.py): on this machine 1.32 us a key and 0.042 us a query-key
(r2 0.993 over the measured batches; keys alone 0.851; 1.25 and 0.036 in a sitting at 17:34), so a
48-token prompt chunk beside three decoding requests at 200 tokens pads their queries from 1 to 48, 1.2 ms
more.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionCost:
    """A profile's `attention` block: the prices of a padded key and query-key, and the table's shape."""

    s_per_key: float
    s_per_query_key: float
    table_context: int  # the context each of the table's timed requests held (ProfileShape.context_len)
    table_gamma: int  # a table request verifies gamma + 1 tokens (ProfileShape.gamma)
    table_max_seqs: int  # at most this many requests in a table step (ProfileShape.max_seqs)

    def __post_init__(self) -> None:
        if min(self.s_per_key, self.s_per_query_key, self.table_context, self.table_gamma) < 0:
            raise ValueError(f"attention needs its prices, table_context and table_gamma >= 0, got {self}")
        if self.table_max_seqs < 1:
            raise ValueError(f"attention's table_max_seqs must be at least 1, got {self.table_max_seqs}")

    def table_padding(self, tokens: int) -> tuple[int, int]:
        """(keys, query-keys) of the table's step of `tokens` tokens: requests x longest context, and that
        times the most new tokens a request ran."""
        seqs = min(self.table_max_seqs, tokens, max(1, math.ceil(tokens / (self.table_gamma + 1))))
        most = math.ceil(tokens / seqs)
        keys = seqs * (self.table_context + most)
        return keys, keys * most

    def extra_s(self, tokens: int, keys: float, query_keys: float) -> float:
        """Seconds beyond the table's forward for a step of `tokens` over `keys` padded key positions and
        `query_keys` padded query-key pairs (negative where its batch is less padded than the table's)."""
        table_keys, table_query_keys = self.table_padding(tokens)
        return self.s_per_key * (keys - table_keys) + self.s_per_query_key * (query_keys - table_query_keys)

    @classmethod
    def from_json(cls, data: Mapping | None) -> AttentionCost | None:
        if not data:
            return None
        return cls(
            s_per_key=float(data["s_per_key"]),
            s_per_query_key=float(data["s_per_query_key"]),
            table_context=int(data["table_context"]),
            table_gamma=int(data["table_gamma"]),
            table_max_seqs=int(data["table_max_seqs"]),
        )
