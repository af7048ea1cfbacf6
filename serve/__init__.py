"""inferledger.serve: the OpenAI-compatible HTTP front end over the reference engine.

`app.build_app` is the aiohttp application (what it serves and its limits: `options.ServeOptions`); `thread.ServerThread` runs it on a loopback port in a
thread of its own; `lifecycle.Serving` is one serving life (build, serve, drain, write the run).
"""

DRAIN_TIMEOUT_S = 30.0  # on stop, what in-flight requests get to finish on their own before they are cancelled
