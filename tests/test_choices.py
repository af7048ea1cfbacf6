"""n > 1 on the client side: a stream event names the choice it carries, so the ledger can keep choices apart."""
from __future__ import annotations

from inferledger.collectors.http_transport import chunk_from_event


def test_a_chunk_carries_the_index_of_its_one_choice():
    assert chunk_from_event({"choices": [{"index": 1, "delta": {"content": "hi"}}]}).choice == 1
    assert chunk_from_event({"choices": [{"index": 0, "text": "a"}]}).choice == 0
    assert chunk_from_event({"choices": [{"delta": {"content": "x"}}]}).choice == 0  # OpenAI's default index


def test_a_chunk_with_several_choices_or_none_names_no_choice():
    two = {"choices": [{"index": 0, "delta": {"content": "a"}}, {"index": 1, "delta": {"content": "b"}}]}
    assert chunk_from_event(two).choice is None
    assert chunk_from_event({"choices": [], "usage": {"completion_tokens": 3}}).choice is None
    assert chunk_from_event({"choices": [{"index": "1", "delta": {"content": "a"}}]}).choice is None
    assert chunk_from_event({"choices": [{"index": [1], "delta": {"content": "a"}}]}).choice is None
