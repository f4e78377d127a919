"""The Redis engine (``--cluster redis://HOST:PORT``; see docs/cluster.md)."""
