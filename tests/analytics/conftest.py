"""The one SparkSession every ``spark``-marked test shares.

Starting Spark costs seconds (a JVM, then Spark SQL's classes), so the whole run starts it
once, on first use: tests that do not ask for the ``spark`` fixture never start it, and
``pytest -m "not spark"`` runs everything else without Java.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from msgbroker.analytics.session import start_session

    # two cores' worth of tasks and two shuffle partitions: the test journals are tiny, and
    # more partitions only add task start-up
    session = start_session("local[2]", **{"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def sample_journal(tmp_path_factory):
    from tests.analytics.journal_data import write_sample_journal

    return write_sample_journal(tmp_path_factory.mktemp("journal"))
