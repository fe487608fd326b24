"""The harness that the end-to-end tests (tests/), the load tests (loadtest/), the Docker stack's
builder (docker/) and the corpus tool (tools/) share: the processes they start (the replay node,
the cache daemon, nginx, Envoy, stand-in nodes), the wire they speak, the load test's scenarios,
proxy variants and report, and `make run`'s stack (`python -m testbed.stack`). Installed into the
venv in editable mode (pyproject.toml), so that every script imports it as `testbed` wherever it
runs from.
"""
