"""The drafter registry: a drafter by ``--drafter`` name.

Apart from ``base.py`` so that the contract stays a leaf the implementations import;
the implementations are imported here, by the registry alone. The names are
``config.DRAFTERS`` (config validates ``--drafter`` and imports nothing of speclane);
``BUILDERS`` covers exactly those names. Every builder takes the engine's drafter options
by keyword (``model``, ``model_config``, ``mtp_head``, ``min_draft_prob``, ``lookup``,
``suffix_cache_tokens``, ``suffix_tree_branches``) and uses those it needs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from speclane.config import DRAFTERS
from speclane.drafters.auto import AutoDrafter
from speclane.drafters.base import Drafter
from speclane.drafters.mtp import default_head_path, load_mtp_drafter
from speclane.drafters.ngram import NgramDrafter
from speclane.drafters.suffix import DEFAULT_CACHE_TOKENS, SuffixDrafter
from speclane.drafters.suffix_index import SuffixParams
from speclane.models.mtp_store import MTPHeadError

log = logging.getLogger(__name__)


def _ngram(**options: object) -> Drafter:
    return NgramDrafter()


def _suffix(suffix_cache_tokens: int = DEFAULT_CACHE_TOKENS, suffix_tree_branches: int = 1,
            **options: object) -> SuffixDrafter:
    return SuffixDrafter(SuffixParams(max_branches=suffix_tree_branches), cache_tokens=suffix_cache_tokens)


def _mtp(model, model_config, mtp_head: str = "", lookup: bool = False, min_draft_prob: float = 0.0,
         **options: object) -> Drafter:
    return load_mtp_drafter(model, model_config, mtp_head, lookup=lookup, min_draft_prob=min_draft_prob)


def has_mtp_head(model_name: str, mtp_head: str = "") -> bool:
    """Whether ``--drafter mtp`` finds a head: ``--mtp-head``, else one shipped for the model."""
    return bool(mtp_head) or default_head_path(model_name).exists()


def _auto(model, model_config, mtp_head: str = "", min_draft_prob: float = 0.0,
          suffix_cache_tokens: int = DEFAULT_CACHE_TOKENS, suffix_tree_branches: int = 1, **options: object) -> Drafter:
    head = None
    if has_mtp_head(model_config.model, mtp_head):
        try:
            head = load_mtp_drafter(model, model_config, mtp_head, lookup=False, min_draft_prob=min_draft_prob)
        except MTPHeadError as exc:
            if mtp_head:  # a head the user named must load
                raise
            # The head shipped under the model's name does not fit these weights (another
            # model saved under that name): auto drafts without a head, and says so.
            log.warning("--drafter auto without an MTP head: %s", exc)
    return AutoDrafter(_suffix(suffix_cache_tokens, suffix_tree_branches), None, head)  # no lookup: auto.py says why


# ``none`` builds no drafter (None); the others take the engine's options by keyword.
BUILDERS: dict[str, Callable[..., Drafter] | None] = {
    "none": None, "ngram": _ngram, "suffix": _suffix, "mtp": _mtp, "auto": _auto}
if tuple(BUILDERS) != DRAFTERS:
    raise ImportError(f"config.DRAFTERS {DRAFTERS} and the registry {tuple(BUILDERS)} must name the same drafters")


def create_drafter(name: str, **options: object) -> Drafter | None:
    """A drafter by ``--drafter`` name (``none`` gives None)."""
    if name not in BUILDERS:
        raise ValueError(f"unknown drafter {name!r}; valid names: {', '.join(DRAFTERS)}")
    build = BUILDERS[name]
    return None if build is None else build(**options)
