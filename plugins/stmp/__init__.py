"""STMP 0.1: binary over TCP, text over WebSocket; action routing through plugins."""
