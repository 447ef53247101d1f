"""`kvlab serve`: the serving engine (kvlab.serving) behind OpenAI's HTTP API, for real clients.

One thread owns the model and steps the engine; HTTP handlers only queue requests and stream their
tokens back. One idea a module:

  protocol.py        OpenAI's request fields to SamplingParams (every refusal a 400 naming its field), the
                     response, chunk and error shapes
  detokenize.py      text from tokens as they come, never cutting a character in two
  serving_thread.py  ServingThread: the thread that steps the engine, the per-request streams, aborts, the
                     waiting limit, the drain
  metrics.py         the Prometheus metrics, vLLM's names where one fits
  app.py             the routes (/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics,
                     /state, /) at module level on one router, reading the app's state; create_app builds it
  page.py            the page at /: a prompt, its tokens streaming, the engine's live state
  cli.py             `kvlab serve`: load a checkpoint as the workflow inspects it, listen on loopback, drain
                     on SIGTERM

Its contract is the engine's: the tokens a request gets over HTTP are those the engine gives it in
process with the same knobs and seed (those `generate` gives it alone). docs/serving.md tells the rest.
"""
