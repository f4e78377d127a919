"""PySpark jobs over the broker's journal (``msgbroker analytics ...``; the ``spark`` extra).

Nothing here imports PySpark at module import time, so ``msgbroker --help`` and the rest of
the command line work without the extra installed.
"""
