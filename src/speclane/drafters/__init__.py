"""Drafters propose tokens for the speculative lane; chosen by name (``--drafter``)."""

DRAFTER_NAMES = ("none", "ngram", "mtp")
