"""Built-in authentication schemes, one per module: ``open``, ``secret``, ``cert``."""
