"""The model and the paged runner: greedy equality with Hugging Face on the same GGUF, and paged /
chunked / batched execution equal to the plain contiguous forward."""
from __future__ import annotations

import random

import pytest
import torch

from inferledger.engine.model import full_sequence_logits
from inferledger.engine.runner import ModelRunner, RunnerOptions, SeqChunk

pytestmark = pytest.mark.slow

CHAT = ["What is the capital of France?", "Write a haiku about the sea.",
        "Explain recursion to a child in two sentences.", "List three prime numbers above 100."]
PLAIN = ["The history of the printing press", "def fibonacci(n):\n", "Once upon a time, in a village",
         "Les chats sont"]


def _blocks(runner, n_seqs, per_seq, seed=0):
    """Disjoint, shuffled (non-contiguous) block tables."""
    pool = list(range(runner.num_blocks))
    random.Random(seed).shuffle(pool)
    return [pool[i * per_seq:(i + 1) * per_seq] for i in range(n_seqs)]


def greedy_paged(runner, prompts: list[list[int]], n_new: int, tables) -> list[list[int]]:
    """All prompts prefilled in one step, then decoded together: n_new greedy tokens each, EOS ignored."""
    logits = runner.forward([SeqChunk(p, 0, t) for p, t in zip(prompts, tables)])
    outs = [[int(l.argmax())] for l in logits]
    for step in range(n_new - 1):
        chunks = [SeqChunk([o[-1]], len(p) + step, t) for p, o, t in zip(prompts, outs, tables)]
        for o, l in zip(outs, runner.forward(chunks)):
            o.append(int(l.argmax()))
    return outs


def _prompts(tok):
    chat = [tok.encode(tok.apply_chat_template([{"role": "user", "content": c}])) for c in CHAT]
    return chat + [tok.encode(p) for p in PLAIN]


def oracle_prompts(tok, hf_oracle) -> list[list[int]]:
    """The 8 prompts as our tokenizer builds them, checked equal to the ids the oracle was asked."""
    prompts = _prompts(tok)
    assert prompts == [p["ids"] for p in hf_oracle["prompts"]]
    return prompts


@pytest.mark.parametrize(("paged", "linear"), [(False, "torch"), (True, "kernels")], ids=["gather, torch", "paged, kernels"])
def test_greedy_matches_hugging_face(bundle, hf_oracle, paged, linear):
    """Our 32 greedy tokens for 8 prompts equal Hugging Face's (each token its argmax after the prompt and
    the tokens before it, recorded: tests/conftest.py `hf_oracle`). Torch's own kernels (the paged cache
    gathered, F.linear), and the engine's CPU kernels (attention in place, the fp32 gemv), here with decode
    batches of 1 row and of 7 (two groups of 4 and 3)."""
    tok = bundle.tokenizer
    prompts = oracle_prompts(tok, hf_oracle)
    if paged or linear == "kernels":
        from inferledger.engine import cpu_kernels

        assert cpu_kernels.load()[0], cpu_kernels.load()[1]
    runner = ModelRunner(bundle.model, bundle.config, num_blocks=64, block_size=16,
                         options=RunnerOptions(paged=paged, linear=linear))
    assert (runner.paged, runner.linear) == (paged, linear)
    tables, ours = _blocks(runner, len(prompts), 6), [None] * len(prompts)
    for group in [[0], [1, 2, 3, 4, 5, 6, 7]] if linear == "kernels" else [list(range(len(prompts)))]:
        got = greedy_paged(runner, [prompts[i] for i in group], 32, [tables[i] for i in group])
        for i, o in zip(group, got):
            ours[i] = o
    for prompt, got, hf in zip(prompts, ours, hf_oracle["greedy"]):
        assert got == hf, tok.decode(prompt)
    assert "Paris" in tok.decode(ours[0])
    # and what Hugging Face's generate() gave for one prompt (it stops at EOS; so do we, there)
    gen = hf_oracle["generate"]
    eos = bundle.config.eos_ids
    mine = ours[gen["prompt"]]
    cut = next((i + 1 for i, t in enumerate(mine) if t in eos), len(mine))
    assert gen["tokens"] == mine[:cut]


def test_full_sequence_logits_match_hugging_face(bundle, hf_oracle):
    """Every position's logits: Hugging Face's 32 largest, its logsumexp and its mean over the vocabulary
    (which every logit moves), each within 1e-3 of ours."""
    ref = hf_oracle["logits"]
    ids = oracle_prompts(bundle.tokenizer, hf_oracle)[ref["prompt"]]
    ours = full_sequence_logits(bundle.model, ids)
    assert ours.shape == (len(ids), bundle.config.shape.vocab)
    top = ours.gather(1, torch.tensor(ref["top_ids"]))
    assert torch.allclose(top, torch.tensor(ref["top_values"]), atol=1e-3, rtol=0)
    assert torch.allclose(torch.logsumexp(ours, -1), torch.tensor(ref["logsumexp"]), atol=1e-3, rtol=0)
    assert torch.allclose(ours.mean(-1), torch.tensor(ref["mean"]), atol=1e-3, rtol=0)


def test_paged_equals_contiguous(bundle):
    ids = _prompts(bundle.tokenizer)[2][:45]
    plain = full_sequence_logits(bundle.model, ids)
    results = []
    for table in (list(range(4)), [13, 2, 29, 7]):
        runner = ModelRunner(bundle.model, bundle.config, num_blocks=32, block_size=16)
        first = runner.forward([SeqChunk(ids[:20], 0, table, logits="all")])[0]
        rest = runner.forward([SeqChunk(ids[20:], 20, table, logits="all")])[0]  # gathers the paged prefix
        results.append(torch.cat([first, rest]))
    assert results[0].shape == plain.shape
    assert torch.allclose(results[0], plain, atol=1e-4, rtol=0)
    assert torch.allclose(results[1], results[0], atol=1e-5, rtol=0)


def test_chunked_prefill_equals_unchunked(bundle):
    ids = _prompts(bundle.tokenizer)[0]
    table = list(range(8))
    whole = ModelRunner(bundle.model, bundle.config, num_blocks=8)
    chunked = ModelRunner(bundle.model, bundle.config, num_blocks=8)
    last_whole = whole.forward([SeqChunk(ids, 0, table)])[0]
    for start in range(0, len(ids), 7):
        kind = "last" if start + 7 >= len(ids) else "none"
        out = chunked.forward([SeqChunk(ids[start:start + 7], start, table, logits=kind)])[0]
        assert (out is None) == (kind == "none")
    assert torch.allclose(out, last_whole, atol=1e-4, rtol=0)
    cont = []
    for runner, logits in ((whole, last_whole), (chunked, out)):
        toks = [int(logits.argmax())]
        for i in range(7):
            toks.append(int(runner.forward([SeqChunk([toks[-1]], len(ids) + i, table)])[0].argmax()))
        cont.append(toks)
    assert cont[0] == cont[1]


def test_mixed_batch_equals_single_sequences(bundle):
    """Prefill chunks and decodes of different sequences in one step give each sequence its own logits."""
    p = _prompts(bundle.tokenizer)
    a, b, c = p[4], p[5], p[0]
    runner = ModelRunner(bundle.model, bundle.config, num_blocks=32)
    ta, tb, tc = _blocks(runner, 3, 8, seed=3)
    runner.forward([SeqChunk(a[:-1], 0, ta, "none"), SeqChunk(b[:-1], 0, tb, "none")])
    # decode-only batch (padded batched attention path) ...
    la, lb = runner.forward([SeqChunk(a[-1:], len(a) - 1, ta), SeqChunk(b[-1:], len(b) - 1, tb)])
    assert torch.allclose(la, full_sequence_logits(bundle.model, a)[-1], atol=1e-4, rtol=0)
    assert torch.allclose(lb, full_sequence_logits(bundle.model, b)[-1], atol=1e-4, rtol=0)
    # ... and a mixed step: one decode beside a fresh prefill asking for every token's logits
    na = int(la.argmax())
    la2, lc = runner.forward([SeqChunk([na], len(a), ta), SeqChunk(c, 0, tc, "all")])
    assert torch.allclose(la2, full_sequence_logits(bundle.model, a + [na])[-1], atol=1e-4, rtol=0)
    assert lc.shape == (len(c), bundle.config.shape.vocab)
    assert torch.allclose(lc, full_sequence_logits(bundle.model, c), atol=1e-4, rtol=0)


def test_copy_block_forks_a_sequence(bundle):
    ids = _prompts(bundle.tokenizer)[3]          # > 16 tokens: the last block is partly filled
    bs = 16
    runner = ModelRunner(bundle.model, bundle.config, num_blocks=16, block_size=bs)
    n_full = len(ids) // bs
    table = list(range(n_full + 1))
    logits = runner.forward([SeqChunk(ids, 0, table)])[0]
    fork = table[:n_full] + [15]                  # share full blocks, copy the partial one
    runner.copy_block(table[n_full], 15)
    nxt = int(logits.argmax())
    # one at a time: two rows of one batch may round differently where the BLAS splits the rows
    # across threads (seen with 2 MKL threads on an AMD EPYC host), which is not what this tests
    a, = runner.forward([SeqChunk([nxt], len(ids), table)])
    b, = runner.forward([SeqChunk([nxt], len(ids), fork)])
    assert torch.equal(a, b)


def test_runner_rejects_bad_chunks_and_reports_kv_bytes(bundle):
    cfg = bundle.config
    runner = ModelRunner(bundle.model, cfg, num_blocks=4, block_size=16)
    assert runner.kv_bytes() == 4 * 16 * cfg.shape.at(torch.float32).kv_bytes_per_token
    with pytest.raises(ValueError, match="cannot hold"):
        runner.forward([SeqChunk(list(range(20)), 0, [0])])
    with pytest.raises(ValueError, match="outside"):
        runner.forward([SeqChunk([5], 0, [9])])
    assert runner.forward([]) == []


@pytest.mark.parametrize("paged", [False, True], ids=["gather", "paged"])
def test_padded_decode_buckets_equal_eager(bundle, paged):
    """The static, padded decode step that CUDA graphs capture (run eagerly on the CPU) gives the
    same logits as the unpadded path, for batches below a bucket and wider block tables; its padding
    rows (the scratch block, one position) are read in place as well as gathered."""
    if paged:
        from inferledger.engine import cpu_kernels

        assert cpu_kernels.load()[0], cpu_kernels.load()[1]
    p = _prompts(bundle.tokenizer)
    seqs = [p[0], p[4], p[6]]
    eager = ModelRunner(bundle.model, bundle.config, num_blocks=24, options=RunnerOptions(paged=paged))
    padded = ModelRunner(bundle.model, bundle.config, num_blocks=24,
                         options=RunnerOptions(graph_batch_sizes=(2, 4), paged=paged))
    assert padded.kv_bytes() == eager.kv_bytes() * 25 // 24  # plus the scratch block for padding rows
    tables = _blocks(eager, 3, 8, seed=5)
    results = []
    for runner in (eager, padded):
        runner.forward([SeqChunk(s[:-1], 0, t, "none") for s, t in zip(seqs, tables)])
        out = runner.forward([SeqChunk(s[-1:], len(s) - 1, t) for s, t in zip(seqs, tables)])
        results.append(torch.stack(out))
    assert padded.last_step == {"mode": "padded", "padded_batch": 4}
    assert eager.last_step == {"mode": "eager", "padded_batch": 3}
    assert torch.allclose(results[0], results[1], atol=1e-4, rtol=0)
    for s, logits in zip(seqs, results[1]):
        assert torch.allclose(logits, full_sequence_logits(bundle.model, s)[-1], atol=1e-4, rtol=0)


def test_a_step_of_single_tokens_returns_logits_shaped_as_each_chunk_asks(bundle):
    """A step whose chunks all hold one token (the decode path): "last" gives [vocab], "all" [1, vocab],
    "none" None, with the values of the same tokens stepped alone through the generic path."""
    tok = bundle.tokenizer
    runner = ModelRunner(bundle.model, bundle.config, num_blocks=16, block_size=16)
    a, b = tok.encode("The history of the printing press"), tok.encode("Les chats sont")
    runner.forward([SeqChunk(a[:-1], 0, [0, 1]), SeqChunk(b[:-1], 0, [2, 3])])
    out = runner.forward([SeqChunk([a[-1]], len(a) - 1, [0, 1], "last"),
                          SeqChunk([b[-1]], len(b) - 1, [2, 3], "all"), SeqChunk([5], 0, [4], "none")])
    V = bundle.config.shape.vocab
    assert out[0].shape == (V,) and out[1].shape == (1, V) and out[2] is None
    # the same positions again, one chunk of two tokens each (not the single-token path): the same logits
    ref = runner.forward([SeqChunk(a[-2:], len(a) - 2, [0, 1], "all"), SeqChunk(b[-2:], len(b) - 2, [2, 3], "all")])
    torch.testing.assert_close(out[0], ref[0][1], atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(out[1][0], ref[1][1], atol=1e-3, rtol=1e-3)
