"""The suffix drafter (``--drafter suffix``): drafts from the request's own text and its
tenant's recent outputs, with a length chosen by the estimated acceptance.

Three texts are searched (``suffix_index.py`` holds the structure, the matching and the
vote): the request's ``prediction`` (OpenAI Predicted Outputs), its own tokens (prompt
and output so far) and the outputs of its tenant's recently finished requests. The
occurrences of the context's longest matching suffix (exact; resynchronised after a
one-token divergence where ``SuffixParams.max_resync`` allows) vote on the continuation; a draft is as long as its estimated
probability stays above ``min_prob`` (never more than the ``k`` the runner asks for). The
draft's per-token probabilities ride on ``Draft.confidence`` for ``--drafter auto``. Where
the occurrences disagree on what comes next, the draft may be a tree of the likely
continuations (``SuffixParams.max_branches``), verified in one forward.

A tenant's store holds only that tenant's outputs: a draft built from another tenant's
text would leak it through acceptance timing (a request that speeds up where someone
else's answer continues its own). Each store keeps at most ``cache_tokens`` tokens; when
a finished output takes it past that, the oldest outputs are evicted (the index is rebuilt
from what stays, down to three quarters of the bound, so rebuilds are rare). At most
``max_tenants`` stores are kept; the one used least recently goes first.

Per request, the context's index grows by the tokens added since its last round; the
first round of a request indexes its whole prompt (~1 ms per 2,000 tokens here), a
one-off that reports itself (``Draft.seeded``) so adaptive K counts it as what a
request's first round costs, not as any round's.
Deterministic: drafts are one-hot, verified by exact match, so output is unchanged.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

from speclane import draft_tree
from speclane.drafters.base import Draft
from speclane.drafters.suffix_index import SuffixIndex, SuffixParams, alignments, vote
from speclane.request import Request, RequestStatus

DEFAULT_CACHE_TOKENS = 8192  # per tenant
DEFAULT_MAX_TENANTS = 64


@dataclass
class _RequestState:
    own: SuffixIndex = field(default_factory=SuffixIndex)
    prediction: SuffixIndex | None = None


class _TenantStore:
    def __init__(self, cache_tokens: int):
        self.cache_tokens = cache_tokens
        self.documents: list[list[int]] = []
        self.index = SuffixIndex()

    @property
    def num_tokens(self) -> int:
        return sum(len(d) for d in self.documents)

    def add(self, tokens: list[int]) -> None:
        tokens = tokens[-self.cache_tokens :]
        self.documents.append(tokens)
        if self.num_tokens <= self.cache_tokens:
            self.index.add_document(tokens)
            return
        keep = self.cache_tokens * 3 // 4
        total = self.num_tokens
        while len(self.documents) > 1 and total > keep:
            total -= len(self.documents.pop(0))
        self.index = SuffixIndex()
        for document in self.documents:
            self.index.add_document(document)


class SuffixDrafter:
    name = "suffix"
    needs_hidden_states = False

    def __init__(self, params: SuffixParams | None = None, *, cache_tokens: int = DEFAULT_CACHE_TOKENS,
                 max_tenants: int = DEFAULT_MAX_TENANTS):
        if cache_tokens < 0 or max_tenants < 1:
            raise ValueError(f"need cache_tokens >= 0 and max_tenants >= 1; got {cache_tokens}, {max_tenants}")
        self.params = params or SuffixParams()
        self.cache_tokens = cache_tokens  # 0: no tenant history, the request's own text only
        self.max_tenants = max_tenants
        self.states: dict[str, _RequestState] = {}
        self.tenants: OrderedDict[str, _TenantStore] = OrderedDict()

    def propose(self, request: Request, k: int, may_seed: bool = True) -> Draft:  # its state is cheap
        if k <= 0:
            return Draft([])
        started = time.perf_counter()
        state = self.states.get(request.request_id)
        seeding = state is None or len(state.own) > request.num_tokens
        if seeding:
            state = self.states[request.request_id] = _RequestState()
            if request.prediction_token_ids:
                state.prediction = SuffixIndex(request.prediction_token_ids)
        assert state is not None
        state.own.extend(request.tokens_between(len(state.own), request.num_tokens))
        indexed_ms = (time.perf_counter() - started) * 1000
        context = state.own.tokens
        params = self.params
        occurrences = alignments(state.prediction, context, params) if state.prediction is not None else []
        occurrences += alignments(state.own, context, params, own=True)
        store = self.tenants.get(request.tenant)
        if store is not None:
            self.tenants.move_to_end(request.tenant)
            occurrences += alignments(store.index, context, params)
        tokens, probs, parents = vote(occurrences, k, params)
        return Draft(tokens, confidence=tuple(probs), catch_up_ms=indexed_ms if seeding else 0.0, seeded=seeding,
                     parents=None if draft_tree.is_chain(parents) else tuple(parents))

    def finish(self, request: Request) -> None:
        """Keep the finished request's output in its tenant's store (module docstring); not a
        failed one's (its text is what went wrong, not what the tenant writes)."""
        if self.cache_tokens == 0 or not request.output_token_ids or request.status == RequestStatus.FINISHED_ERROR:
            return
        store = self.tenants.get(request.tenant)
        if store is None:
            store = self.tenants[request.tenant] = _TenantStore(self.cache_tokens)
            while len(self.tenants) > self.max_tenants:
                self.tenants.popitem(last=False)
        self.tenants.move_to_end(request.tenant)
        store.add(list(request.output_token_ids))

    def release(self, request_id: str) -> None:
        self.states.pop(request_id, None)

    def stored_tokens(self) -> dict[str, int]:
        """Tokens held per tenant (for tests and ``/metrics``-style checks)."""
        return {tenant: len(store.index) for tenant, store in self.tenants.items()}
