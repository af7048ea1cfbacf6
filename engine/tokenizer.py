"""Tokenizer and chat template, taken from the checkpoint itself (GGUF metadata or a HF folder).

Byte-level BPE is built with the `tokenizers` library. For GGUF files the text is split before BPE the
way llama.cpp splits it for the file's `tokenizer.ggml.pre` (e.g. "smollm" isolates every digit
first, as SmolLM2's original tokenizer.json does). The chat template is rendered with jinja2 in a
sandbox, as Hugging Face renders it.
"""
from __future__ import annotations

import hashlib
import json
from datetime import datetime
from pathlib import Path

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as _Backend

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# llama.cpp pre-tokenizer names whose first split isolates each digit before the GPT-2 split
_DIGIT_FIRST = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
_REGEX_SPLIT = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT,
                "dbrx": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT}
_CONTROL, _USER_DEFINED = 3, 4  # GGUF token types


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map, in which byte-level vocabularies are spelled."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra = (b for b in range(256) if b not in keep)
    mapping = {b: chr(b) for b in keep}
    mapping.update({b: chr(256 + i) for i, b in enumerate(extra)})
    return mapping


def _pre_tokenizer(pre: str | None):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGIT_FIRST:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in _REGEX_SPLIT:
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_REGEX_SPLIT[pre]), behavior="isolated"),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return byte_level  # "gpt2", "default" and unknown names: GPT-2's own split


class Tokenizer:
    """Text <-> token ids, special tokens and the chat template of one checkpoint."""

    def __init__(self, backend: _Backend, *, bos_id: int | None, eos_ids: list[int],
                 chat_template: str | None, pre_tokenizer: str | None = None):
        self.backend = backend
        self.bos_id, self.eos_ids = bos_id, list(eos_ids)
        self.bos_token = backend.id_to_token(bos_id) if bos_id is not None else None
        self.eos_tokens = [backend.id_to_token(i) for i in self.eos_ids]
        self.chat_template = chat_template
        self.pre_tokenizer = pre_tokenizer
        self.hash = _vocab_merges_hash(backend)  # sha256 of the vocabulary in id order + merges
        self.template_sha256 = hashlib.sha256(chat_template.encode()).hexdigest() if chat_template else None
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_gguf_metadata(cls, meta: dict) -> "Tokenizer":
        """From GGUF `tokenizer.*` keys (already decoded to Python values). Byte-level BPE only."""
        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"tokenizer.ggml.model is {kind!r}; only byte-level BPE ('gpt2') is supported")
        tokens, merges = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.merges"]
        types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        alphabet = _byte_alphabet()
        spelled = set(alphabet.values())
        vocab = {(t if set(t) <= spelled else "".join(alphabet[b] for b in t.encode())): i
                 for i, t in enumerate(tokens)}
        backend = _Backend(models.BPE(vocab, [tuple(m.split(" ", 1)) for m in merges], fuse_unk=False))
        pre = meta.get("tokenizer.ggml.pre")
        backend.pre_tokenizer = _pre_tokenizer(pre)
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t, ty in zip(tokens, types) if ty == _CONTROL and set(t) <= spelled])
        backend.add_tokens([AddedToken(t, special=False, normalized=False)
                            for t, ty in zip(tokens, types) if ty == _USER_DEFINED])
        bos = meta.get("tokenizer.ggml.bos_token_id")
        eos = meta.get("tokenizer.ggml.eos_token_id")
        if meta.get("tokenizer.ggml.add_bos_token") and bos is not None:
            backend.post_processor = processors.TemplateProcessing(
                single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B", special_tokens=[(tokens[bos], bos)])
        return cls(backend, bos_id=bos, eos_ids=[eos] if eos is not None else [],
                   chat_template=meta.get("tokenizer.chat_template"), pre_tokenizer=pre)

    @classmethod
    def from_hf_dir(cls, folder: str | Path, eos_ids: list[int] | None = None) -> "Tokenizer":
        """From tokenizer.json (+ tokenizer_config.json / chat_template.jinja) in a HF folder."""
        folder = Path(folder)
        backend = _Backend.from_file(str(folder / "tokenizer.json"))
        cfg_path = folder / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        template = cfg.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            template = next((t["template"] for t in template if t.get("name") == "default"), template[0]["template"])
        if template is None and (folder / "chat_template.jinja").exists():
            template = (folder / "chat_template.jinja").read_text()
        tok_id = lambda name: backend.token_to_id(_token_text(cfg.get(name))) if cfg.get(name) else None
        eos = list(eos_ids or [])
        if tok_id("eos_token") is not None and tok_id("eos_token") not in eos:
            eos.insert(0, tok_id("eos_token"))
        return cls(backend, bos_id=tok_id("bos_token"), eos_ids=eos, chat_template=template, pre_tokenizer=None)

    def save_hf(self, folder: str | Path) -> None:
        """Write tokenizer.json and tokenizer_config.json (with the chat template) into folder."""
        folder = Path(folder)
        self.backend.save(str(folder / "tokenizer.json"))
        cfg = {"bos_token": self.bos_token, "eos_token": self.eos_tokens[0] if self.eos_tokens else None,
               "chat_template": self.chat_template}
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=1))

    # ---- text <-> ids -------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = False) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special).ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        if not self.chat_template:
            raise ValueError("this checkpoint carries no chat template; send a plain completion instead")
        return _compile(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_tokens[0] if self.eos_tokens else "", **extra)


class DetokState:
    """Incremental detokenisation for streaming: `add(ids)` returns the text that became final.

    Decodes a short window of recent tokens and holds back output that ends in an incomplete UTF-8
    sequence (decoded as U+FFFD), so a character split over several byte tokens is emitted whole.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True):
        self.tokenizer, self.skip_special = tokenizer, skip_special
        self.ids: list[int] = []
        self.prefix_offset = 0  # window start: decoded for context only
        self.read_offset = 0    # tokens before this are already emitted

    def _decode(self, ids):
        return self.tokenizer.decode(ids, skip_special=self.skip_special)

    def add(self, token_ids: list[int] | int) -> str:
        self.ids.extend([token_ids] if isinstance(token_ids, int) else token_ids)
        text = self._decode(self.ids[self.prefix_offset:])
        if text.endswith("\ufffd"):
            return ""  # wait for the rest of the character
        done = self._decode(self.ids[self.prefix_offset:self.read_offset])
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return text[len(done):]

    def flush(self) -> str:
        """Whatever is still held back (e.g. a truncated character at the end of generation)."""
        text = self._decode(self.ids[self.prefix_offset:])
        done = self._decode(self.ids[self.prefix_offset:self.read_offset])
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(done):]


def _token_text(tok) -> str:
    return tok["content"] if isinstance(tok, dict) else tok


def _vocab_merges_hash(backend: _Backend) -> str:
    model = json.loads(backend.to_str())["model"]
    vocab = sorted(backend.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return hashlib.sha256(json.dumps([[t for t, _ in vocab], merges], ensure_ascii=False).encode()).hexdigest()


def _raise(message):
    raise ValueError(f"chat template: {message}")


_templates: dict[str, object] = {}


def _compile(source: str):
    # compiled templates are pure functions of their source text, so caching them is safe
    if source not in _templates:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, ensure_ascii=False, indent=indent)
        env.globals.update(raise_exception=_raise, strftime_now=lambda fmt: datetime.now().strftime(fmt))
        _templates[source] = env.from_string(source)
    return _templates[source]
