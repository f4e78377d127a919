"""Access control (``--acl FILE``): Mosquitto-style rules per identity, certificate name and
pattern, for publish, subscribe, unicast and broadcast, on every protocol. ``rules`` parses
the file, ``patterns`` matches topics, ``policy`` decides, ``plugin`` hooks it in;
docs/operations.md, "Access control", is the reference."""
