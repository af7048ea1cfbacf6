"""Tokenizer and chat template from the GGUF, checked against Hugging Face's tokenizer on the same file."""
from __future__ import annotations

import hashlib
import unicodedata

import pytest

from inferledger.engine.tokenizer import DetokState

pytestmark = pytest.mark.slow

# no numeral follows whitespace in these: here llama.cpp's pre-split and HF's GGUF tokenizer agree
SAME_AS_HF = [
    "Hello world", "  two  spaces   ", "\ttab\tand\nnewline\r\n", "", " ", "a", "x=12345;",
    "version 3.14.159", "it's I'll we've THEY'RE", "héllo wörld, ça va? ß ﬁ", "日本語のテキスト", "Привет, мир!",
    "emoji 🙂👍🏽 family 👨‍👩‍👧", "def f(x):\n    return x**2\n", "<|im_start|>user\nhi<|im_end|>\n",
    "text<|im_end|>more<|endoftext|>", "<notspecial> <|im_start", "URL: https://example.com/a?b=c&d=e",
    "\u200bzero\u00a0width", "🙂" * 5,
]
# a numeral after whitespace: SmolLM2 isolates each numeral before BPE (llama.cpp "smollm", and the
# model's original tokenizer.json), so "  1" is "ĠĠ" "1"; HF's GGUF loader skips that split here
DIGIT_ISOLATED = ["  1", "\n 1", "x  12 ", "\n\n 2024-01-01", "½ ² ٣", "a 1 b  22 c   333"]


def _llama_cpp_split(text: str) -> list[str]:
    """llama.cpp's first split for "smollm": every \\p{N} character is a piece of its own."""
    pieces, current = [], ""
    for ch in text:
        if unicodedata.category(ch).startswith("N"):
            pieces += [current, ch] if current else [ch]
            current = ""
        else:
            current += ch
    return pieces + ([current] if current else [])


def test_ids_equal_hugging_face(bundle, hf_tokenizer):
    tok = bundle.tokenizer
    for text in SAME_AS_HF:
        assert tok.encode(text) == hf_tokenizer.encode(text, add_special_tokens=False), repr(text)
        assert tok.encode(text, add_special=True) == hf_tokenizer.encode(text, add_special_tokens=True)


def test_numerals_are_split_as_llama_cpp_splits_them(bundle, hf_tokenizer):
    tok = bundle.tokenizer
    for text in SAME_AS_HF + DIGIT_ISOLATED:
        expected = [i for piece in _llama_cpp_split(text) for i in hf_tokenizer.encode(piece, add_special_tokens=False)]
        assert tok.encode(text) == expected, repr(text)
    assert tok.encode("  1") == [tok.backend.token_to_id("ĠĠ"), tok.backend.token_to_id("1")]


def test_decode_round_trips(bundle):
    tok = bundle.tokenizer
    for text in SAME_AS_HF + DIGIT_ISOLATED:
        assert tok.decode(tok.encode(text), skip_special=False) == text
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == tok.bos_id and ids[-1] in tok.eos_ids
    assert tok.decode(ids) == "user\nhi"


def test_streaming_detokenisation_never_splits_a_character(bundle):
    tok = bundle.tokenizer
    for text in ["emoji 🙂👍🏽 family 👨‍👩‍👧 done", "日本語のテキスト", "héllo wörld ½", "plain ascii text"]:
        ids = tok.encode(text)
        state = DetokState(tok)
        deltas = [state.add(i) for i in ids]
        deltas.append(state.flush())
        assert "".join(deltas) == text
        assert not any("\ufffd" in d for d in deltas)
    state = DetokState(tok)                   # a truncated character is only released by flush()
    assert state.add(tok.encode("🙂")[:1]) == ""
    assert state.flush() == "\ufffd"


CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "ç 🙂"}],
]


def test_chat_template_equals_hugging_face(bundle, hf_tokenizer):
    tok = bundle.tokenizer
    for messages in CONVERSATIONS:
        for gen in (True, False):
            ours = tok.apply_chat_template(messages, add_generation_prompt=gen)
            assert ours == hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
    text = tok.apply_chat_template(CONVERSATIONS[0])
    assert text.endswith("<|im_start|>assistant\n")
    assert tok.encode(text) == hf_tokenizer.encode(text, add_special_tokens=False)


def test_special_tokens_and_hashes(bundle):
    tok = bundle.tokenizer
    assert (tok.bos_token, tok.bos_id, tok.eos_tokens, tok.eos_ids) == ("<|im_start|>", 1, ["<|im_end|>"], [2])
    assert tok.vocab_size == bundle.config.shape.vocab == 49152
    assert tok.template_sha256 == hashlib.sha256(tok.chat_template.encode()).hexdigest()
    assert len(tok.hash) == 64 and int(tok.hash, 16) >= 0
