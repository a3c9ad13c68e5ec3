"""Drafters propose tokens for the speculative lane; chosen by name (``--drafter``).

``base.py`` holds the contract every drafter implements; ``registry.py`` builds one by
name, and the names themselves are ``config.DRAFTERS``.
"""
