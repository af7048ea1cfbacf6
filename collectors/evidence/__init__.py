"""OTLP traces and metrics, the engine's evidence about itself, and the rejoin of vLLM's spans to the client's requests."""
