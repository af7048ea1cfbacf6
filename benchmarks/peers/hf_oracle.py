"""Record Hugging Face transformers' answers on the bundled GGUF: the correctness oracle the model tests
hold the engine to, written once so that the suite does not load transformers' model (its GGUF
dequantisation alone costs about 14 s of CPU per test process) to ask it the same questions again.

    .venv/bin/python benchmarks/peers/hf_oracle.py [--out samples/peers/hf_oracle/smollm2_q4_1.json]

Everything here comes from transformers alone (its tokenizer, its chat template, its model read from
the same GGUF file, fp32): nothing of inferledger's is imported. What is recorded:
  - the 8 prompts' token ids (4 chat messages through the chat template with the generation prompt,
    4 plain texts), as transformers' tokenizer gives them;
  - `greedy`: for each prompt, 32 tokens, each the argmax of transformers' logits after the prompt and
    the tokens before it (one full forward per token, no KV cache, EOS not stopping it);
  - `generate`: `model.generate(prompt 4, max_new_tokens=32, do_sample=False)`, which stops at EOS;
  - `logits`: for prompt 1, at every position, the 32 largest logits (token id, value), the logsumexp
    and the mean over the whole vocabulary (which every logit moves).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bundled_gguf import bundled_gguf  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "samples" / "peers" / "hf_oracle" / "smollm2_q4_1.json"
CHAT = ["What is the capital of France?", "Write a haiku about the sea.",
        "Explain recursion to a child in two sentences.", "List three prime numbers above 100."]
PLAIN = ["The history of the printing press", "def fibonacci(n):\n", "Once upon a time, in a village",
         "Les chats sont"]
NEW_TOKENS, TOP_K, LOGITS_PROMPT, GENERATE_PROMPT = 32, 32, 1, 4


@torch.inference_mode()
def record(path: Path) -> dict:
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                              dtype=torch.float32).eval()
    chat = [tok.apply_chat_template([{"role": "user", "content": c}], tokenize=False, add_generation_prompt=True)
            for c in CHAT]
    prompts = [tok.encode(t, add_special_tokens=False) for t in chat + PLAIN]
    greedy = []
    for ids in prompts:
        seq = list(ids)
        for _ in range(NEW_TOKENS):
            seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
        greedy.append(seq[len(ids):])
    gen = model.generate(torch.tensor([prompts[GENERATE_PROMPT]]), max_new_tokens=NEW_TOKENS, do_sample=False)
    logits = model(input_ids=torch.tensor([prompts[LOGITS_PROMPT]])).logits[0]
    top = logits.topk(TOP_K, dim=-1)
    return {
        "made_by": "benchmarks/peers/hf_oracle.py",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "gguf": {"file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()},
        "dtype": "float32",
        "prompts": [{"text": t, "chat": i < len(CHAT), "ids": ids}
                    for i, (t, ids) in enumerate(zip(CHAT + PLAIN, prompts))],
        "greedy": greedy,
        "generate": {"prompt": GENERATE_PROMPT, "max_new_tokens": NEW_TOKENS,
                     "tokens": gen[0, len(prompts[GENERATE_PROMPT]):].tolist()},
        "logits": {"prompt": LOGITS_PROMPT, "top_k": TOP_K,
                   "top_ids": top.indices.tolist(), "top_values": top.values.tolist(),
                   "logsumexp": torch.logsumexp(logits, -1).tolist(), "mean": logits.mean(-1).tolist()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    doc = record(bundled_gguf("hf_oracle.py"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
