"""sbus: a bus on unix SOCK_SEQPACKET sockets, one packet per message, wildcard routing keys."""
