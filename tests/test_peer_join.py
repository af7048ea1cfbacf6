"""The join of a tool's requests with a server run, on hand-made numbers: id rules, the vLLM bench
prefix, the clock mapping's bounds, the labelling of chunks from the server's writes."""
from __future__ import annotations

from inferledger.collectors.peers.join import ServerAttempt, estimate, index_prefix, match, relabel_by_writes
from inferledger.collectors.peers.records import PeerRequest, seconds_to_ns


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
    assert index_prefix(3, ids)[0] == "bench-1a2b3c4d-"  # srv-17 and x-40 are past the 3 indexes
    assert index_prefix(3, ["srv-abc"])[0] is None


def test_only_ids_of_vllm_benchs_scheme_make_a_prefix():
    # another tool's server run: ids that merely end in a small number are not vLLM bench's
    foreign = ["srv-09b512a5152149c1b6f328f33cb94ea2", "srv-1fc0e6151f9f4216a9a901d27f2e6c93", "941a689e-...-cd83b3"]
    prefix, why = index_prefix(40, foreign)
    assert prefix is None and "bench-<8 hex>-<index>" in why
    assert index_prefix(40, ["bench-1a2b3c4d-7"])[0] == "bench-1a2b3c4d-"  # the default scheme, even for one
    assert index_prefix(40, ["bench-1a2b3c4-7"])[0] is None  # 7 hex digits: not the default
    # a prefix of the user's (--request-id-prefix) is taken only when it names every index
    assert index_prefix(4, [f"run7-{i}" for i in range(4)])[0] == "run7-"
    assert index_prefix(4, [f"run7-{i}" for i in range(3)])[0] is None


THREE = [(req(100, 320), srv(1_150, 1_300)), (req(1_480, 1_610), srv(2_500, 2_600)), (req(5_000, 5_100), srv(6_100, 6_120))]


def test_the_mapping_is_the_middle_of_the_tightest_bounds():
    # t_server = t_tool + offset. Request 1: sent 100, server first event 1_150 -> offset <= 1_050;
    # first write 1_300, tool's first chunk 320 -> offset >= 980. Request 2: <= 2_500 - 1_480 = 1_020,
    # >= 2_600 - 1_610 = 990. Request 3: <= 1_100, >= 1_020. Tightest: [1_020, 1_020] -> 1_020 ± 1 (the
    # smallest epsilon a bound can have).
    m = estimate(THREE, "wall:t")
    assert (m.lo_ns, m.hi_ns, m.offset_ns, m.epsilon_ns, m.n) == (1_020, 1_020, 1_020, 1, 3)
    m = estimate(THREE[:2] + [(req(5_000, 5_100), srv(6_100, 6_090))], "wall:t")  # request 3: >= 990
    assert (m.lo_ns, m.hi_ns, m.offset_ns, m.epsilon_ns, m.n) == (990, 1_020, 1_005, 15, 3)
    assert (m.from_clock, m.to_clock, m.problem) == ("wall:t", "mono:s", None)


def test_a_mapping_needs_three_joins():
    # two requests whose bounds agree ([990, 1_020]) are still no mapping: one or two agree by chance
    m = estimate(THREE[:2], "wall:t")
    assert m.offset_ns is None and m.epsilon_ns is None and m.n == 2
    assert m.problem == "only 2 joined request(s) on the server's clock: a mapping needs at least 3 whose bounds agree"


def test_contradicting_bounds_give_no_mapping():
    # the chunk arrived before the server wrote anything, by more than the send allows
    m = estimate(THREE[:2] + [(req(100, 200), srv(1_000, 2_000))], "wall:t")
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
