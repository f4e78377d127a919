"""Finding the Java that Spark's launcher will run, with one-line errors when there is none.
Shared by the session (:mod:`.session`) and the class-data archive (:mod:`.classcache`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

JAVA_MISSING = (
    "Java 17 is needed to run Spark and none was found (no JAVA_HOME, no java on PATH): "
    "install it (Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
)


class JavaMissing(Exception):
    """No usable Java: the message says what to install."""

    def __init__(self, message: str = JAVA_MISSING) -> None:
        super().__init__(message)


def find_java() -> str | None:
    """The ``java`` Spark's launcher will run: ``$JAVA_HOME/bin/java``, else ``java`` on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home, "bin", "java")
        return str(candidate) if os.access(candidate, os.X_OK) else None
    return shutil.which("java")


def check_java() -> str:
    """The java executable, or :class:`JavaMissing` (a set but empty JAVA_HOME counts as none,
    as it does for ``spark-submit``)."""
    java = find_java()
    if java is None:
        raise JavaMissing
    return java
