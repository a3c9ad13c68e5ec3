"""The simulator's runner: a ``SchedulerPlan`` in, a ``RunnerResult`` out, no model.

It answers each sequence of the plan as ``engine/runner.py`` does, so the real scheduler
cannot tell the difference:

- a prefill chunk: every fed token lands in the cache; a token is sampled only when the
  chunk completes the prompt;
- a decode row: one new token;
- a lane holder's row (``num_draft_tokens = k > 0``): the drafter proposes k tokens, the
  acceptance source says how many lead the verification (a), and the row returns a + 1
  tokens (the accepted drafts and the target's own next token); its proposal is timed
  at 0 ms (the cost model's tick time holds drafting).

Generated token ids are all ``TOKEN`` (the simulated requests have no EOS or stop
tokens, so they end at ``max_tokens``). ``elapsed_ms`` comes from the cost model.
"""

from __future__ import annotations

from speclane.scheduler.plan import RunnerResult, SchedulerPlan, SeqResult
from speclane.sim.acceptance import AcceptanceSource
from speclane.sim.cost import CostModel

TOKEN = 1


class CostModelRunner:
    def __init__(self, cost: CostModel, acceptance: AcceptanceSource):
        self.cost = cost
        self.acceptance = acceptance

    def execute(self, plan: SchedulerPlan) -> RunnerResult:
        for rid in plan.released_request_ids:
            self.acceptance.release(rid)
        seqs: list[SeqResult] = []
        timings: list[tuple[str, float, int, float | None]] = []
        for seq in plan.seqs:
            k = seq.num_draft_tokens
            if not seq.sample:  # a chunk in the middle of the prompt
                seqs.append(SeqResult(seq.request_id))
            elif not k:  # a decode row, or the chunk that completes the prompt
                seqs.append(SeqResult(seq.request_id, (TOKEN,)))
            else:  # a lane round: k drafts verified, the first `accepted` kept
                accepted = self.acceptance.accepted(seq.request_id, k)
                seqs.append(SeqResult(seq.request_id, (TOKEN,) * (accepted + 1), k))
                timings.append((seq.request_id, 0.0, k, 0.0))
        return RunnerResult(seqs=tuple(seqs), elapsed_ms=self.cost.tick_ms(plan), draft_timings=tuple(timings))
