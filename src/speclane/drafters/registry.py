"""The drafter registry: a drafter by ``--drafter`` name.

Apart from ``base.py`` so that the contract stays a leaf the implementations import;
the implementations are imported here, by the registry alone. The names are
``config.DRAFTERS`` (config validates ``--drafter`` and imports nothing of speclane);
``BUILDERS`` covers exactly those names.
"""

from __future__ import annotations

from collections.abc import Callable

from speclane.config import DRAFTERS
from speclane.drafters.base import Drafter
from speclane.drafters.mtp import load_mtp_drafter
from speclane.drafters.ngram import NgramDrafter


def _ngram(**options: object) -> Drafter:
    return NgramDrafter()


# ``none`` builds no drafter (None); the others take the engine's options by keyword.
BUILDERS: dict[str, Callable[..., Drafter] | None] = {"none": None, "ngram": _ngram, "mtp": load_mtp_drafter}
if tuple(BUILDERS) != DRAFTERS:
    raise ImportError(f"config.DRAFTERS {DRAFTERS} and the registry {tuple(BUILDERS)} must name the same drafters")


def create_drafter(name: str, **options: object) -> Drafter | None:
    """A drafter by ``--drafter`` name (``none`` gives None)."""
    if name not in BUILDERS:
        raise ValueError(f"unknown drafter {name!r}; valid names: {', '.join(DRAFTERS)}")
    build = BUILDERS[name]
    return None if build is None else build(**options)
