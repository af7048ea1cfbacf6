"""The load client: open-loop HTTP and in-process transports, SSE parsing, prompt tokenization."""
