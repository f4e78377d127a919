"""Micromessage2: a binary protocol with a three-step handshake, typed properties and extensions."""
