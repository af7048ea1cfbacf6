"""Loading: clear errors on bad input, HF-folder round trips against transformers, run identity."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

from inferledger.engine.loader import DeviceUnavailableError, ModelLoadError, default_model_path, load_model
from inferledger.engine.model import full_sequence_logits
from inferledger.engine.runner import ModelRunner, SeqChunk


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelLoadError, match="nope.gguf"):
        load_model(missing)


def test_a_device_torch_cannot_use_is_refused_by_name():
    past_last = f"cuda:{torch.cuda.device_count()}"  # cuda:0 on a CPU-only build
    with pytest.raises(DeviceUnavailableError, match=rf"^device '{past_last}': "
                                             r"(this torch \(.*\) sees no CUDA device|only \d+ CUDA device)"):
        load_model(device=past_last)
    with pytest.raises(DeviceUnavailableError, match=r"^device 'tpu': not a device torch knows"):
        load_model(device="tpu")


@pytest.mark.slow  # the bundled GGUF parsed whole
@pytest.mark.parametrize("n_bytes", [0, 7, 4096, 2_000_000])
def test_truncated_gguf_names_the_file(tmp_path, n_bytes):
    bad = tmp_path / "broken.gguf"
    with open(default_model_path(), "rb") as f:
        bad.write_bytes(f.read(n_bytes))
    with pytest.raises(ModelLoadError, match="broken.gguf"):
        load_model(bad)


def test_garbage_gguf_names_the_file(tmp_path):
    bad = tmp_path / "garbage.gguf"
    bad.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    with pytest.raises(ModelLoadError, match="garbage.gguf"):
        load_model(bad)


def test_unsupported_gguf_architecture_names_the_field(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "tiny-gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", torch.zeros(4, 8).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match=r"general\.architecture.*'gpt2'"):
        load_model(path)


def test_unsupported_hf_model_type_names_config_and_field(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    with pytest.raises(ModelLoadError, match=r"config\.json.*model_type 'gpt2'"):
        load_model(tmp_path)


def test_hf_folder_without_weights_or_tokenizer(tmp_path, bundle):
    cfg = {"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
           "intermediate_size": 64, "vocab_size": 49152}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        load_model(tmp_path)
    bundle.tokenizer.save_hf(tmp_path)
    with pytest.raises(ModelLoadError, match="safetensors"):
        load_model(tmp_path)


def _tiny_hf_model(kind: str):
    transformers = pytest.importorskip("transformers")
    common = dict(vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                  eos_token_id=2, bos_token_id=1)
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[kind]
    extra = {"llama": dict(tie_word_embeddings=True), "qwen2": dict(tie_word_embeddings=False),
             "qwen3": dict(tie_word_embeddings=False, head_dim=24)}[kind]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cls(**common, **extra), dtype=torch.float32).eval()
    with torch.no_grad():  # random biases / norm weights, so wrong handling of them would show
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_hf_folder_round_trip_matches_transformers(tmp_path, bundle, kind):
    hf = _tiny_hf_model(kind)
    hf.save_pretrained(tmp_path)
    bundle.tokenizer.save_hf(tmp_path)
    ours = load_model(tmp_path, dtype=torch.float32)  # an exactness check: fp32, whatever this CPU's "auto" is
    assert ours.identity["format"] == "safetensors"
    assert next(ours.model.parameters()).dtype == torch.float32
    assert (ours.config.arch, ours.config.qkv_bias, ours.config.qk_norm) == (kind, kind == "qwen2", kind == "qwen3")
    weights = tmp_path / "model.safetensors"
    assert ours.identity["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert ours.tokenizer.hash == bundle.tokenizer.hash
    assert ours.tokenizer.template_sha256 == bundle.tokenizer.template_sha256
    text = "The  2 cats 🙂 sat"
    assert ours.tokenizer.encode(text) == bundle.tokenizer.encode(text)
    ids = [5, 900, 17, 3000, 42, 7, 49151, 12, 8, 1000]
    with torch.inference_mode():
        ref = hf(input_ids=torch.tensor([ids])).logits[0]
    assert torch.allclose(full_sequence_logits(ours.model, ids), ref, atol=1e-4, rtol=0)
    runner = ModelRunner(ours.model, ours.config, num_blocks=4, block_size=4)
    paged = runner.forward([SeqChunk(ids, 0, [3, 0, 2], logits="all")])[0]
    assert torch.allclose(paged, ref, atol=1e-4, rtol=0)


def test_identity_of_the_bundled_model(bundle):
    ident, path = bundle.identity, default_model_path()
    assert ident["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (ident["format"], ident["quantization"]) == ("gguf", "Q4_1")
    assert ident["kv_bytes_per_token"] == bundle.config.shape.at(torch.float32).kv_bytes_per_token == 2 * 30 * 3 * 64 * 4
    arch = ident["architecture"]
    assert (arch["n_layers"], arch["d_model"], arch["n_heads"], arch["n_kv_heads"], arch["head_dim"]) == (30, 576, 9, 3, 64)
    assert (arch["rope_base"], arch["tie_embeddings"], arch["vocab_size"]) == (100000.0, True, 49152)
    assert ident["dtype"] == {"weights_stored": "Q4_1", "weights": "float32", "activations": "float32",
                              "accumulation": "float32", "kv": "float32",
                              "resolved_by": "asked for (argument)"}  # the test bundle asks for fp32 by name
    assert ident["tokenizer"]["hash"] == bundle.tokenizer.hash
    assert (ident["tokenizer"]["bos_token"], ident["tokenizer"]["eos_tokens"]) == ("<|im_start|>", ["<|im_end|>"])
    assert ident["chat_template_sha256"] == bundle.tokenizer.template_sha256
    json.dumps(ident)  # goes into manifest.json as is


def test_the_context_is_read_from_the_gguf_header_alone(tmp_path):
    """The context comes from the file's first key-values: a copy torn after 64 KiB (no tensor index,
    no tokenizer, no weights) still gives it, in milliseconds, where reading the whole index took seconds."""
    import time

    from inferledger.engine.loader import model_context

    head = tmp_path / "head.gguf"
    with open(default_model_path(), "rb") as f:
        head.write_bytes(f.read(64 * 1024))
    t0 = time.perf_counter()
    assert model_context(head) == 8192
    assert time.perf_counter() - t0 < 0.5
    assert model_context() == 8192


@pytest.mark.slow  # the bundled GGUF parsed whole
def test_the_header_reader_reads_what_the_gguf_package_reads():
    """The header, and the tensor index load_model reads the weights through: every tensor's name, type,
    shape and bytes as the gguf package's own reader gives them."""
    gguf = pytest.importorskip("gguf")
    from inferledger.engine.loader import _gguf_reader, gguf_metadata

    path = default_model_path()
    reader = gguf.GGUFReader(path)
    expected = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert gguf_metadata(path) == expected
    tensors, meta = _gguf_reader(path)
    assert meta == expected and len(tensors) == len(reader.tensors) == 272
    for ours, theirs in zip(tensors, reader.tensors):
        assert (ours.name, ours.tensor_type, ours.shape) == (theirs.name, theirs.tensor_type, tuple(theirs.shape))
        assert ours.data.dtype == theirs.data.dtype and np.array_equal(ours.data, theirs.data), ours.name


def _gguf_bytes(*kvs: tuple[str, int, bytes]) -> bytes:
    """A GGUF v3 header of these (key, value type, packed value) and no tensors."""
    import struct

    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs))
    for key, kind, packed in kvs:
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind) + packed
    return out


def _gguf_str(text: str) -> bytes:
    import struct

    return struct.pack("<Q", len(text)) + text.encode()


@pytest.mark.parametrize("body, problem", [
    (b"", r"not a GGUF file \(starts with b''"),
    (b"PK\x03\x04 a zip", r"not a GGUF file \(starts with b'PK"),
    (b"GGUF", r"unreadable GGUF, probably truncated"),
    (b"GGUF" + (9).to_bytes(4, "little") + bytes(16), r"GGUF version 9 is not supported"),
    (_gguf_bytes(("general.architecture", 8, _gguf_str("llama")))[:-2], r"unreadable GGUF, probably truncated"),
    (_gguf_bytes(("general.architecture", 8, (2 ** 62).to_bytes(8, "little"))), r"unreadable GGUF"),
    (_gguf_bytes(("general.architecture", 8, _gguf_str("llama"))),
     r"GGUF field 'llama\.context_length' is None, not an integer in 1\.\.16777216"),
    (_gguf_bytes(("general.architecture", 8, _gguf_str("llama")), ("llama.context_length", 11, (-5).to_bytes(8, "little", signed=True))),
     r"GGUF field 'llama\.context_length' is -5, not an integer in 1\.\.16777216"),
    (_gguf_bytes(("general.architecture", 8, _gguf_str("llama")), ("x", 9, (8).to_bytes(4, "little") + (2 ** 60).to_bytes(8, "little"))),
     r"an array of \d+ items past the end of the file"),
])
def test_a_bad_gguf_header_is_refused_by_name(tmp_path, body, problem):
    from inferledger.engine.loader import model_context

    path = tmp_path / "m.gguf"
    path.write_bytes(body)
    with pytest.raises(ModelLoadError, match=rf"m\.gguf: .*{problem}"):
        model_context(path)


def _gguf_with_tensor(kind: int, dims: list[int], data: bytes, n_tensors: int = 1, n_dims: int | None = None) -> bytes:
    """A GGUF v3 file of one key (general.architecture) and one tensor `t` of this type and shape at
    offset 0 of the data (aligned to 32 bytes), followed by `data`; `n_tensors` and `n_dims` forge
    the counts the file states."""
    import struct

    head = _gguf_bytes(("general.architecture", 8, _gguf_str("llama")))
    head = head[:8] + struct.pack("<Q", n_tensors) + head[16:]
    head += _gguf_str("t") + struct.pack("<I", len(dims) if n_dims is None else n_dims)
    head += struct.pack(f"<{len(dims)}Q", *dims)
    head += struct.pack("<IQ", kind, 0)
    return head + bytes(-len(head) % 32) + data


def test_a_gguf_tensor_index_is_read_as_the_file_gives_it(tmp_path):
    import struct

    from inferledger.engine.loader import _gguf_reader

    path = tmp_path / "m.gguf"
    path.write_bytes(_gguf_with_tensor(0, [3, 2], struct.pack("<6f", 1, 2, 3, 4, 5, 6)))  # F32, 2 rows of 3
    (t,), meta = _gguf_reader(path)
    assert meta == {"general.architecture": "llama"} and (t.name, t.tensor_type.name, t.shape) == ("t", "F32", (3, 2))
    assert t.data.tolist() == [[1, 2, 3], [4, 5, 6]]


@pytest.mark.parametrize("body, problem", [
    (_gguf_with_tensor(0, [3, 2], bytes(20)), r"tensor t ends at byte \d+, past the file's \d+"),
    (_gguf_with_tensor(99, [3], bytes(12)), r"tensor t has unknown type 99"),
    (_gguf_with_tensor(2, [31], bytes(64)), r"tensor t of \[31\] is not whole Q4_0 blocks of 32"),
    (_gguf_with_tensor(0, [3], bytes(12))[:-40], r"unreadable GGUF, probably truncated"),  # torn in the index
    (_gguf_with_tensor(0, [3], bytes(12), n_tensors=2 ** 40), r"tensors past the end of the file"),
    (_gguf_with_tensor(0, [2 ** 62, 2 ** 62], bytes(16)), r"tensor t ends at byte \d{30,}, past the file's \d+"),
    (_gguf_with_tensor(0, [3], bytes(64), n_dims=2 ** 31), r"tensor t of 2147483648 dimensions past the end"),
])
def test_a_bad_gguf_tensor_index_is_refused_by_name(tmp_path, body, problem):
    path = tmp_path / "m.gguf"
    path.write_bytes(body)
    with pytest.raises(ModelLoadError, match=rf"m\.gguf: .*{problem}"):
        load_model(path)


def test_a_gguf_header_gives_the_context_of_its_own_architecture(tmp_path):
    from inferledger.engine.loader import model_context

    path = tmp_path / "m.gguf"
    path.write_bytes(_gguf_bytes(("general.architecture", 8, _gguf_str("qwen2")),
                                 ("llama.context_length", 4, (99).to_bytes(4, "little")),
                                 ("qwen2.context_length", 4, (32768).to_bytes(4, "little"))))
    assert model_context(path) == 32768


def test_the_loader_and_the_model_shape_read_the_bundled_gguf_alike():
    """One GGUF reader and one shape rule: the loader's config (before any tensor is dequantised) and
    ModelShape.from_gguf give the bundled model the same shape, the one by hand."""
    from inferledger.engine.loader import _gguf_config, _gguf_reader
    from inferledger.probes.model_shape import ModelShape

    path = default_model_path()
    tensors, meta = _gguf_reader(path)
    cfg, _ = _gguf_config(path, meta, {t.name for t in tensors}, torch.float32)
    assert cfg.shape == ModelShape.from_gguf(path, "float32")
    assert cfg.shape == ModelShape(30, 576, 9, 3, 64, 1536, 49152, True, 4, 4, 4, source=f"gguf {path}")


def test_a_gguf_the_model_shape_cannot_read_is_refused_by_name(tmp_path):
    from inferledger.probes.model_shape import ModelShape, ShapeError

    path = tmp_path / "m.gguf"
    path.write_bytes(b"PK\x03\x04 a zip")
    with pytest.raises(ShapeError, match=r"m\.gguf: not a GGUF file \(starts with b'PK"):
        ModelShape.from_gguf(path, "bfloat16")
    path.write_bytes(_gguf_with_tensor(0, [3], bytes(12)))  # an architecture and one tensor, no shape keys
    with pytest.raises(ShapeError, match=r"m\.gguf: required GGUF field 'llama\.attention\.head_count' is missing"):
        ModelShape.from_gguf(path, "bfloat16")
    with pytest.raises(ModelLoadError, match=r"m\.gguf: required GGUF field 'llama\.attention\.head_count' is missing"):
        load_model(path)
