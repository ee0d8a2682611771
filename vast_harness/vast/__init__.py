"""The one door to the Vast API: the paced, typed, key-safe REST client, the endpoint paths, the response
models, the whole-answer bound, the base URL and the server's clock as its `Date` headers tell it.

Every control-plane request to Vast goes through `client.VastClient`: one pacing, one retry policy, and a key
that never leaves the `Authorization` header.
"""
