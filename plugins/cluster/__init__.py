"""The cluster: the [cluster] section, the memory engine, cluster metrics (see docs/cluster.md)."""
