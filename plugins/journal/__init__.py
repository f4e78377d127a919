"""The journal: every routed message and session event, as Parquet segment files.

``--journal DIR`` turns it on; see ``docs/journal.md`` for the layout, the schema and the
guarantees, :mod:`.schema` for the columns and :mod:`.writer` for the writer thread.
"""
