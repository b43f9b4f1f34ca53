"""The engine: continuous batching of speculative decoding rounds over one target model.

Each step: the drafter proposes a block for every decoding request -> the verify-length policy picks
how many drafted tokens of each the target checks -> one flattened forward verifies all of them and
runs prefill chunks of newcomers -> rejection sampling accepts a prefix plus one token -> the cache
keeps the accepted positions and rolls back the rest -> new tokens stream out.

One request never hurts another: each request's own share of a step runs isolated and fails only
that request (request_failure.py), and a faulty drafter costs drafts, never requests (drafter_guard.py).
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections import deque
from collections.abc import Sequence as Seq

import torch

from dspark.checkpoint import load_checkpoint
from dspark.config import EngineConfig
from dspark.cost_table import CostTable, ProfileShape, load_or_profile
from dspark.detokenizer import IncrementalDetokenizer, find_stop
from dspark.draft_budget import DraftBudget
from dspark.draft_gate import DraftGate
from dspark.drafter import Drafter, DraftProposal, DraftRequest, create_drafter
from dspark.drafter_guard import DrafterGuard
from dspark.errors import AdmissionError, EngineDeadError, InvalidRequestError
from dspark.kv_cache import PageManager
from dspark.outputs import RequestOutput, RoundReport, StepReport
from dspark.prefix_cache import CachedPage
from dspark.request_failure import FailureWindow, check_logits, request_failure
from dspark.runner import ForwardItem
from dspark.sampling import greedy, probs_from_logits, sample
from dspark.sampling_params import SamplingParams
from dspark.scheduler import RoundRate, Sps
from dspark.sequence import Sequence, Status
from dspark.stats import EngineStats, count_positions
from dspark.step_budget import prefill_tokens
from dspark.tp import TPContext, rank_runner
from dspark.verify import verify
from dspark.verify_policy import SCHEDULED_MODES, VerifyLengthPolicy, VerifyRound, make_policy, window_limit

log = logging.getLogger(__name__)


class Engine:
    def __init__(
        self,
        config: EngineConfig,
        drafter: Drafter | None = None,
        policy: VerifyLengthPolicy | None = None,
        cost_table: CostTable | None = None,
        tp: TPContext | None = None,
    ) -> None:
        self.config = config
        # Rank 0 of a tensor-parallel group from the start: the model and KV cache are this rank's
        # shard, and every forward is broadcast to the followers (dspark/tp.py).
        self.tp = tp or TPContext()
        if self.tp.rank != 0:
            raise ValueError("ranks > 0 run no engine: they follow rank 0 (tp.follower_runner, tp.follow)")
        ckpt = load_checkpoint(config.model)
        cfg = ckpt.config
        self.model_config = cfg
        self.model_name = ckpt.name
        self.tokenizer = ckpt.tokenizer
        self.runner = rank_runner(ckpt, config, self.tp)
        self.model = self.runner.model
        self.max_model_len = min(
            config.max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings
        )
        self.pages = PageManager(self.runner.kv.num_pages, config.kv_page_size, config.enable_prefix_caching)
        self.drafter = drafter or create_drafter(
            config.drafter,
            num_speculative_tokens=config.num_speculative_tokens,
            target=self.model,
            path=config.drafter_model,
            target_path=config.model,
            dtype=config.torch_dtype,
            device=config.device,
            **config.drafter_options,
        )
        self.gamma = window_limit(
            config.scheduler, min(config.num_speculative_tokens, self.drafter.max_draft_tokens)
        )
        self.policy = policy or make_policy(config.scheduler, config.confidence_threshold)
        eos = set(cfg.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(eos)
        self.seqs: dict[str, Sequence] = {}  # running requests in arrival order
        # Called after every verify round as fn(seq, proposal, num_verified, verdict): evaluation,
        # calibration and monitoring read acceptance here without touching the step loop.
        self.round_observers: list = []
        # Called after every step that ran a forward as fn(StepReport), on the engine thread: telemetry
        # reads steps here (dspark/telemetry), so the loop itself never touches a tracer or a meter.
        self.step_observers: list = []
        self.stats = EngineStats()
        # When the last step ended, while requests were left to run (None: idle since). The time from
        # there to the next step is the serving loop's own (outputs handed on, calls between steps):
        # the requests wait it out too, so it counts in their rounds' wall time (EngineStats.round_time_s).
        self._busy_step_end: float | None = None
        self.draft_guard = DrafterGuard(cfg.vocab_size, config.max_drafter_failures, self.stats)
        self._failures = FailureWindow(config.max_request_failures, config.failure_window_steps)
        # Why this engine should be replaced (set once, never cleared); None while it is healthy.
        self.unhealthy: str | None = None
        self._rng = random.Random(config.seed)
        self.draft_budget = self.stats.draft_budget = config.draft_budget
        # Survival rows of the last two rounds: [0] is round t-2 when round t is scheduled.
        self._survival_history: deque[list[list[float]]] = deque(maxlen=2)
        self.cost_table = cost_table
        # Scheduled modes also decide, from earlier rounds, whether drafting pays at all (draft_gate.py).
        self.draft_gate = DraftGate() if config.draft_gate and config.scheduler in SCHEDULED_MODES else None
        self.stats.draft_gate = self.draft_gate
        # A drafter that never reports confidences (n-gram) has its windows verified in full: no table.
        confident = getattr(self.drafter, "reports_confidence", True)
        if cost_table is None and config.scheduler in SCHEDULED_MODES and self.gamma > 0 and confident:
            self.load_cost_table()

    # ---- verify budget and cost table --------------------------------------------------------------

    def set_draft_budget(self, budget: DraftBudget) -> None:
        """Replace the draft budget; the next step obeys it, running requests carry on."""
        if not isinstance(budget, DraftBudget):
            raise InvalidRequestError("budget", "must be a DraftBudget")
        self.draft_budget = self.stats.draft_budget = budget

    def load_cost_table(self, force: bool = False) -> CostTable:
        """Load SPS(B) for this model, hardware and configuration from the cache, or profile it."""
        if self.seqs:
            raise RuntimeError("profiling overwrites the KV cache: only while no request is running")
        self.pages.clear_cache()  # the cached prompt pages are about to be overwritten
        config = self.config
        self.cost_table = load_or_profile(
            self.runner, config.model, self.cost_table_shape(), config.cost_table_dir, force
        )
        return self.cost_table

    def cost_table_shape(self) -> ProfileShape:
        """What this engine's forwards look like, for profiling SPS(B) (and keying its cache)."""
        config = self.config
        return ProfileShape(
            max_tokens=config.max_num_batched_tokens,
            max_seqs=config.max_num_seqs,
            gamma=config.num_speculative_tokens,
            context_len=min(256, self.max_model_len // 2),
            page_size=config.kv_page_size,
            dtype=config.dtype,
            device=config.device,
            tap_layers=tuple(self.drafter.target_layer_ids),
            coarse=config.cost_table_profile == "coarse",
            tensor_parallel_size=self.tp.world,
        )

    # ---- requests -------------------------------------------------------------------------------

    def tokenize(self, prompt: str | Seq[int]) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt", "must not be empty")
            if self.tokenizer is None:
                raise InvalidRequestError("prompt", "this model has no tokenizer; pass token ids")
            ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        else:
            ids = list(prompt)
            bad = [
                t
                for t in ids
                if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.model_config.vocab_size
            ]
            if bad:
                raise InvalidRequestError(
                    "prompt", f"token ids must be ints in [0, {self.model_config.vocab_size})"
                )
        if not ids:
            raise InvalidRequestError("prompt", "must not be empty")
        return ids

    def add_request(
        self, prompt: str | Seq[int], params: SamplingParams | None = None, request_id: str | None = None
    ) -> str:
        """Admit a request or refuse it (InvalidRequestError / AdmissionError) without touching others."""
        if self.unhealthy is not None:
            raise EngineDeadError(f"engine unhealthy, taking no new requests: {self.unhealthy}")
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params", "must be a SamplingParams")
        ids = self.tokenize(prompt)
        if len(ids) >= self.max_model_len:
            raise InvalidRequestError(
                "prompt", f"{len(ids)} tokens do not fit the model's context of {self.max_model_len} tokens"
            )
        if len(ids) + params.max_tokens > self.max_model_len:
            raise InvalidRequestError(
                "max_tokens",
                f"{params.max_tokens} new tokens after a {len(ids)}-token prompt exceed the "
                f"model's context of {self.max_model_len} tokens",
            )
        request_id = request_id or uuid.uuid4().hex
        if request_id in self.seqs:
            raise InvalidRequestError("request_id", f"{request_id!r} is already running")
        if len(self.seqs) >= self.config.max_num_seqs:
            raise AdmissionError(
                f"engine full: {len(self.seqs)} of max_num_seqs={self.config.max_num_seqs} running"
            )
        # The last generated token is never run through the target, so this is the most K/V it can hold.
        cached = self.pages.reserve(request_id, len(ids) + params.max_tokens, ids, self._needs_context)
        generator = None
        if not params.greedy:
            seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
            generator = torch.Generator().manual_seed(seed)
        self.seqs[request_id] = Sequence(
            request_id,
            prompt if isinstance(prompt, str) else None,
            ids,
            params,
            IncrementalDetokenizer(self.tokenizer, ids),
            generator,
        )
        self.stats.prompt_tokens += len(ids)
        self._reuse(self.seqs[request_id], cached)
        return request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        seq = self.seqs.get(request_id)
        if seq is None:
            return None
        seq.delta_token_ids, seq.delta_text = [], ""
        self._finish(seq, "abort")
        self.stats.aborted_requests += 1
        return RequestOutput.of(seq)

    def has_unfinished(self) -> bool:
        return bool(self.seqs)

    def can_admit(self, num_tokens: int) -> bool:
        return len(self.seqs) < self.config.max_num_seqs and (
            -(-num_tokens // self.config.kv_page_size) <= self.pages.num_unreserved_pages
        )

    # ---- the step -------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one round for every running request; returns the requests that changed.

        A request's own share of the round (its draft cap, verify, sampling, emit) runs `_isolated`: if
        it raises, that request alone fails. What belongs to no single request (the batched forward,
        the policy) raises to the caller, which must treat the engine as broken (AsyncEngine does).
        """
        t_start = time.perf_counter()
        rounds_before = self.stats.rounds
        for seq in self.seqs.values():
            seq.delta_token_ids, seq.delta_text = [], ""
        budget = self.config.max_num_batched_tokens
        decoding = [s for s in self.seqs.values() if s.status is Status.DECODE]
        prefilling = [s for s in self.seqs.values() if s.status is Status.PREFILL]

        step_cap = budget - len(decoding)
        if self.draft_budget.max_step_tokens is not None:
            step_cap = min(step_cap, self.draft_budget.max_step_tokens)
        decoding, caps = self._draft_caps(decoding, step_cap)
        drafting = self._gate_open(len(decoding))
        if not drafting:
            caps = [0] * len(caps)
        t_draft = time.perf_counter()
        proposals = self._propose(decoding, caps)
        draft_time = time.perf_counter() - t_draft
        round_ = self._verify_round(proposals, caps, step_cap, self._round_rate(proposals))
        lengths = self.policy.choose(round_)
        budget = self._step_tokens(len(decoding) + sum(lengths), budget)

        items, chunks = self._batch(decoding, proposals, lengths, prefilling, budget)
        if not items:
            self._busy_step_end = None
            return self._outputs()
        num_tokens = sum(len(item.token_ids) for item in items)
        predicted_s = 1.0 / self.cost_table(num_tokens) if self.cost_table is not None else None
        t_forward = time.perf_counter()
        result = self.runner.forward(items, self.drafter.target_layer_ids)
        forward_time = time.perf_counter() - t_forward
        num_tokens = sum(len(item.token_ids) for item in items)
        self.stats.forward_tokens += num_tokens
        attention_keys = len(items) * max(item.start + len(item.token_ids) for item in items)
        attention_query_keys = attention_keys * max(len(item.token_ids) for item in items)
        self.stats.attention_keys += attention_keys
        self.stats.attention_query_keys += attention_query_keys
        self.stats.prefill_tokens += sum(len(item.token_ids) for item in items[len(decoding) :])
        self.stats.prompt_chunks += len(chunks)
        if self.cost_table is not None and self.config.cost_table_ema > 0:
            self.cost_table.observe(num_tokens, forward_time, self.config.cost_table_ema)

        accepted_total = 0
        accepted_each: list[int | None] = []
        for i, (seq, proposal, n) in enumerate(zip(decoding, proposals, lengths)):
            accepted = self._isolated(seq, self._accept, seq, proposal, n, result.logits[i], result.hidden[i])
            accepted_each.append(accepted)
            if accepted is not None:
                accepted_total += accepted
                self.stats.record_round(n, round_.survival[i], accepted)
        for i, seq in enumerate(chunks, start=len(decoding)):
            self._isolated(seq, self._prefilled, seq, items[i], result.logits[i], result.hidden[i])
        if self.draft_gate is not None and decoding:
            self.draft_gate.record(
                drafting, len(decoding), accepted_total, sum(lengths), draft_time, self.cost_table
            )
            self.stats.gated_rounds += not drafting

        elapsed = time.perf_counter() - t_start
        self.stats.record_step(elapsed, forward_time, draft_time)
        if chunks:
            self.stats.record_prefill_step(
                elapsed,
                num_tokens,
                self.stats.rounds - rounds_before,
                draft_time,
                attention_keys,
                attention_query_keys,
            )
        between = t_start - self._busy_step_end if self._busy_step_end is not None else 0.0
        decode_tokens = sum(len(item.token_ids) for item in items[: len(decoding)])
        self.stats.record_decode(len(decoding), decode_tokens, between + elapsed)
        if self.step_observers:
            rounds = zip(decoding, proposals, lengths, accepted_each, round_.survival)
            self._observe_step(
                StepReport(
                    self.stats.steps,
                    tuple(RoundReport(s.request_id, len(p.token_ids), n, a, q) for s, p, n, a, q in rounds),
                    tuple(seq.request_id for seq in chunks),
                    num_tokens,
                    drafting,
                    self.config.scheduler,
                    predicted_s,
                    forward_time,
                    draft_time,
                    elapsed,
                )
            )
        outputs = self._outputs()
        self._busy_step_end = time.perf_counter() if self.seqs else None
        return outputs

    def _observe_step(self, report: StepReport) -> None:
        """Step observers are telemetry: one that raises is dropped (and logged), the step stands."""
        for observe in list(self.step_observers):
            try:
                observe(report)
            except Exception:
                log.exception("step observer %r failed; removed", observe)
                self.step_observers.remove(observe)

    def _batch(
        self,
        decoding: list[Sequence],
        proposals: list[DraftProposal],
        lengths: list[int],
        prefilling: list[Sequence],
        budget: int,
    ) -> tuple[list[ForwardItem], list[Sequence]]:
        """The forward's items: each decoding request's anchor and verified drafts, then as much prefill
        as the token budget leaves; returns them with the requests whose prompt chunks were taken."""
        items: list[ForwardItem] = []
        for seq, proposal, n in zip(decoding, proposals, lengths):
            tokens = [seq.output_token_ids[-1], *proposal.token_ids[:n]]
            items.append(ForwardItem(tokens, seq.num_computed, [], logits_from=0))
            budget -= len(tokens)
        chunks: list[Sequence] = []
        for seq in prefilling:
            if budget <= 0:
                break
            # Pages other requests committed since this one arrived (a shared prompt prefilled
            # alongside) are reused rather than computed again.
            self._reuse(seq, self.pages.reuse_cached(seq.request_id, seq.num_computed, self._needs_context))
            n = min(len(seq.prompt_token_ids) - seq.num_computed, budget)
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.monotonic()
            tokens = seq.prompt_token_ids[seq.num_computed : seq.num_computed + n]
            done = seq.num_computed + n == len(seq.prompt_token_ids)
            items.append(ForwardItem(tokens, seq.num_computed, [], logits_from=n - 1 if done else n))
            chunks.append(seq)
            budget -= n
        for seq, item in zip(decoding + chunks, items):
            item.page_table = self.pages.ensure(seq.request_id, item.start + len(item.token_ids))
        return items, chunks

    def _step_tokens(self, decode_tokens: int, budget: int) -> int:
        """The step's token budget: the engine's, less the prefill that would take the step past the
        draft budget's max_step_s on the cost table (dspark/step_budget.py); at least one KV page of
        prefill. Chunking changes when a prompt's tokens are computed, never which tokens are sampled."""
        max_step_s = self.draft_budget.max_step_s
        if max_step_s is None or self.cost_table is None:
            return budget
        page = self.config.kv_page_size
        return decode_tokens + prefill_tokens(self.cost_table, decode_tokens, max_step_s, budget, page)

    def _outputs(self) -> list[RequestOutput]:
        """The requests that changed this step, in arrival order; finished ones leave the engine."""
        changed = [RequestOutput.of(s) for s in self.seqs.values() if s.delta_token_ids or s.finished]
        for out in changed:
            if out.finished:
                self.seqs.pop(out.request_id, None)
        return changed

    def _gate_open(self, num_decoding: int) -> bool:
        """Draft this round? Always, unless the draft gate (scheduled modes) expects it not to pay."""
        if self.draft_gate is None or self.cost_table is None or self.gamma == 0:
            return True
        return self.draft_gate.should_draft(num_decoding, self.cost_table)

    def _draft_caps(self, decoding: list[Sequence], step_cap: int) -> tuple[list[Sequence], list[int]]:
        """The decoding requests still running, with the drafted tokens each may have verified."""
        planned = [(seq, self._isolated(seq, self._draft_cap, seq, step_cap)) for seq in decoding]
        planned = [(seq, cap) for seq, cap in planned if cap is not None]
        return [seq for seq, _ in planned], [cap for _, cap in planned]

    def _draft_cap(self, seq: Sequence, step_cap: int) -> int:
        """gamma, cut to max_tokens and to the draft budget."""
        # Never draft past max_tokens: a round gains at most l + 1 tokens.
        cap = min(self.gamma, seq.remaining_tokens - 1, step_cap)
        limit = self.draft_budget.request_cap(seq.params.sla_class)
        return max(0, cap if limit is None else min(cap, limit))

    def _round_rate(self, proposals: list[DraftProposal]) -> Sps | None:
        """What the verify-length walk weighs a round by: the cost table, with the round's drafting added
        (the gate's steady drafting seconds per request, for each request that drafted) where that is
        measured and `verify_counts_drafting` asks for it."""
        gate, table = self.draft_gate, self.cost_table
        if table is None or gate is None or gate.draft_s is None or not self.config.verify_counts_drafting:
            return table
        drafting = sum(1 for p in proposals if p.token_ids)
        return RoundRate(table, gate.draft_s * drafting) if drafting else table

    def _verify_round(
        self, proposals: list[DraftProposal], caps: list[int], step_cap: int, sps: Sps | None
    ) -> VerifyRound:
        """What the policy sees; the pipelined variant gets survival of round t-2 only (its firewall)."""
        history = self._survival_history[0] if len(self._survival_history) == 2 else None
        round_ = VerifyRound.build(proposals, caps, step_cap, sps, history)
        # Only rounds that drafted: a gated round has no confidences, and would zero the pipelined
        # capacity of the probe two rounds later. Older drafted rounds are resolved all the same.
        if any(p.token_ids for p in proposals):
            self._survival_history.append([row or [] for row in round_.survival])
        return round_

    def _propose(self, decoding: list[Sequence], caps: list[int]) -> list[DraftProposal]:
        """Each request's proposal; empty where it may not draft or the drafter failed it."""
        proposals = [DraftProposal([]) for _ in decoding]
        guard = self.draft_guard
        wanted = [(i, k) for i, k in enumerate(caps) if k > 0 and guard.drafting(decoding[i].request_id)]
        if wanted:
            requests = [
                DraftRequest(
                    decoding[i].request_id,
                    decoding[i].token_ids,
                    k,
                    decoding[i].params,
                    decoding[i].generator,
                )
                for i, k in wanted
            ]
            for (i, _), proposal in zip(wanted, guard.propose(self.drafter, requests)):
                proposals[i] = proposal
        return proposals

    def _accept(self, seq: Sequence, proposal: DraftProposal, n: int, logits, hidden) -> int:
        """Verify n drafted tokens, commit the accepted ones and emit; returns how many were accepted."""
        check_logits(logits)
        draft = proposal.token_ids[:n]
        probs = proposal.probs[:n] if proposal.probs is not None else None
        verdict = verify(logits, draft, probs, seq.params, seq.generator)
        anchor_and_accepted = [seq.output_token_ids[-1], *draft[: verdict.num_accepted]]
        # The anchor and the accepted drafts now have valid K/V; the rejected tail is rolled back.
        seq.num_computed += len(anchor_and_accepted)
        self.pages.truncate(seq.request_id, seq.num_computed)
        self.draft_guard.add_context(
            self.drafter,
            seq.request_id,
            anchor_and_accepted,
            None if hidden is None else hidden[: len(anchor_and_accepted)],
        )
        seq.rounds += 1
        seq.proposed_draft_tokens += len(proposal.token_ids)
        seq.verified_draft_tokens += n
        seq.accepted_draft_tokens += verdict.num_accepted
        count_positions(seq.accepted_by_position, verdict.num_accepted)
        self.stats.record_verdict(len(proposal.token_ids), n, verdict.num_accepted)
        for observe in self.round_observers:
            observe(seq, proposal, n, verdict)
        self._emit(seq, [*draft[: verdict.num_accepted], verdict.next_token])
        return verdict.num_accepted

    def _prefilled(self, seq: Sequence, item: ForwardItem, logits, hidden) -> None:
        seq.num_computed += len(item.token_ids)
        self.draft_guard.add_context(self.drafter, seq.request_id, item.token_ids, hidden)
        if seq.num_computed < len(seq.prompt_token_ids):
            self._publish(seq, hidden)
            return
        check_logits(logits[-1:])
        self._publish(seq, hidden)
        seq.status = Status.DECODE
        seq.first_token_time = time.monotonic()
        row = logits[-1]
        token = (
            greedy(row) if seq.params.greedy else sample(probs_from_logits(row, seq.params), seq.generator)
        )
        self._emit(seq, [token])

    # ---- prefix caching (dspark/prefix_cache.py) ----------------------------------------------------

    @property
    def _needs_context(self) -> bool:
        """Whether the drafter reads hidden states: then only pages that carry them are reused."""
        return bool(self.drafter.target_layer_ids)

    def _reuse(self, seq: Sequence, cached: list[CachedPage]) -> None:
        """`cached` pages joined seq's table: their tokens count as computed, and the drafter gets the
        hidden states the target produced for them when they were prefilled."""
        if not cached:
            return
        tokens = [t for entry in cached for t in entry.tokens]
        hidden = None
        if self._needs_context:
            hidden = torch.cat([entry.payload for entry in cached]).to(self.runner.device)
        seq.num_computed += len(tokens)
        seq.num_cached_tokens += len(tokens)
        self.stats.cached_prompt_tokens += len(tokens)
        self.draft_guard.add_context(self.drafter, seq.request_id, tokens, hidden)

    def _publish(self, seq: Sequence, hidden) -> None:
        """Offer the prompt pages this chunk filled to the prefix cache, each with its tokens' hidden
        states; keep the rows of a page not yet full until it is."""
        if not self.pages.prefix_caching:
            return
        if hidden is not None:
            seq.unsettled_hidden.append(hidden)
        rows = torch.cat(seq.unsettled_hidden) if seq.unsettled_hidden else None
        size = self.pages.page_size
        host: list[torch.Tensor] = []

        def payload_of(i: int) -> torch.Tensor:
            # In host memory: the device holds exactly the K/V it was sized for, and the context of a
            # cached page crosses back only when a request reuses it. One transfer per chunk.
            if not host:
                host.append(rows.to("cpu"))
            return host[0][i * size : (i + 1) * size].clone()

        settled = self.pages.publish(seq.request_id, seq.num_computed, None if rows is None else payload_of)
        done = seq.num_computed >= len(seq.prompt_token_ids)
        seq.unsettled_hidden = [] if rows is None or done else [rows[settled * size :]]

    def _emit(self, seq: Sequence, tokens: list[int]) -> None:
        """Append tokens one by one, stopping exactly where plain decoding would have stopped."""
        params = seq.params
        for token in tokens:
            seq.output_token_ids.append(token)
            seq.delta_token_ids.append(token)
            self.stats.generated_tokens += 1
            delta = seq.detokenizer.push(token)
            if (token in self.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids:
                self._finish(seq, "stop")
                break
            if delta:
                if params.stop and (cut := find_stop(seq.text + delta, len(delta), params.stop)) is not None:
                    full = seq.text + delta
                    keep = (
                        full[: cut + len(next(s for s in params.stop if full.startswith(s, cut)))]
                        if params.include_stop_str_in_output
                        else full[:cut]
                    )
                    seq.delta_text += keep[len(seq.text) :]
                    seq.text = keep
                    self._finish(seq, "stop")
                    break
                seq.text += delta
                seq.delta_text += delta
            if len(seq.output_token_ids) >= params.max_tokens:
                self._finish(seq, "length")
                break

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        seq.finished_time = time.monotonic()
        self.pages.release(seq.request_id)
        self.draft_guard.release(self.drafter, seq.request_id)
        if reason not in ("abort", "error"):
            self.stats.finished_requests += 1
        if reason == "abort":
            self.seqs.pop(seq.request_id, None)

    # ---- failures ---------------------------------------------------------------------------------

    def _isolated(self, seq: Sequence, fn, *args):
        """fn(*args) as `seq`'s own share of the step: if it raises, `seq` alone fails (returns None)."""
        try:
            return fn(*args)
        except Exception as exc:
            self._fail(seq, exc)
            return None

    def _fail(self, seq: Sequence, exc: Exception) -> None:
        """Stop `seq` with a RequestFailedError for its stream and free its KV pages; count the failure."""
        seq.error = request_failure(seq.request_id, exc)
        log.warning("%s", seq.error, exc_info=exc)
        seq.delta_token_ids, seq.delta_text = [], ""
        self._finish(seq, "error")
        self.stats.failed_requests += 1
        if self._failures.record(self.stats.steps):
            self.mark_unhealthy(
                f"{self.config.max_request_failures} requests failed within "
                f"{self.config.failure_window_steps} steps, the last with: {seq.error}"
            )

    def mark_unhealthy(self, reason: str) -> None:
        """Report the engine broken (health checks read `unhealthy`); it takes no new requests."""
        if self.unhealthy is None:
            log.error("engine unhealthy: %s", reason)
            self.unhealthy = reason
