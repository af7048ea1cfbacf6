"""inferledger.serve: the OpenAI-compatible HTTP front end over the reference engine.

`app.build_app` is the aiohttp application; `thread.ServerThread` runs it on a loopback port in a
thread of its own.
"""
