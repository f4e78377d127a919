"""STMP 0.1: binary over TCP, text over WebSocket; action routing through plugins."""

# codec re-exports textcodec's names at its end: load it first, whichever module is asked for
from . import codec as _codec  # noqa: F401
