"""The simulator's runner: a ``SchedulerPlan`` in, a ``RunnerResult`` out, no model.

It fills each ``SeqResult`` exactly as ``engine/runner.py`` does, so the real scheduler
cannot tell the difference:

- a prefill chunk: every fed token lands in the cache; a token is sampled only when the
  chunk completes the prompt;
- a decode row: one new token;
- a lane holder's row (``num_draft_tokens = k > 0``): the drafter proposes k tokens, the
  acceptance source says how many lead the verification (a), and the row returns a + 1
  tokens (the accepted drafts and the target's own next token); the cache keeps the fed
  token and the accepted drafts;
- ``--spec-mode burst``: the holder runs round after round inside one tick until it
  finishes, as ``ModelRunner._burst`` does.

Generated token ids are all ``TOKEN`` (the simulated requests have no EOS or stop
tokens, so they end at ``max_tokens``). ``elapsed_ms`` comes from the cost model.
"""

from __future__ import annotations

from speclane.request import Request
from speclane.scheduler.plan import RunnerResult, ScheduledSeq, SchedulerPlan, SeqResult
from speclane.sim.acceptance import AcceptanceSource
from speclane.sim.cost import CostModel

TOKEN = 1


class CostModelRunner:
    def __init__(self, cost: CostModel, acceptance: AcceptanceSource, max_model_len: int, num_draft_tokens: int):
        self.cost = cost
        self.acceptance = acceptance
        self.max_model_len = max_model_len
        # The real KV cache rows are max_model_len + K + 1 long (engine.py).
        self.cache_len = max_model_len + num_draft_tokens + 1

    def execute(self, plan: SchedulerPlan) -> RunnerResult:
        for rid in plan.released_request_ids:
            self.acceptance.release(rid)
        if plan.burst is not None:
            res, ms = self._burst(plan.burst)
            return RunnerResult(seqs=[res], elapsed_ms=ms)
        cost = self.cost
        decode = prefill = rows = 0
        seqs: list[SeqResult] = []
        for seq in plan.seqs:
            k = seq.num_draft_tokens
            fed_end = seq.start + len(seq.token_ids)
            if seq.start < seq.request.num_prompt_tokens:
                prefill += len(seq.token_ids)
            else:
                decode += len(seq.token_ids) + k
            if not seq.sample:  # a chunk in the middle of the prompt
                seqs.append(SeqResult(seq.request_id, [], fed_end))
            elif not k:  # a decode row, or the chunk that completes the prompt
                seqs.append(SeqResult(seq.request_id, [TOKEN], fed_end))
            else:  # a lane round: k drafts verified, the first `accepted` kept
                rows += 1
                accepted = self.acceptance.accepted(seq.request_id, k)
                seqs.append(SeqResult(seq.request_id, [TOKEN] * (accepted + 1), fed_end + accepted,
                                      True, k, accepted, 1))
        ms = cost.step_ms(decode_tokens=decode, prefill_tokens=prefill, verify_rows=rows)
        return RunnerResult(seqs=seqs, elapsed_ms=ms)

    def _burst(self, seq: ScheduledSeq) -> tuple[SeqResult, float]:
        """The whole rest of a generation in one tick (mirrors ``ModelRunner._burst``)."""
        request: Request = seq.request
        sp = request.sampling
        total = SeqResult(seq.request_id, num_computed_tokens=seq.start, spec_round=True)
        num_out = request.num_output_tokens
        prompt = request.num_prompt_tokens
        max_len = min(self.cache_len, prompt + sp.max_tokens)
        start, num_fed = seq.start, len(seq.token_ids)
        ms = 0.0
        while True:
            left = min(sp.max_tokens - num_out, max_len - (prompt + num_out))
            k = max(0, min(seq.num_draft_tokens, left - 1)) if seq.num_draft_tokens else 0
            accepted = self.acceptance.accepted(seq.request_id, k) if k else 0
            ms += self.cost.step_ms(decode_tokens=num_fed + k, verify_rows=int(k > 0))
            total.num_rounds += 1
            total.num_draft_tokens += k
            total.num_accepted_tokens += accepted
            total.token_ids.extend([TOKEN] * (accepted + 1))
            num_out += accepted + 1
            total.num_computed_tokens = start + num_fed + accepted
            if num_out >= sp.max_tokens or prompt + num_out >= max_len:
                return total, ms
            start, num_fed = total.num_computed_tokens, 1
