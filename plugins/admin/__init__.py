"""The admin plugin: ``--admin ENDPOINT`` serves Prometheus metrics, a JSON admin API, a live
dashboard and publishes ``_sys/...`` topics (see docs/operations.md, "Watching it")."""
