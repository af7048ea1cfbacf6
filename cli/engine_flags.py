"""The reference engine's knobs as command-line flags under vLLM's names, shared by `serve` and the
embedded `capture`: each maps to one EngineConfig field (engine/params.py), an unset flag leaves the
engine's own default. docs/CAPTURE.md "Engine flags" lists them beside vLLM's."""
from __future__ import annotations

import json
from dataclasses import fields
from typing import Optional

import typer

from inferledger.engine.params import EngineConfig

# one default for the batch limit everywhere (serve, capture, predict): the engine's own
MAX_NUM_SEQS = next(f.default for f in fields(EngineConfig) if f.name == "max_num_seqs")
PANEL = "Engine (vLLM's names)"
MAX_NUM_SEQS_HELP = "The engine's batch limit (sequences decoded together; vLLM's --max-num-seqs)."

# flag name -> the EngineConfig field it sets
FIELDS = {"--max-num-batched-tokens": "max_num_batched_tokens", "--enable-chunked-prefill": "chunked_prefill",
          "--long-prefill-token-threshold": "long_prefill_token_threshold",
          "--enable-prefix-caching": "enable_prefix_caching", "--block-size": "block_size",
          "--num-gpu-blocks-override": "num_blocks", "--max-model-len": "max_model_len",
          "--speculative-config": "speculative"}


def max_num_batched_tokens():
    return typer.Option(None, "--max-num-batched-tokens", rich_help_panel=PANEL, min=1, help="Tokens one engine step may take (prefill "
                        "chunks and decodes together; default 512).")


def enable_chunked_prefill():
    return typer.Option(None, "--enable-chunked-prefill/--no-enable-chunked-prefill", rich_help_panel=PANEL, help="Split long prompts "
                        "into chunks that share a step with decodes (default on).", show_default=False)


def long_prefill_token_threshold():
    return typer.Option(None, "--long-prefill-token-threshold", rich_help_panel=PANEL, min=1, help="The most prompt tokens one prefill "
                        "chunk takes in a step (needs chunked prefill; default: the step's remaining budget).")


def enable_prefix_caching():
    return typer.Option(None, "--enable-prefix-caching/--no-enable-prefix-caching", rich_help_panel=PANEL, help="Reuse the KV blocks of "
                        "a prompt prefix seen before (default on).", show_default=False)


def block_size():
    return typer.Option(None, "--block-size", rich_help_panel=PANEL, min=1, max=1024, help="Tokens per KV block (default 16).")


def num_gpu_blocks_override():
    return typer.Option(None, "--num-gpu-blocks-override", rich_help_panel=PANEL, min=1, help="The KV pool in blocks, on the CPU too "
                        "(default: as many blocks as 256 MiB holds).")


def max_model_len():
    return typer.Option(None, "--max-model-len", rich_help_panel=PANEL, min=1, help="The longest prompt + output the engine admits "
                        "(default: the model's context).")


def speculative_config():
    return typer.Option(None, "--speculative-config", rich_help_panel=PANEL, help="Speculative decoding as JSON, vLLM's n-gram form: "
                        "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 3, "
                        "\"prompt_lookup_min\": 1}' (the engine's prompt lookup; other methods are refused).")


# vLLM's n-gram keys -> SpeculativeConfig's
SPEC_KEYS = {"num_speculative_tokens": "k", "prompt_lookup_max": "ngram_max", "prompt_lookup_min": "ngram_min"}


def speculative(text: str) -> dict:
    """vLLM's --speculative-config JSON as the engine's SpeculativeConfig fields, or a BadParameter."""
    try:
        given = json.loads(text)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not JSON ({exc})", param_hint="--speculative-config") from None
    if not isinstance(given, dict):
        raise typer.BadParameter("a JSON object, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'",
                                 param_hint="--speculative-config")
    method = given.pop("method", None)
    if method not in ("ngram", "prompt_lookup"):
        raise typer.BadParameter(f"method {method!r}: the reference engine speculates by prompt lookup only "
                                 "(\"ngram\")", param_hint="--speculative-config")
    unknown = sorted(set(given) - set(SPEC_KEYS))
    if unknown:
        raise typer.BadParameter(f"unknown key(s) {', '.join(unknown)} (known: method, {', '.join(SPEC_KEYS)})",
                                 param_hint="--speculative-config")
    return {"method": "prompt_lookup", **{SPEC_KEYS[k]: v for k, v in given.items()}}


def engine_fields(**given) -> dict:
    """The EngineConfig fields the flags set (keyword: the field's name), the unset ones left out, checked
    by EngineConfig itself so a bad combination names its flag (exit 2)."""
    out = {k: v for k, v in given.items() if v is not None}
    if isinstance(out.get("speculative"), str):
        out["speculative"] = speculative(out["speculative"])
    try:
        EngineConfig(**out)
    except (ValueError, TypeError) as exc:
        flag = next((f for f, name in FIELDS.items() if name in str(exc)), "--max-num-seqs")
        raise typer.BadParameter(str(exc), param_hint=flag) from None
    return out
