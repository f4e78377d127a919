"""linepub: a tiny line protocol for msgbroker, written as a third-party plugin would be."""
