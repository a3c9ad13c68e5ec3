"""The runner: executes a ``SchedulerPlan`` as one ragged forward, samples, verifies drafts.

Every tensor lives here. It returns, per sequence, the tokens it chose and the number of
drafts it verified (``scheduler/plan.py``); the scheduler advances the requests. Lane holders draft ``K`` tokens and their ``K + 1`` verify
positions ride in the same batched forward as everyone else's decode rows and
prefill chunks, so the weights are read once for the whole tick. After
verification, rejected positions are left behind in the KV cache (the next forward starts
at the verified length, reads nothing past it, and overwrites them); the target's own
token at the first mismatch (or the bonus token after ``K`` accepted) is kept as the
next input, exactly as in classic decoding.

A draft may be a tree (``draft_tree.py``): its nodes ride in the forward as rows at
consecutive cache positions, each at the RoPE position of its depth and seeing only its
ancestors (``RaggedBatch.trees``); verification walks the tree, and the accepted path's
keys and values move to their positions (``KVCache.move``), so the cache ends as a chain
round's would. A tree of n nodes is n verify rows, what a chain of n drafts costs.

A request with a grammar (structured outputs, forced tool calls) has a matcher here.
Its round's draft is cut to what the grammar allows and extended with the tokens the
grammar forces (a fixed JSON key, punctuation), so forced tokens cost no drafting and
ride the verify; every row it samples from is masked with the grammar state of that
position (``logits.py``), and the matcher advances over the kept tokens only. Drafts
under a grammar are verified by exact match, which keeps the output token for token
what plain constrained decoding gives, seeded sampling included.
"""

from __future__ import annotations

import logging
import time

import torch

from speclane import draft_tree
from speclane.drafters.base import Draft, Drafter, HiddenObserver
from speclane.engine.logits import HeldStops, TokenHistory, constrain, token_logprobs
from speclane.engine.sampling import choose_tokens
from speclane.grammar.compiler import CompiledGrammar
from speclane.grammar.matcher import GrammarMatcher
from speclane.models.kv_cache import KVCache
from speclane.models.llama import LlamaModel, RaggedBatch
from speclane.request import Request, TokenLogprob
from speclane.scheduler.plan import RunnerResult, ScheduledSeq, SchedulerPlan, SeqResult

logger = logging.getLogger(__name__)
PROMPT_LOGPROB_ROWS = 128  # prompt rows whose logits are computed at once (each a float32 vocabulary)


class ModelRunner:
    def __init__(self, model: LlamaModel, cache: KVCache, drafter: Drafter | None):
        self._draft_timings: list[tuple[str, float, int, float | None]] = []  # its proposals' (RunnerResult.draft_timings)
        self._seed_timings: list[tuple[str, float, float]] = []  # its seeding proposals' (RunnerResult.seed_timings)
        self.model = model
        self.cache = cache
        self.drafter = drafter
        self._seeds: dict[str, int] = {}  # unseeded requests' own sampling streams
        self._matchers: dict[str, GrammarMatcher] = {}  # constrained requests' grammar state
        self._histories: dict[str, TokenHistory] = {}  # penalised requests' tokens (logits.py)
        # Rounds that verified a draft tree, and those whose accepted path left the tree's
        # first chain (diagnostics for tests and benchmarks).
        self.tree_rounds = 0
        self.branch_rounds = 0
        # Who receives the target's final hidden states of every kept position: a drafter
        # that drafts from them (MTP), or a recorder (``speclane train-mtp``).
        self.hidden_observers: list[HiddenObserver] = []
        if drafter is not None and drafter.needs_hidden_states:
            self.hidden_observers.append(drafter)  # type: ignore[arg-type]

    def execute(self, plan: SchedulerPlan) -> RunnerResult:
        started = time.perf_counter()
        self._draft_timings, self._seed_timings = [], []
        self.release(plan.preempted_request_ids, preempted=True)
        self.cache.copy_blocks(plan.kv_copies)  # cached K/V that admitted prompts start from
        seqs = self._step(list(plan.seqs)) if plan.seqs else []
        return RunnerResult(seqs=tuple(seqs), elapsed_ms=(time.perf_counter() - started) * 1000,
                            draft_timings=tuple(self._draft_timings), seed_timings=tuple(self._seed_timings))

    def release(self, request_ids: tuple[str, ...], *, preempted: bool = False) -> None:
        """Forget the per-request state (sampling stream, grammar matcher, token history,
        drafter state) of requests that left; ``preempted``: only the drafter's, of requests
        recomputed later, which go on with their own sampling stream, and the grammar state
        and token history of their output."""
        for rid in request_ids:
            if not preempted:
                self._seeds.pop(rid, None)
                self._matchers.pop(rid, None)
                self._histories.pop(rid, None)
            if self.drafter is not None:
                self.drafter.release(rid)

    def finish(self, request: Request) -> None:
        """``request`` finished: the drafter may learn from its output (``Drafter.finish``)."""
        if self.drafter is not None:
            self.drafter.finish(request)

    @property
    def num_sampling_streams(self) -> int:
        """Unseeded requests whose sampling stream the runner keeps (a leak check for tests)."""
        return len(self._seeds)

    @property
    def num_token_histories(self) -> int:
        """Penalised requests whose token history the runner keeps (a leak check for tests)."""
        return len(self._histories)

    @property
    def num_grammar_matchers(self) -> int:
        """Constrained requests whose matcher the runner keeps (a leak check for tests)."""
        return len(self._matchers)

    def _matcher(self, request: Request) -> GrammarMatcher | None:
        if request.grammar is None:
            return None
        matcher = self._matchers.get(request.request_id)
        if matcher is None:
            assert isinstance(request.grammar, CompiledGrammar)
            matcher = self._matchers[request.request_id] = request.grammar.new_matcher()
        return matcher

    def _history(self, request: Request, vocab_size: int) -> TokenHistory:
        history = self._histories.get(request.request_id)
        if history is None:
            history = self._histories[request.request_id] = TokenHistory(vocab_size)
        return history.update(request.prompt_token_ids, request.output_token_ids)

    # -- one ragged forward -------------------------------------------------------------
    def _step(self, seqs: list[ScheduledSeq]) -> list[SeqResult]:
        drafts: list[Draft] = []
        for seq in seqs:
            if seq.num_draft_tokens > 0 and self.drafter is not None:
                started = time.perf_counter()
                draft = self.drafter.propose(seq.request, seq.num_draft_tokens, may_seed=seq.may_seed)
                elapsed = (time.perf_counter() - started) * 1000
                if draft.seeded:  # the seed's own time where the drafter split it off; its drafts,
                    # the first passes of a fresh state, say nothing of a round's per token
                    seed_ms = elapsed if draft.catch_up_ms is None else draft.catch_up_ms
                    self._seed_timings.append((seq.request_id, seed_ms, elapsed))
                else:
                    catch_up = draft.catch_up_ms
                    drafting = elapsed - (catch_up or 0.0)
                    self._draft_timings.append((seq.request_id, drafting, len(draft.token_ids), catch_up))
                draft = draft.cut(seq.num_draft_tokens)
                matcher = self._matcher(seq.request)
                if matcher is not None:  # what the grammar allows, then what it forces; exact-match verify
                    draft = Draft(matcher.draft(draft.chain().token_ids, seq.num_draft_tokens))
                elif draft.parents is not None and self._rows_follow_drafts(seq.request):
                    draft = draft.chain()  # penalties and min_tokens count a row's drafts as a chain (logits.py)
                drafts.append(draft)
            else:
                drafts.append(Draft([]))
        fed = [list(seq.token_ids) + d.token_ids for seq, d in zip(seqs, drafts, strict=True)]
        input_ids: list[int] = []
        positions: list[int] = []
        for seq, tokens, draft in zip(seqs, fed, drafts, strict=True):
            input_ids.extend(tokens)
            if draft.parents is None:
                positions.extend(range(seq.start, seq.start + len(tokens)))
            else:  # the fed tokens, then each node at its depth
                last = seq.start + len(seq.token_ids) - 1
                positions.extend(range(seq.start, last + 1))
                positions.extend(last + depth for depth in draft_tree.depths(draft.parents))
        batch = RaggedBatch(
            input_ids=torch.tensor(input_ids, dtype=torch.long),
            positions=torch.tensor(positions, dtype=torch.long),
            block_tables=[s.block_table for s in seqs],
            starts=[s.start for s in seqs],
            num_new=[len(t) for t in fed],
            trees=[d.parents for d in drafts] if any(d.parents for d in drafts) else None,
        )
        hidden = self.model(batch, self.cache)  # [T, hidden]

        # Rows that need logits: every position of a verify row, the last of a sampling row.
        # A row whose token is its largest raw logit (greedy, nothing reads or moves the rest
        # of the row) may find its candidates on the head's int4 screen (LlamaModel.logits).
        rows: list[int] = []
        argmax_rows: list[bool] = []
        offset = 0
        for seq, tokens, draft in zip(seqs, fed, drafts, strict=True):
            if seq.sample:
                num_sampled = len(draft.token_ids) + 1
                rows.extend(range(offset + len(tokens) - num_sampled, offset + len(tokens)))
                argmax_only = seq.request.sampling.argmax_only and seq.request.grammar is None
                argmax_rows.extend([argmax_only] * num_sampled)
            offset += len(tokens)
        prompt_logprobs = self._prompt_logprobs(seqs, fed, hidden)
        logits = self.model.logits(hidden[rows], argmax_rows) if rows else None  # [R, vocab] float32
        raw = self._constrain(seqs, drafts, logits) if logits is not None else {}
        # Greedy rows' argmax in one call for the tick, by numpy: per sequence torch's cost
        # ~80 µs a call, and torch's one call over the tick ~50 µs where numpy's takes ~10 (a
        # 49,152-token row); the first maximum either way (a NaN counts as the maximum in both).
        greedy = logits is not None and any(seq.sample and seq.request.sampling.greedy for seq in seqs)
        argmax = logits.numpy().argmax(axis=-1).tolist() if greedy else None

        results: list[SeqResult] = []
        kept: list[list[int] | int] = []  # per sequence: its rows that stay in the cache (a count: the first ones)
        cursor = 0
        for seq, tokens, draft in zip(seqs, fed, drafts, strict=True):
            prompt_entries, prompt_from = prompt_logprobs.get(seq.request_id, ((), 0))
            if not seq.sample:  # a chunk in the middle of a prompt
                results.append(SeqResult(seq.request_id, prompt_logprobs=prompt_entries,
                                         prompt_logprobs_from=prompt_from))
                kept.append(len(tokens))
                continue
            proposed = draft.token_ids
            n = len(proposed) + 1
            probs = draft.probs[: len(proposed)] if draft.probs is not None else None
            verdict = self._choose(seq.request, logits[cursor : cursor + n], proposed, probs,
                                   seq.start + len(seq.token_ids), argmax[cursor : cursor + n] if argmax is not None else None,
                                   draft.parents)
            cursor += n
            matcher = self._matcher(seq.request)
            error = None
            if matcher is not None and not matcher.consume(verdict.token_ids):
                # Every row was masked, so the parser gave up: a limit of its own (a schema
                # whose required fields nest without end has no finite JSON, and llguidance
                # stops at "Too many items"). Its mask then allows only an end-of-sequence
                # token; the request fails with the parser's reason, the engine goes on.
                reason = (matcher.error or "unknown").strip().splitlines()[0][:300]  # not its state or grammar dump
                error = f"the output could not follow the request's grammar: {reason}"
                logger.warning("%s: %s", seq.request_id, error)
            num_top = seq.request.sampling.logprobs
            path_rows = [0] + [j + 1 for j in verdict.path]  # the rows the kept tokens were chosen from
            logprobs = token_logprobs(raw[seq.request_id][path_rows], verdict.token_ids, num_top) if num_top is not None else ()
            results.append(SeqResult(seq.request_id, tuple(verdict.token_ids), len(proposed), logprobs,
                                     prompt_entries, prompt_from, error=error))
            # Keep the fed tokens and the accepted drafts; the rejected ones lie past the
            # verified length, which the scheduler's next plan starts from.
            fed_count = len(seq.token_ids)
            if draft.parents is not None:
                self.tree_rounds += 1
                self.branch_rounds += verdict.path != draft_tree.first_chain(draft.parents)[: len(verdict.path)]
            if verdict.path == list(range(verdict.num_accepted)):
                kept.append(fed_count + verdict.num_accepted)
            else:  # a tree's branch: its nodes' keys and values to the positions of their depths
                first = seq.start + fed_count
                self.cache.move(seq.block_table, [(first + j, first + d) for d, j in enumerate(verdict.path) if j != d])
                kept.append(list(range(fed_count)) + [fed_count + j for j in verdict.path])
        if self.hidden_observers:
            self._share_hidden(seqs, fed, kept, hidden)
        return results

    def _constrain(self, seqs: list[ScheduledSeq], drafts: list[Draft], logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """Bias and mask each sampling sequence's rows in place; returns the raw rows of
        the sequences that asked for logprobs."""
        raw: dict[str, torch.Tensor] = {}
        cursor = 0
        for seq, draft in zip(seqs, drafts, strict=True):
            if not seq.sample:
                continue
            proposed = draft.token_ids
            first, cursor = cursor, cursor + len(proposed) + 1
            params = seq.request.sampling
            if params.logprobs is not None:
                raw[seq.request_id] = logits[first:cursor].clone()
            held = self._held_stops(seq.request)
            if params.logit_bias or params.penalized or seq.request.grammar is not None or held is not None:
                with torch.inference_mode():  # the logits are the forward's inference tensors
                    constrain(logits[first:cursor], params, self._matcher(seq.request), proposed,
                              self._history(seq.request, logits.shape[-1]) if params.penalized else None, held)
        return raw

    def _prompt_logprobs(self, seqs: list[ScheduledSeq], fed: list[list[int]],
                         hidden: torch.Tensor) -> dict[str, tuple[tuple[TokenLogprob, ...], int]]:
        """Per request that asked for its prompt's logprobs and feeds prompt positions this
        tick: the entries of the prompt tokens those positions predict that it has not got
        yet, and the prompt position of the first. Each row's distribution is the model's
        own, every logit exact (float32 products with the head's rows),
        ``PROMPT_LOGPROB_ROWS`` rows at a time (a row is a vocabulary of float32)."""
        found: dict[str, tuple[tuple[TokenLogprob, ...], int]] = {}
        offset = 0
        for seq, tokens in zip(seqs, fed, strict=True):
            request = seq.request
            if request.sampling.prompt_logprobs is None or seq.start >= request.num_prompt_tokens:
                offset += len(tokens)
                continue
            first = max(seq.start, len(request.prompt_logprobs))  # position p predicts prompt token p + 1
            last = min(seq.start + len(seq.token_ids), request.num_prompt_tokens - 1)
            if first < last:
                rows = list(range(offset + first - seq.start, offset + last - seq.start))
                targets = list(request.prompt_token_ids[first + 1 : last + 1])
                entries: list[TokenLogprob] = []
                for at in range(0, len(rows), PROMPT_LOGPROB_ROWS):
                    # A scored token is often none of a row's top candidates, which are all
                    # that ``logits`` computes exactly with a bfloat16 head: every logit exact.
                    block = self.model.exact_logits(hidden[rows[at : at + PROMPT_LOGPROB_ROWS]])
                    entries += token_logprobs(block, targets[at : at + PROMPT_LOGPROB_ROWS],
                                              request.sampling.prompt_logprobs or 0)
                found[seq.request_id] = (tuple(entries), first + 1)
            offset += len(tokens)
        return found

    @staticmethod
    def _held_stops(request: Request) -> HeldStops | None:
        params = request.sampling
        return HeldStops.of(params, request.eos_token_ids, request.num_output_tokens) if params.min_tokens else None

    def _rows_follow_drafts(self, request: Request) -> bool:
        """Whether a row's processing counts the drafts before it (penalties, stops held for
        min_tokens): such a round drafts a chain, row i after draft i - 1."""
        return request.sampling.penalized or self._held_stops(request) is not None

    def _share_hidden(self, seqs: list[ScheduledSeq], fed: list[list[int]], kept: list[list[int] | int],
                      hidden: torch.Tensor) -> None:
        """Hand the observers the hidden states of the positions that stay in the cache, in
        one call per tick: per request a slice and a call cost ~10 us, a tick's worth of
        them ~1% of a tick of 16 streams that draft nothing."""
        spans: list[tuple[Request, int, int, int]] = []
        rows: list[int] = []  # the kept rows of ``hidden``, in order
        offset = 0
        for seq, tokens, rows_kept in zip(seqs, fed, kept, strict=True):
            # Rejected draft positions are dropped; a tree's kept rows are its accepted path.
            kept_rows = range(offset, offset + rows_kept) if isinstance(rows_kept, int) else [offset + r for r in rows_kept]
            spans.append((seq.request, seq.start, len(rows), len(kept_rows)))
            rows.extend(kept_rows)
            offset += len(tokens)
        # The forward's output is fresh and nothing writes it after this: the observers may
        # keep views of it. Where drafts were rejected, a new tensor of the kept rows.
        tick = hidden if len(rows) == hidden.shape[0] else hidden[rows]
        for observer in self.hidden_observers:
            observer.observe_tick(spans, tick)

    def _choose(self, request: Request, logits: torch.Tensor, draft: list[int], draft_probs: torch.Tensor | None,
                first_position: int, argmax: list[int] | None = None, parents: tuple[int, ...] | None = None):
        seed = request.sampling.seed if request.sampling.seed is not None else self._seed_of(request.request_id)
        return choose_tokens(logits, request.sampling, seed, first_position, draft, draft_probs, argmax, parents)

    def _seed_of(self, request_id: str) -> int:
        # Unseeded requests still get a stream of their own, independent of the batch.
        if request_id not in self._seeds:
            self._seeds[request_id] = int(torch.randint(0, 2**62, (1,)).item())
        return self._seeds[request_id]
