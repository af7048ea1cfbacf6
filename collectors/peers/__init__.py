"""The peer load tools (AIPerf, GuideLLM, vllm bench serve): their records read, joined to the server's view, imported as runs."""
