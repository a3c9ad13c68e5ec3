"""The ``--api-keys`` file (JSON or TOML) and resolving a request's principal, without a model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speclane.server.auth import KeyTable, Principal, bearer_key, resolve_principal
from speclane.server.errors import APIError


def test_json_list_and_toml_table_forms(tmp_path: Path) -> None:
    as_json = tmp_path / "keys.json"
    as_json.write_text(json.dumps({"keys": [{"key": "k1", "tenant": "a", "weight": 2, "most_urgent_priority": -3}]}))
    as_toml = tmp_path / "keys.toml"
    as_toml.write_text('[keys.k1]\ntenant = "a"\nweight = 2\nmost_urgent_priority = -3\n')
    for path in (as_json, as_toml):
        table = KeyTable.load(path)
        assert table.lookup("k1") == Principal("a", 2.0, -3)
        assert table.lookup("k2") is None and len(table) == 1


def test_defaults_weight_1_and_no_jumping_ahead() -> None:
    principal = KeyTable.parse('{"keys": [{"key": "k", "tenant": "t"}]}').lookup("k")
    assert principal == Principal("t", 1.0, 0)
    principal.check_priority(0)
    principal.check_cache_scope("tenant")
    with pytest.raises(APIError) as not_shared:
        principal.check_cache_scope("global")
    assert not_shared.value.status == 403 and not_shared.value.code == "cache_scope_not_allowed"
    Principal("t", may_share_prefix_cache=True).check_cache_scope("global")
    with pytest.raises(APIError) as refused:
        principal.check_priority(-1)
    assert refused.value.status == 403


@pytest.mark.parametrize(("text", "words"), [
    ("{}", "'keys'"),
    ('{"keys": []}', "no keys"),
    ('{"keys": [{"key": "k"}]}', "tenant"),
    ('{"keys": [{"key": "", "tenant": "t"}]}', "'key'"),
    ('{"keys": [{"key": "k", "tenant": "t", "weight": 0}]}', "weight"),
    ('{"keys": [{"key": "k", "tenant": "t", "weight": true}]}', "weight"),
    ('{"keys": [{"key": "k", "tenant": "t", "most_urgent_priority": 1.5}]}', "most_urgent_priority"),
    ('{"keys": [{"key": "k", "tenant": "t", "role": "admin"}]}', "unknown field"),
    ('{"keys": [{"key": "k", "tenant": "t", "may_share_prefix_cache": "yes"}]}', "may_share_prefix_cache"),
    ('{"keys": [{"key": "k", "tenant": "t"}, {"key": "k", "tenant": "u"}]}', "twice"),
    ("not json = [", "neither valid JSON"),
])
def test_bad_key_files_say_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(ValueError) as caught:
        KeyTable.parse(text, source="keys.json")
    assert words in str(caught.value)


def test_missing_file_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read"):
        KeyTable.load(tmp_path / "absent.json")


def test_resolve_principal() -> None:
    table = KeyTable.parse('{"keys": {"sk-1": {"tenant": "acme"}}}')
    assert resolve_principal(table, "Bearer sk-1", user="mallory").tenant == "acme"
    assert resolve_principal(table, "bearer  sk-1 ").tenant == "acme"
    for header in (None, "", "Bearer", "Bearer sk-2", "Basic sk-1", "sk-1"):
        with pytest.raises(APIError) as caught:
            resolve_principal(table, header)
        assert caught.value.status == 401
    assert resolve_principal(None, None, user="bob") == Principal("bob", may_share_prefix_cache=True)
    assert resolve_principal(None, "Bearer whatever").tenant == "anonymous"
    assert bearer_key("Bearer  abc ") == "abc"
