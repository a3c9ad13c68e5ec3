"""Grammar-constrained decoding: what a request may generate (``spec``), compiled once
per distinct grammar (``compiler``), and the per-request matcher the runner masks
logits with and drafts forced tokens from (``matcher``). The grammar engine is
llguidance; nothing outside this package imports it."""
