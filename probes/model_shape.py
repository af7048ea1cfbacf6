"""A decoder's shape and the bytes per element the engine reads (docs/MODEL.md "The shape").

The one type of a model's shape: the engine's loader builds it (inside its torch-side
`engine.config.ModelConfig`), a run manifest's `model` block records it (`architecture()` and
`from_architecture`, through `probes/run_folder.py`), and the cost model computes with it.
`from_hf_config` reads an HF `config.json` (a peer's model, declared), `from_gguf` a GGUF file's
header and tensor index (through probes/gguf_file.py, the one GGUF reader, by the rule
`from_gguf_metadata` the loader builds its shape by too). Weights count at the bytes of the dtype
the engine *computes* with (`dtype.weights` in the manifest): the loader dequantises a quantised checkpoint (GGUF Q4_1, ...) once at load, so each step
reads the dequantised tensors, not the file's blocks. Torch-free: every part may import it.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
               "int8": 1}


class ShapeError(ValueError):
    """The shape cannot be read: the message names the file or manifest field."""


# the engine's name for each field of the shape, as a manifest's model.architecture block spells it
ARCHITECTURE_KEYS = {"layers": "n_layers", "d_model": "d_model", "n_heads": "n_heads", "n_kv_heads": "n_kv_heads",
                     "head_dim": "head_dim", "ffn": "ffn_dim", "vocab": "vocab_size", "tied_embeddings": "tie_embeddings"}


# The shapes a transformer can have (docs/MODEL.md "The shape"): each count an integer within these
# bounds, the heads grouped evenly (n_kv_heads divides n_heads); a shape outside them is refused by key.
SHAPE_BOUNDS = {"layers": 4096, "d_model": 1 << 18, "n_heads": 4096, "n_kv_heads": 4096, "head_dim": 4096,
                "ffn": 1 << 20, "vocab": 1 << 24}
# the longest context a model may declare (positions): past it a config or model file is refused by key
MAX_CONTEXT = 1 << 24
MAX_CONFIG_BYTES = 16 << 20  # an HF config.json (a few KiB; a label map makes some longer)
# each field of the shape as an HF config.json spells it
HF_KEYS = {"layers": "num_hidden_layers", "d_model": "hidden_size", "n_heads": "num_attention_heads",
           "n_kv_heads": "num_key_value_heads", "head_dim": "head_dim", "ffn": "intermediate_size",
           "vocab": "vocab_size"}


def shape_problems(values: dict, names: dict | None = None) -> list[str]:
    """What makes these counts (by field name) a shape no transformer has, each naming its key as
    `names` spells it (default: the field's own name); empty when the shape can exist."""
    names = names or {}
    out = []
    for field, top in SHAPE_BOUNDS.items():
        v = values.get(field)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= top:
            out.append(f"{names.get(field, field)}: must be an integer in 1..{top}, not {v!r}")
    h, kv = values.get("n_heads"), values.get("n_kv_heads")
    if not out and h % kv:
        out.append(f"{names.get('n_kv_heads', 'n_kv_heads')}: {kv} does not divide "
                   f"{names.get('n_heads', 'n_heads')} = {h} (each KV head serves a whole group of query heads)")
    return out


def shape_differences(ours: dict, theirs: dict, whose: str) -> list[str]:
    """Where shape `theirs` (ModelShape.to_dict) differs from `ours`, field by field ('source' aside):
    'field THEIRS (WHOSE: OURS)', e.g. weight_bytes_per_param 4 (the run's: 2), a dtype's element size."""
    return [f"{k} {theirs.get(k)!r} ({whose}: {v!r})" for k, v in ours.items()
            if k != "source" and theirs.get(k) != v]


def dtype_bytes(name: str, where: str) -> int:
    key = str(name).removeprefix("torch.")
    if key not in DTYPE_BYTES:
        raise ShapeError(f"{where}: dtype {name!r} is not one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[key]


@dataclass(frozen=True)
class ModelShape:
    layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied_embeddings: bool
    weight_bytes_per_param: int  # bytes of one weight element as the engine reads it each step
    act_bytes: int               # bytes of one activation element
    kv_bytes: int                # bytes of one cached K or V element
    source: str = "declared"     # where the shape came from (manifest, a config.json path)

    def __post_init__(self) -> None:
        problems = shape_problems({f: getattr(self, f) for f in SHAPE_BOUNDS})
        if problems:
            raise ShapeError(f"{self.source}: a shape no transformer has: " + "; ".join(problems))

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """One layer's parameters: q, k, v, o, gate, up, down and its two RMSNorm weights."""
        d = self.d_model
        return d * self.q_dim + 2 * d * self.kv_dim + self.q_dim * d + 3 * d * self.ffn + 2 * d

    @property
    def params(self) -> int:
        """Every stored parameter: the layers, the final norm, the embedding and (untied) the LM head."""
        return self.layers * self.layer_params + self.d_model + self.vocab * self.d_model * (1 if self.tied_embeddings else 2)

    @property
    def weight_bytes(self) -> int:
        """Resident weight bytes at the engine's weight dtype."""
        return self.params * self.weight_bytes_per_param

    @property
    def kv_bytes_per_layer_token(self) -> int:
        """K and V of one token in one layer: the one rule for a token's KV bytes."""
        return 2 * self.kv_dim * self.kv_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token across all layers."""
        return self.layers * self.kv_bytes_per_layer_token

    def at(self, dtype) -> "ModelShape":
        """This shape with weights, activations and KV at `dtype` (a name, or a torch dtype)."""
        b = dtype_bytes(dtype, "dtype")
        return replace(self, weight_bytes_per_param=b, act_bytes=b, kv_bytes=b)

    def to_dict(self) -> dict:
        return asdict(self)

    def architecture(self) -> dict:
        """The shape's fields under the names a manifest's model.architecture block gives them."""
        return {key: getattr(self, name) for name, key in ARCHITECTURE_KEYS.items()}

    @classmethod
    def from_architecture(cls, arch: dict, dtype: dict, where: str) -> "ModelShape":
        """From a manifest's model.architecture and model.dtype blocks (as the engine recorded them);
        `where` names the file in messages."""
        keys = [k for k in ARCHITECTURE_KEYS.values() if k != "tie_embeddings"]
        missing = [k for k in keys if not isinstance(arch.get(k), int) or arch[k] <= 0]
        if missing:
            raise ShapeError(f"{where}: model.architecture lacks positive integers {', '.join(missing)}")
        for k in ("weights", "activations", "kv"):
            if not dtype.get(k):
                raise ShapeError(f"{where}: model.dtype.{k} is missing")
        return cls(**{name: arch[key] for name, key in ARCHITECTURE_KEYS.items() if key != "tie_embeddings"},
                   tied_embeddings=bool(arch.get("tie_embeddings")),
                   weight_bytes_per_param=dtype_bytes(dtype["weights"], f"{where} model.dtype.weights"),
                   act_bytes=dtype_bytes(dtype["activations"], f"{where} model.dtype.activations"),
                   kv_bytes=dtype_bytes(dtype["kv"], f"{where} model.dtype.kv"), source="manifest model block")

    @classmethod
    def from_declared(cls, entry: dict, where: str) -> "ModelShape":
        """From a shape a person declared (`declared_entry`, a manifest's `model_shape`)."""
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in entry.items() if k in known})
        except TypeError as exc:
            raise ShapeError(f"{where}: model_shape: {exc}") from None

    @classmethod
    def from_hf_config(cls, path, dtype: str | None = None) -> "ModelShape":
        """From a Hugging Face config.json (or the folder holding one); dtype defaults to its torch_dtype."""
        path, cfg = _hf_config(path)
        need = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
        missing = [k for k in need if not isinstance(cfg, dict) or isinstance(cfg.get(k), bool)
                   or not isinstance(cfg.get(k), int)]
        if missing:
            raise ShapeError(f"{path}: field(s) {', '.join(missing)} missing or not integers")
        heads, d = cfg["num_attention_heads"], cfg["hidden_size"]
        values = {field: cfg.get(key) for field, key in HF_KEYS.items()}
        if cfg.get("num_key_value_heads") is None:  # absent: one KV head per query head (multi-head attention)
            values["n_kv_heads"] = heads
        if cfg.get("head_dim") is None:  # absent: the hidden size split evenly over the heads
            if isinstance(heads, int) and heads > 0 and d % heads:
                raise ShapeError(f"{path}: num_attention_heads: {heads} does not divide hidden_size = {d} "
                                 f"(and no head_dim is given)")
            values["head_dim"] = d // heads if heads > 0 else None
        problems = shape_problems(values, HF_KEYS)
        if problems:
            raise ShapeError(f"{path}: a shape no transformer has: " + "; ".join(problems))
        tied = cfg.get("tie_word_embeddings", False)
        if not isinstance(tied, bool):
            raise ShapeError(f"{path}: tie_word_embeddings: must be true or false, not {tied!r}")
        hf_config_context(path)  # a context no model has is refused with the shape
        dt = dtype or cfg.get("torch_dtype") or cfg.get("dtype")
        if not dt:
            raise ShapeError(f"{path}: no torch_dtype; pass the dtype the model was served at")
        b = dtype_bytes(dt, f"{path} torch_dtype")
        return cls(*(values[f] for f in ("layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "ffn", "vocab")),
                   tied, b, b, b, source=f"hf config {path}")

    @classmethod
    def from_gguf(cls, path, dtype: str) -> "ModelShape":
        """From a GGUF file's header and tensor index (read by probes/gguf_file.py, the reader the
        engine's loader uses too; no tensor is read), at the dtype the engine computes in."""
        from .gguf_file import GGUFError, read_header

        try:
            header = read_header(path, index=True)
        except GGUFError as exc:
            raise ShapeError(str(exc)) from None
        return cls.from_gguf_metadata(header.metadata, [t[0] for t in header.index], dtype, path)

    @classmethod
    def from_gguf_metadata(cls, meta: dict, tensor_names, dtype, where) -> "ModelShape":
        """From a GGUF file's key-value header and its tensors' names (the llama-family keys:
        `<arch>.block_count`, `.embedding_length`, `.attention.head_count`, `.feed_forward_length`
        required; `.attention.head_count_kv` defaults to the heads, `.attention.key_length` to the
        width split over the heads, `.vocab_size` to the tokenizer's token count; tied when there is
        no `output.weight`), at `dtype`; the one rule both `from_gguf` and the engine's loader read a
        GGUF shape by. `where` (the file) names it in a ShapeError."""
        arch = meta.get("general.architecture")

        def key(name, default=None):
            full = f"{arch}.{name}"
            if full not in meta:
                if default is None:
                    raise ShapeError(f"{where}: required GGUF field {full!r} is missing")
                return default()
            value = meta[full]
            if isinstance(value, bool) or not isinstance(value, int):
                raise ShapeError(f"{where}: GGUF field {full!r} is {value!r}, not an integer")
            return value

        def tokens():
            if not isinstance(meta.get("tokenizer.ggml.tokens"), list):
                raise ShapeError(f"{where}: neither GGUF field {arch}.vocab_size nor tokenizer.ggml.tokens is there")
            return len(meta["tokenizer.ggml.tokens"])

        heads, d = key("attention.head_count"), key("embedding_length")
        b = dtype_bytes(dtype, "dtype")
        return cls(layers=key("block_count"), d_model=d, n_heads=heads,
                   n_kv_heads=key("attention.head_count_kv", lambda: heads),
                   head_dim=key("attention.key_length", lambda: d // heads if heads > 0 else 0),
                   ffn=key("feed_forward_length"), vocab=key("vocab_size", tokens),
                   tied_embeddings="output.weight" not in set(tensor_names), weight_bytes_per_param=b,
                   act_bytes=b, kv_bytes=b, source=f"gguf {where}")

    def declared_entry(self) -> dict:
        """What a run's manifest records as `model_shape` when a person declares the served model."""
        return {**self.to_dict(), "evidence": "declared"}


def _hf_config(path) -> tuple[Path, object]:
    """The config.json at `path` (or in the folder `path`) and its model's part (a `text_config` inside)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        size = path.stat().st_size
        data = path.read_bytes() if size <= MAX_CONFIG_BYTES else None
    except OSError as exc:
        raise ShapeError(f"{path}: cannot read ({exc.strerror})") from None
    if data is None:
        raise ShapeError(f"{path}: {size} bytes: a config.json is at most {MAX_CONFIG_BYTES} bytes")
    try:
        cfg = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ShapeError(f"{path}: not valid JSON ({str(exc)[:200] or 'nested too deeply'})") from None
    return path, cfg.get("text_config", cfg) if isinstance(cfg, dict) else cfg


def hf_config_context(path) -> int | None:
    """The context an HF config.json declares (`max_position_embeddings`; None when it declares none),
    a ShapeError naming the key when it is no context a model has (an integer in 1..MAX_CONTEXT)."""
    path, cfg = _hf_config(path)
    value = cfg.get("max_position_embeddings") if isinstance(cfg, dict) else None
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONTEXT):
        raise ShapeError(f"{path}: max_position_embeddings: must be an integer in 1..{MAX_CONTEXT}, not {value!r}")
    return value
