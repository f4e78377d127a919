"""SSMP 1.1, the Stupid-Simple Messaging Protocol: codec, Twisted protocol, plugin, client."""
