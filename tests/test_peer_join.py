"""The join of a tool's requests with a server run, on hand-made numbers: id rules, the vLLM bench
prefix, the clock mapping's bounds, the labelling of chunks from the server's writes."""
from __future__ import annotations

from inferledger.collectors.peer_join import ServerAttempt, estimate, index_prefix, match, relabel_by_writes
from inferledger.collectors.peer_records import PeerRequest, seconds_to_ns


def req(sent, first_chunk, key="A"):
    return PeerRequest(key=key, where="f:1", key_rule="test", sent_ns=sent, chunks=[(first_chunk, ["content"])])


def srv(first, first_write, clock="mono:s"):
    return ServerAttempt("A", clock, first, first_write)


def test_ids_match_exactly_else_with_or_without_the_response_prefix():
    ids = {"a1", "chatcmpl-b2", "srv-c3"}
    assert match("a1", ids) == ("a1", "exact")
    assert match("b2", ids) == ("chatcmpl-b2", "with the chatcmpl- prefix")
    assert match("chatcmpl-srv-c3", ids) == ("srv-c3", "without the chatcmpl- prefix")
    assert match("zz", ids) == (None, "no server attempt has this id")


def test_the_vllm_bench_prefix_is_the_one_naming_most_indexes():
    ids = ["bench-1a2b3c4d-0", "bench-1a2b3c4d-1", "bench-1a2b3c4d-2", "srv-17", "x-40"]
    assert index_prefix(3, ids) == "bench-1a2b3c4d-"  # srv-17 and x-40 are past the 3 indexes
    assert index_prefix(3, ["srv-abc"]) is None


def test_the_mapping_is_the_middle_of_the_tightest_bounds():
    # t_server = t_tool + offset. Request 1: sent 100, server first event 1_150 -> offset <= 1_050;
    # first write 1_300, tool's first chunk 320 -> offset >= 980. Request 2: <= 2_500 - 1_480 = 1_020,
    # >= 2_600 - 1_610 = 990. Tightest: [990, 1_020] -> offset 1_005 ± 15.
    m = estimate([(req(100, 320), srv(1_150, 1_300)), (req(1_480, 1_610), srv(2_500, 2_600))], "wall:t")
    assert (m.lo_ns, m.hi_ns, m.offset_ns, m.epsilon_ns, m.n) == (990, 1_020, 1_005, 15, 2)
    assert (m.from_clock, m.to_clock, m.problem) == ("wall:t", "mono:s", None)


def test_contradicting_bounds_give_no_mapping():
    # the chunk arrived before the server wrote anything, by more than the send allows
    m = estimate([(req(100, 200), srv(1_000, 2_000))], "wall:t")
    assert m.offset_ns is None and m.epsilon_ns is None and "contradict" in m.problem
    assert estimate([], "wall:t") is None


def test_vllm_chunks_take_the_kinds_of_the_server_writes_when_the_counts_agree():
    r = PeerRequest(key="k", where="f:1", key_rule="t", sent_ns=0, chunks=[(10, None), (20, None), (30, None)])
    s = ServerAttempt("k", "mono:s", 5, 8, writes=[(8, ["role"]), (18, ["content"]), (28, ["finish"]),
                                                    (29, ["usage"]), (29, ["done"])])
    assert relabel_by_writes(r, s) and r.chunks == [(10, []), (20, ["content"]), (30, ["finish"])]
    short = PeerRequest(key="k", where="f:1", key_rule="t", sent_ns=0, chunks=[(10, None)])
    assert not relabel_by_writes(short, s) and short.chunks == [(10, None)]


def test_seconds_convert_exactly():
    # 1796115518.8662517 is the float 1796115518.8662517070770263671875 exactly: ...866 251 707.07 ns
    assert seconds_to_ns(1796115518.8662517) == 1_796_115_518_866_251_707
    assert seconds_to_ns(0.1) == 100_000_000
