"""msgbroker's built-in plugins: one package per protocol, plus auth schemes.

Each is registered through the ``msgbroker`` entry-point group exactly like a third-party
plugin (see ``msgbroker.plugins`` in pyproject.toml).
"""
