"""What the HTTP front end is asked for, as one value (`ServeOptions`).

`inferledger serve` builds it once from its flags and hands it to the serving life
(lifecycle.Serving), which hands it to the front end (app.build_app, app.OpenAIServer); the
embedded capture and the tests build their own. The defaults are the command's.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServeOptions:
    model_name: str | None = None  # what clients send as `model` (None: the checkpoint's file name, lifecycle.py)
    api_key: str | None = None  # required as 'Authorization: Bearer KEY' on /v1/* when set
    max_queue: int = 512  # requests in flight (waiting + running) before new ones get 429
    default_max_tokens: int | None = None  # a request without max_tokens (None: the room left in the context)
    flush_every_s: float | None = None  # the front end's loop flushes the sink this often (None: never)
    poll_s: float = 0.1  # how often the transports of requests in flight are checked for a disconnect
    client_max_size: int = 8 * 2**20  # the largest request body (413 beyond)
