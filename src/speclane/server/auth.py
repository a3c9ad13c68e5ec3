"""API keys (``--api-keys FILE``) and who a request is for: its tenant, weight and allowance.

The file is JSON or TOML and lists keys, each with a tenant, a weight (its share of the
lane and of the KV pool relative to other tenants), the most urgent priority it may ask
for (lower is more urgent; default 0, so a key may not jump ahead unless the file says
so) and whether it may send ``cache_scope: "global"`` (``may_share_prefix_cache``,
default false)::

    # keys.toml                                  // keys.json
    [[keys]]                                     {"keys": [
    key = "sk-acme-1"                              {"key": "sk-acme-1", "tenant": "acme",
    tenant = "acme"                                 "weight": 2.0, "most_urgent_priority": -10}
    weight = 2.0                                   "may_share_prefix_cache": true}
    most_urgent_priority = -10                   ]}
    may_share_prefix_cache = true

``keys`` may also be a table keyed by the key (``[keys."sk-acme-1"]``). With keys, a
missing or unknown bearer key is 401, a priority beyond the key's allowance 403, so is
``cache_scope: "global"`` from a key not allowed it, and the tenant comes from the key,
never from the body. Without keys the tenant is the ``user`` field, else ``anonymous``,
and any request may use the global scope. Keys are kept only as SHA-256 digests.

Why the global scope needs permission: a prefix cache shared by tenants is a timing side
channel (a tenant that sees a fast first token learns another tenant sent that prefix),
so by default a request reads only blocks its own tenant wrote. Blocks written under the
global scope (a shared system prompt) are readable by every request that asks for it;
only the operator's chosen keys may write or read them.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speclane.server.errors import APIError

ANONYMOUS = "anonymous"
_CHALLENGE = {"WWW-Authenticate": "Bearer"}
_ENTRY_FIELDS = {"key", "tenant", "weight", "most_urgent_priority", "may_share_prefix_cache"}


@dataclass(frozen=True)
class Principal:
    """Who a request is done for."""

    tenant: str
    weight: float = 1.0
    most_urgent_priority: int | None = None  # None: any priority
    may_share_prefix_cache: bool = False  # may send cache_scope "global"

    def check_priority(self, priority: int) -> None:
        if self.most_urgent_priority is not None and priority < self.most_urgent_priority:
            raise APIError(
                403,
                f"this API key may ask for priority {self.most_urgent_priority} or higher (lower is more "
                f"urgent); the request asked for {priority}",
                param="priority", code="priority_not_allowed",
            )

    def check_cache_scope(self, scope: str) -> None:
        if scope == "global" and not self.may_share_prefix_cache:
            raise APIError(403, "this API key may not use the global prefix cache scope: omit cache_scope or "
                                "send \"tenant\" (the operator grants it with may_share_prefix_cache)",
                           param="cache_scope", code="cache_scope_not_allowed")


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


class KeyTable:
    """Bearer key -> Principal."""

    def __init__(self, principals: Mapping[str, Principal]) -> None:
        if not principals:
            raise ValueError("the API key file lists no keys")
        self._by_digest = {_digest(key): p for key, p in principals.items()}

    def __len__(self) -> int:
        return len(self._by_digest)

    def lookup(self, key: str) -> Principal | None:
        return self._by_digest.get(_digest(key))

    @classmethod
    def load(cls, path: str | Path) -> KeyTable:
        """Read a JSON or TOML key file; ``ValueError`` names what is wrong and where."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"cannot read the API key file {path}: {exc.strerror or exc}") from None
        return cls.parse(text, source=str(path))

    @classmethod
    def parse(cls, text: str, *, source: str = "<keys>") -> KeyTable:
        data = _decode(text, source)
        raw = data.get("keys") if isinstance(data, dict) else None
        if isinstance(raw, dict):
            entries = [{"key": key, **(value if isinstance(value, dict) else {"tenant": value})}
                       for key, value in raw.items()]
        elif isinstance(raw, list):
            entries = raw
        else:
            raise ValueError(f"{source}: expected a top-level 'keys' list (or table) of API keys")
        principals: dict[str, Principal] = {}
        for index, entry in enumerate(entries):
            key, principal = _entry(entry, f"{source}: keys[{index}]")
            if key in principals:
                raise ValueError(f"{source}: keys[{index}]: the same key is listed twice")
            principals[key] = principal
        return cls(principals)


def _decode(text: str, source: str) -> Any:
    if source.lower().endswith(".toml"):
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{source}: not valid TOML: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as json_exc:
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            raise ValueError(f"{source}: neither valid JSON ({json_exc}) nor valid TOML") from None


def _entry(entry: Any, where: str) -> tuple[str, Principal]:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected a table with key, tenant, weight, most_urgent_priority, "
                         "may_share_prefix_cache")
    unknown = set(entry) - _ENTRY_FIELDS
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: {sorted(_ENTRY_FIELDS)}")
    key, tenant = entry.get("key"), entry.get("tenant")
    if not isinstance(key, str) or not key.strip():
        raise ValueError(f"{where}: 'key' must be a non-empty string")
    if not isinstance(tenant, str) or not tenant:
        raise ValueError(f"{where}: 'tenant' must be a non-empty string")
    weight = entry.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight < float("inf"):
        raise ValueError(f"{where}: 'weight' must be a number > 0; got {weight!r}")
    most_urgent = entry.get("most_urgent_priority", 0)
    if isinstance(most_urgent, bool) or not isinstance(most_urgent, int):
        raise ValueError(f"{where}: 'most_urgent_priority' must be an integer; got {most_urgent!r}")
    share = entry.get("may_share_prefix_cache", False)
    if not isinstance(share, bool):
        raise ValueError(f"{where}: 'may_share_prefix_cache' must be true or false; got {share!r}")
    return key, Principal(tenant=tenant, weight=float(weight), most_urgent_priority=most_urgent,
                          may_share_prefix_cache=share)


def bearer_key(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def resolve_principal(keys: KeyTable | None, authorization: str | None, user: str | None = None) -> Principal:
    """The request's principal; 401 with keys configured and no valid bearer key."""
    if keys is None:
        return Principal(tenant=user or ANONYMOUS, may_share_prefix_cache=True)
    key = bearer_key(authorization)
    if key is None:
        raise APIError(401, "missing API key: send the header 'Authorization: Bearer <key>'", headers=_CHALLENGE)
    principal = keys.lookup(key)
    if principal is None:
        raise APIError(401, "unknown API key: check the key you were given", headers=_CHALLENGE)
    return principal
