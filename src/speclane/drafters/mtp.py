"""The MTP drafter: drafts from the target's own hidden states (``models/mtp_head.py``).

Per-request state lives here and survives between rounds:
- the head's KV cache of *true* entries (built from target hidden states);
- the target hidden states of positions computed since the last round (``observe_tick``
  is called after every forward with every request's rows, lane holder or not).

At a round, the drafter first catches up — one batched head call over the positions
verified (or decoded classically while the request waited) since its last round —
then drafts recursively. A request that waited longer than the head's attention
window is re-seeded from the last ``window`` positions. Speculative entries are
dropped after each round: the next round rebuilds them from the target's hidden states.

Prompt lookup first (``lookup``, on by default in the engine: ``--mtp-lookup``): where the
request's recent tokens appeared before (in its prompt, its output or its prediction),
the round proposes what followed them, as the n-gram drafter does, and the head is not
run; its pending positions wait for the next head round's catch-up. On held-out chat
about one round in five finds such a match (a third of the drafted rounds under adaptive
K), and those drafts are accepted more often than the head's (an answer repeating the
question's words, a list's recurring phrase).

Draft tokens are the head's argmax (deterministic: verification by exact match keeps
every request's output identical to classic decoding, seeded sampling included), or,
with ``sample_drafts``, samples from the head's distribution q with q passed to the
rejection rule. Drafting stops early when the head's confidence falls below
``min_draft_prob``: on hardware where each verified position costs, a doubtful
draft is not worth its row.

Where the head runs on our CPU kernels (an int4 target), a greedy round without a
confidence floor (the default) is one C call, catch-up and every draft
(``MTPHead.draft_greedy``, ``kernels/mtp_step.c``); otherwise each draft is a ``head.step``
(one C call each where it can, else torch ops): the same drafts either way.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from speclane.drafters.base import Draft, HiddenSpan
from speclane.drafters.ngram import NgramDrafter
from speclane.models.llama import LlamaModel
from speclane.models.mtp_head import MTPCache, MTPHead, StepOutput
from speclane.models.mtp_kernel_step import KernelCache, KernelHead, drafting_head
from speclane.request import Request

HEADS_DIR = Path(__file__).resolve().parent.parent / "heads"  # heads shipped with the package
DEFAULT_MIN_DRAFT_PROB = 0.0
# A tick whose every request kept at most this many rows (a decode row and its accepted
# drafts) leaves its hidden states shared by the requests' pending views; a tick with a
# longer span (a prompt chunk) is copied per request, so that a view does not keep the
# chunk alive for the window's ticks.
SHARED_SPAN_ROWS = 32


@dataclass
class _RequestState:
    cache: MTPCache | KernelCache | None = None
    # (first position, a tick's hidden states, first row, rows): the rows are views taken at catch-up
    pending: list[tuple[int, torch.Tensor, int, int]] = field(default_factory=list)
    pending_rows: int = 0


@dataclass
class DraftRun:
    token_ids: list[int]
    probs: torch.Tensor | None  # [n, draft_vocab] q of sampled drafts, else None
    catch_up_ms: float = 0.0  # of the round's drafting, the true entries' catch-up


@torch.inference_mode()
def draft_recursively(head: MTPHead | KernelHead, cache: MTPCache | KernelCache, start: torch.Tensor | StepOutput, last_position: int,
                      k: int, min_draft_prob: float = 0.0, temperature: float = 0.0,
                      generator: torch.Generator | None = None) -> DraftRun:
    """Draft up to ``k`` tokens after the true entry ``last_position``, from its block output
    (``start``: [1, H], or the step that made it, its draft logits included).

    Speculative entries are added to ``cache`` while drafting and removed at the end.
    """
    true_end = cache.end
    if true_end != last_position + 1:
        raise ValueError(f"drafting after position {last_position} from a cache ending at {true_end}")
    want_logits = temperature > 0 or min_draft_prob > 0  # else the argmax is enough
    step = start if isinstance(start, StepOutput) else head.logits_of(start)
    tokens: list[int] = []
    qs: list[torch.Tensor] = []
    for j in range(k):
        logits = step.logits
        q = None
        if temperature > 0:
            q = torch.softmax(logits / temperature, dim=-1)
            index = int(torch.multinomial(q, 1, generator=generator))
            qs.append(q)
        else:
            index = step.best  # the softmax's argmax, without the softmax
        if min_draft_prob > 0:
            confidence = float((q if q is not None else torch.softmax(logits, dim=-1))[index])
            if confidence < min_draft_prob:
                if qs:
                    qs.pop()
                break
        token = int(head.vocab_ids[index])
        tokens.append(token)
        if j + 1 < k:
            step = head.step(cache, step.out[-1:], [token], want_logits)
    cache.truncate(true_end)
    cache.keep_last(head.config.window)
    return DraftRun(tokens, torch.stack(qs) if qs else None)


def catch_up_and_draft(head: MTPHead | KernelHead, cache: MTPCache | KernelCache, hidden: torch.Tensor, tokens: Sequence[int], k: int,
                       min_draft_prob: float = 0.0, temperature: float = 0.0,
                       generator: torch.Generator | None = None) -> DraftRun:
    """One round's drafting: add the true entries for the positions ``cache.end ..`` whose
    target hidden states are ``hidden`` [n, H] (each paired with the token after it in
    ``tokens``, the request's tokens so far), then draft from the last of them."""
    started = time.perf_counter()
    first = cache.end
    last = first + hidden.shape[0] - 1
    next_tokens = list(tokens[first + 1 : last + 2])
    if temperature == 0 and min_draft_prob == 0:  # the whole round in one C call where it runs
        greedy = head.draft_greedy(cache, hidden, next_tokens, k)
        if greedy is not None:
            cache.keep_last(head.config.window)
            return DraftRun(greedy[0], None, greedy[1])
        step = head.step(cache, hidden, next_tokens, want_logits=False)
    else:
        step = head.step(cache, hidden, next_tokens)
    caught_up = time.perf_counter()
    run = draft_recursively(head, cache, step, last, k, min_draft_prob, temperature, generator)
    run.catch_up_ms = (caught_up - started) * 1000
    return run


class MTPDrafter:
    name = "mtp"
    needs_hidden_states = True

    def __init__(self, head: MTPHead | KernelHead, vocab_size: int, *, min_draft_prob: float = DEFAULT_MIN_DRAFT_PROB,
                 sample_drafts: bool = False, seed: int = 0, lookup: NgramDrafter | None = None):
        self.head = head
        self.lookup = lookup  # consulted before the head (module docstring); None: the head alone
        self.vocab_size = vocab_size
        self.min_draft_prob = min_draft_prob
        self.sample_drafts = sample_drafts
        self.generator = torch.Generator().manual_seed(seed)
        self.states: dict[str, _RequestState] = {}
        self.propose_seconds = 0.0  # drafting time (catch-up + recursive drafts), for benchmarks
        self.proposals = 0
        self.lookup_proposals = 0  # of the proposals, rounds drafted by prompt lookup
        self.window = head.config.window  # the head's attention window: positions kept to catch up on
        self.cheap_starts = lookup is not None  # a round that may not seed the head drafts by lookup

    def observe(self, request: Request, start: int, hidden: torch.Tensor) -> None:
        """One request's rows: ``observe_tick`` with one span (``hidden`` is not written again)."""
        self.observe_tick([(request, start, 0, hidden.shape[0])], hidden)

    def observe_tick(self, spans: Sequence[HiddenSpan], hidden: torch.Tensor) -> None:
        # Called after every forward with every request's rows, drafting or not: at 16
        # streams that draft nothing it is the drafter's whole cost of a tick, so a decode
        # tick's rows stay views of its tensor until the request's catch-up (the views of the
        # tick's requests keep what their copies would). A tick with a prompt chunk is
        # copied per request: a view would keep the chunk alive for the window's ticks.
        share = all(rows <= SHARED_SPAN_ROWS for _, _, _, rows in spans)
        window, states = self.window, self.states
        for request, start, row, rows in spans:
            if rows == 0 or not request.speculative:
                continue
            state = states.get(request.request_id)
            if state is None:
                state = states[request.request_id] = _RequestState()
            if rows > window:
                start, row, rows = start + rows - window, row + rows - window, window
            pending = state.pending
            if share:
                pending.append((start, hidden, row, rows))
            else:
                pending.append((start, hidden[row : row + rows].clone(), 0, rows))
            state.pending_rows += rows
            # A request that waits long keeps only the last `window` positions to catch up on.
            while state.pending_rows - pending[0][3] >= window:
                state.pending_rows -= pending.pop(0)[3]

    def propose(self, request: Request, k: int, may_seed: bool = True) -> Draft:
        started = time.perf_counter()
        try:
            return self._propose(request, k, may_seed)
        finally:
            self.propose_seconds += time.perf_counter() - started
            self.proposals += 1

    def needs_seed(self, request_id: str) -> bool:
        """The request's next head round would seed: run the head over its whole context
        (its first, or one after waiting past the window), not catch up on a few positions."""
        state = self.states.get(request_id)
        return state is None or _seeds(state)

    def _propose(self, request: Request, k: int, may_seed: bool) -> Draft:
        if k <= 0:
            return Draft([])
        if self.lookup is not None:
            found = self.lookup.propose(request, k)
            if found.token_ids:
                self.lookup_proposals += 1
                # catch_up_ms None: adaptive K's drafting cost is the head's; a lookup costs ~0.
                return Draft(found.token_ids, catch_up_ms=None)
        state = self.states.get(request.request_id)
        if state is None or not state.pending:
            return Draft([])
        seeding = _seeds(state)  # first round, or waited past the window
        if seeding and not may_seed:
            return Draft([])  # its positions wait for a round that may seed
        tokens = request.token_ids()
        last = len(tokens) - 2  # the last position the target has computed
        first = state.pending[0][0]
        hidden = torch.cat([tick[row : row + rows] for _, tick, row, rows in state.pending])
        state.pending, state.pending_rows = [], 0
        if first + hidden.shape[0] - 1 != last:
            state.cache = None  # out of step (should not happen): re-seed at the next round
            return Draft([])
        if seeding:
            state.cache = self.head.new_cache(first)
        sp = request.sampling
        temperature = sp.temperature if self.sample_drafts and not sp.greedy else 0.0
        run = catch_up_and_draft(self.head, state.cache, hidden, tokens, k, self.min_draft_prob, temperature, self.generator)
        # A seed's catch-up is the whole context, once: reported as such (seeded).
        if run.probs is None:
            return Draft(run.token_ids, catch_up_ms=run.catch_up_ms, seeded=seeding)
        full = torch.zeros(run.probs.shape[0], self.vocab_size)
        full[:, self.head.vocab_ids] = run.probs
        return Draft(run.token_ids, full, catch_up_ms=run.catch_up_ms, seeded=seeding)

    def finish(self, request: Request) -> None:  # learns nothing from finished requests
        return None

    def release(self, request_id: str) -> None:
        self.states.pop(request_id, None)


def _seeds(state: _RequestState) -> bool:
    """Its next head round seeds (a cache from the first pending position) rather than
    catching up: no cache yet, or the pending positions do not continue it."""
    return state.cache is None or bool(state.pending) and state.cache.end != state.pending[0][0]


def default_head_path(model_name: str) -> Path:
    return HEADS_DIR / Path(model_name).name.removesuffix(".gguf")


def load_mtp_drafter(model: LlamaModel, model_config, mtp_head: str = "", lookup: bool = False,
                     **options: object) -> MTPDrafter:
    """``--drafter mtp``: the head at ``--mtp-head``, else the one shipped for the model;
    prompt lookup before the head with ``lookup`` (``--mtp-lookup``, the engine's default)."""
    from speclane.models.mtp_store import MTPHeadError, load_head

    name = model_config.model
    path = Path(mtp_head) if mtp_head else default_head_path(name)
    if not mtp_head and not path.exists():
        raise MTPHeadError(
            f"no MTP head is shipped for model {name!r}; train one with "
            f"`speclane train-mtp --model {name} --out DIR` and pass --mtp-head DIR/mtp-head"
        )
    head = load_head(path, model, name)
    if model.quantization != "none":
        head = drafting_head(head, model.kernels)  # the target runs int4 kernels: so can its drafter
    return MTPDrafter(head, model.config.vocab_size, lookup=NgramDrafter() if lookup else None, **options)  # type: ignore[arg-type]
