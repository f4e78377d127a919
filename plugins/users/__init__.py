"""The users plugin: ``--users FILE`` (``[auth] users``), the ``password`` auth scheme for
every protocol, and ``msgbroker users add|remove|list`` (see docs/operations.md, "Users")."""
