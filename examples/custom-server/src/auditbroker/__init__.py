"""auditbroker: a custom msgbroker server, built by subclassing :class:`msgbroker.Broker`."""
