"""The NATS engine (``--cluster nats://HOST:PORT``; see docs/cluster.md)."""
