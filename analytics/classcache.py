"""The class-data archive that halves the Spark driver's start-up (HotSpot AppCDS).

Most of a driver JVM's start is spent loading, verifying and linking Spark's ~14,000 classes
from 280 jars. A CDS archive holds them already parsed, mapped straight into memory:
:func:`prepare` builds one for this machine's Java and PySpark, :func:`archive_for_current_setup`
finds it (cheaply: no JVM start, it runs on every session start) and
:func:`msgbroker.analytics.session.start_session` passes it to the driver as
``-XX:SharedArchiveFile`` (unless ``MSGBROKER_SPARK_CDS=off``).

How :func:`prepare` builds it:

1. a child process (this interpreter) starts a session through
   :func:`~msgbroker.analytics.session.start_session` with ``-XX:DumpLoadedClassList`` and runs
   a small workload like the report's (groupBy/agg to Arrow, Parquet out and in, an RDD
   ``mapPartitions`` on Python workers, a SQL query), so the list has the classes real jobs
   load, not only start-up's; it reads the classpath and the module options the driver really
   ran with from inside the JVM, instead of re-deriving ``spark-class``'s logic;
2. ``java -Xshare:dump`` with that list, that classpath and those options writes the archive
   under a temporary name in the cache directory;
3. ``java -Xshare:on`` (which fails instead of falling back) loads it with the same classpath;
4. it is fsynced and renamed into place. A half-written archive mapped by a JVM kills it with
   SIGBUS: the archive only ever appears complete, under its final name, and is never
   rewritten in place (a rebuild writes a new file and renames it over the old one; JVMs that
   mapped the old one keep it). Concurrent prepares each write their own temporary file.

Each :func:`prepare` then prunes the cache (:func:`prune`): it deletes the archives this
one replaces and those that can never be used again (their virtualenv or Java is gone), and
keeps at most :data:`KEEP_OTHERS` archives of other setups sharing the cache besides the
current one, the newest: each is about 200 MB.

The archive's name carries a key (:func:`setup_key`) over everything it depends on: the
``java`` executable (real path, version, ``libjvm.so``), the PySpark version and Spark home,
what the launcher builds the driver's classpath from (the conf directory, the environment
variables it reads, the jars directory in listing order with each jar's size and mtime). A
change of any of them makes a new key, so a stale archive is never passed to a JVM. The JVM
checks again anyway (classpath prefix, jar sizes and mtimes): when the archive does not fit it
silently runs without it, so the archive is only ever an optimization.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: ``MSGBROKER_SPARK_CDS=off`` keeps the archive out of the driver's options
ENV_SWITCH = "MSGBROKER_SPARK_CDS"
#: bump when the archive's layout or the way it is built changes
FORMAT = 1
#: what the launcher builds the driver's classpath from besides the jars and conf directories
_CLASSPATH_ENV = (
    "SPARK_CONF_DIR",
    "SPARK_DIST_CLASSPATH",
    "SPARK_CLASSPATH",
    "HADOOP_CONF_DIR",
    "YARN_CONF_DIR",
    "SPARK_PREPEND_CLASSES",
    "SPARK_TESTING",
    "SPARK_SQL_TESTING",
    "SPARK_SCALA_VERSION",
    "SPARK_SCALA_SHELL",
    "SPARK_CONNECT_BEELINE",
)
#: the driver's JVM options the dump must repeat: module options (Spark's --add-opens ...)
_MODULE_OPTION_PREFIXES = ("--add-", "--enable-native-access", "--sun-misc-")
#: a crashed prepare's temporary files older than this are removed by the next prepare
_STALE_TEMP_SECONDS = 24 * 3600
#: archives of other setups sharing the cache (other virtualenvs) kept besides the current
#: one: about 200 MB each
KEEP_OTHERS = 2

# what the child process runs (msgbroker.analytics.classrecord)
_CHILD = "from msgbroker.analytics.classrecord import record; record()"


class PrepareFailed(Exception):
    """The archive could not be built: the message is one line saying why."""


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` did: the archive, its size, whether this call built it, and the
    archives it deleted (:func:`prune`) with their size in all."""

    path: Path
    size: int
    seconds: float
    built: bool
    removed: tuple[Path, ...] = ()
    removed_bytes: int = 0


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """False when ``MSGBROKER_SPARK_CDS=off`` (or ``0``, ``no``, ``false``)."""
    value = (os.environ if environ is None else environ).get(ENV_SWITCH, "")
    return value.strip().lower() not in {"off", "0", "no", "false"}


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/msgbroker/spark-cds`` (a relative XDG_CACHE_HOME is
    ignored, as the XDG spec says)."""
    base = (os.environ if environ is None else environ).get("XDG_CACHE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".cache"
    return root / "msgbroker" / "spark-cds"


def _stat(path: str | Path) -> list[Any]:
    """Name, size and mtime of ``path`` (None for a missing one)."""
    try:
        st = os.stat(path)
    except OSError:
        return [str(path), None, None]
    return [str(path), st.st_size, st.st_mtime_ns]


def _listing(directory: Path) -> list[Any]:
    """``directory``'s entries in listing order (the order ``jars/*`` expands in), each with its
    size and mtime."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return [str(directory), None]
    out: list[Any] = [str(directory)]
    for entry in entries:
        try:
            st = entry.stat()
        except OSError:
            out.append([entry.name, None, None])
        else:
            out.append([entry.name, st.st_size, st.st_mtime_ns])
    return out


def java_identity(java: str) -> dict[str, Any]:
    """The java executable's real path and version, without starting it: the JDK's ``release``
    file, and ``libjvm.so``'s size and mtime (an in-place update changes them)."""
    real = Path(os.path.realpath(java))
    home = real.parent.parent
    try:
        release = (home / "release").read_text(errors="replace")
    except OSError:
        release = ""
    version = ""
    for line in release.splitlines():
        if line.startswith("JAVA_VERSION="):
            version = line.partition("=")[2].strip().strip('"')
    return {
        "java": str(real),
        "version": version,
        "release": hashlib.sha256(release.encode()).hexdigest(),
        "binary": _stat(real),
        "libjvm": _stat(home / "lib" / "server" / "libjvm.so"),
    }


def spark_home(environ: Mapping[str, str] | None = None) -> Path:
    """The Spark home PySpark launches from (``SPARK_HOME``, else the pyspark package)."""
    env = os.environ if environ is None else environ
    if env.get("SPARK_HOME"):
        return Path(env["SPARK_HOME"])
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home())


def setup_key(
    java: str,
    home: Path,
    pyspark_version: str,
    environ: Mapping[str, str] | None = None,
) -> str:
    """A hex digest over everything the archive depends on (see the module's docstring)."""
    env = os.environ if environ is None else environ
    conf_dir = Path(env.get("SPARK_CONF_DIR") or home / "conf")
    parts = {
        "format": FORMAT,
        "java": java_identity(java),
        "pyspark": pyspark_version,
        "spark_home": os.path.realpath(home),
        "env": {name: env.get(name) for name in _CLASSPATH_ENV},
        "conf": _listing(conf_dir),
        "jars": _listing(home / "jars"),
    }
    blob = json.dumps(parts, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def archive_path(key: str, cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / f"spark-{key[:32]}.jsa"


def _metadata_path(archive: Path) -> Path:
    return archive.with_suffix(".json")


def current_key(environ: Mapping[str, str] | None = None) -> str | None:
    """:func:`setup_key` for this process's Java and PySpark, None without either."""
    from .java import find_java

    java = find_java()
    if java is None:
        return None
    try:
        from pyspark.version import __version__ as pyspark_version

        home = spark_home(environ)
    except (ImportError, SystemExit):  # _find_spark_home exits when it finds nothing
        return None
    return setup_key(java, home, pyspark_version, environ)


def _classpath_unchanged(metadata: dict[str, Any]) -> bool:
    """The files on the recorded driver classpath still have the sizes and mtimes they had."""
    return all(_stat(entry[0]) == entry for entry in metadata.get("classpath_files", []))


def archive_for_current_setup(cache: Path | None = None) -> Path | None:
    """The archive for this Java, PySpark and classpath, or None when there is none (or it was
    built for something that has changed since). Starts no JVM: stats, and a small JSON file."""
    try:
        key = current_key()
    except OSError:
        return None
    if key is None:
        return None
    archive = archive_path(key, cache)
    try:
        metadata = json.loads(_metadata_path(archive).read_text())
        if not archive.is_file() or metadata.get("key") != key:
            return None
    except (OSError, ValueError):
        return None
    return archive if _classpath_unchanged(metadata) else None


def java_option(archive: Path) -> str | None:
    """``-XX:SharedArchiveFile=...`` as one ``spark.driver.extraJavaOptions`` word (Spark
    splits that setting on spaces, with shell-like quotes), or None if it cannot be one."""
    option = f"-XX:SharedArchiveFile={archive}"
    if not any(c.isspace() or c in "'\"\\" for c in option):
        return option
    if "'" in option:
        return None
    return f"'{option}'"


# --- building it -------------------------------------------------------------------------


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _run(command: list[str], what: str, timeout: float, **kwargs: Any) -> None:
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            **kwargs,
        )
    except subprocess.TimeoutExpired:
        raise PrepareFailed(f"{what} took over {timeout:.0f} s")
    except OSError as e:
        raise PrepareFailed(f"{what}: {e}")
    if done.returncode != 0:
        raise PrepareFailed(
            f"{what} failed (exit status {done.returncode}): "
            f"{_last_line(done.stderr + done.stdout)}"
        )


def _module_options(options: list[str]) -> list[str]:
    keep = [o for o in options if o.startswith(_MODULE_OPTION_PREFIXES)]
    if "-XX:+IgnoreUnrecognizedVMOptions" in options:
        # Spark passes options newer JDKs know (--sun-misc-unsafe-memory-access) with this
        keep.insert(0, "-XX:+IgnoreUnrecognizedVMOptions")
    return keep


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def prune(cache: Path, keep: Path, keep_others: int = KEEP_OTHERS) -> list[Path]:
    """Delete the archives in ``cache`` that are of no more use, and the oldest beyond a
    limit; returns the archives deleted. Kept: ``keep`` (the current setup's) and the
    ``keep_others`` newest archives of other setups sharing the cache (another virtualenv, a
    second Java) that can still be used. Deleted:

    - archives ``keep`` replaces: same Java, same Spark home (they can never match again);
    - archives whose Java or Spark home is gone (a deleted virtualenv), or whose classpath
      files changed (the key they were made for cannot come back);
    - the oldest of the rest, beyond ``keep_others``;
    - an archive without its metadata (never used), and crashed prepares' temporary files
      older than a day.

    JVMs that mapped a deleted archive keep their mapping."""
    now = time.time()
    current = _read_metadata(_metadata_path(keep))
    others: list[tuple[float, Path]] = []
    removed: list[Path] = []

    def remove(archive: Path) -> None:
        try:
            archive.unlink(missing_ok=True)
            _metadata_path(archive).unlink(missing_ok=True)
        except OSError:
            return
        removed.append(archive)

    for entry in sorted(cache.iterdir()):
        try:
            if entry.name.startswith(".") and ".tmp-" in entry.name:
                if now - entry.stat().st_mtime > _STALE_TEMP_SECONDS:
                    entry.unlink()
                continue
            if entry.suffix == ".jsa" and entry != keep and not _metadata_path(entry).exists():
                remove(entry)
                continue
            if entry.suffix != ".json" or entry == _metadata_path(keep):
                continue
        except OSError:
            continue
        archive = entry.with_suffix(".jsa")
        metadata = _read_metadata(entry)
        if metadata is None:
            continue  # not ours, or being written: leave it
        same_setup = current is not None and (
            metadata.get("java") == current.get("java")
            and metadata.get("spark_home") == current.get("spark_home")
        )
        dead = not (
            os.path.exists(str(metadata.get("java")))
            and os.path.isdir(str(metadata.get("spark_home")))
            and _classpath_unchanged(metadata)
        )
        if same_setup or dead:
            remove(archive)
        else:
            others.append((float(metadata.get("created") or 0), archive))
    others.sort(reverse=True)
    for _, archive in others[max(0, keep_others) :]:
        remove(archive)
    return removed


def _read_metadata(path: Path) -> dict[str, Any] | None:
    try:
        metadata = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return metadata if isinstance(metadata, dict) else None


def prepare(
    *,
    force: bool = False,
    cache: Path | None = None,
    timeout: float = 900.0,
    keep_others: int = KEEP_OTHERS,
) -> Prepared:
    """Build the archive for the current setup, unless there is one (or ``force``); either
    way, :func:`prune` the cache (``keep_others``).

    :class:`~msgbroker.analytics.java.JavaMissing` without Java, :class:`PrepareFailed`
    (one line) for anything else. Takes about a minute (two JVM runs and the dump)."""
    from .java import check_java

    check_java()
    started = time.monotonic()
    cache = cache or cache_dir()
    key = current_key()
    if key is None:
        raise PrepareFailed("PySpark is not installed: pip install 'msgbroker[spark]'")
    archive = archive_path(key, cache)
    if not force and archive_for_current_setup(cache) == archive:
        return _pruned(
            Prepared(archive, archive.stat().st_size, 0.0, built=False), cache, keep_others
        )
    cache.mkdir(parents=True, exist_ok=True)

    tag = f".tmp-{os.getpid()}-{os.urandom(4).hex()}"
    tmp_archive = cache / f".{archive.name}{tag}"
    tmp_metadata = cache / f".{_metadata_path(archive).name}{tag}"
    with tempfile.TemporaryDirectory(prefix="msgbroker-cds-") as work:
        class_list = Path(work, "classes.lst")
        info_file = Path(work, "driver.json")
        env = dict(os.environ, **{ENV_SWITCH: "off"})
        # 1. the classes a session and a small workload load, and the driver's command line
        _run(
            [sys.executable, "-c", _CHILD, str(class_list), str(info_file)],
            "the Spark session listing its classes",
            timeout,
            env=env,
        )
        try:
            info = json.loads(info_file.read_text())
            classes = sum(1 for _ in class_list.open())
        except (OSError, ValueError) as e:
            raise PrepareFailed(f"the Spark session listing its classes left no list: {e}")
        java = str(Path(info["java_home"], "bin", "java"))
        if os.path.realpath(java) != os.path.realpath(check_java()):
            raise PrepareFailed(f"the driver ran {java}, not {check_java()}")
        classpath = info["classpath"]
        options = _module_options(info["options"])
        try:
            # 2. the archive, under a temporary name
            _run(
                [
                    java,
                    "-Xshare:dump",
                    f"-XX:SharedClassListFile={class_list}",
                    f"-XX:SharedArchiveFile={tmp_archive}",
                    "-cp",
                    classpath,
                    *options,
                ],
                "java -Xshare:dump",
                timeout,
            )
            # 3. a JVM with the driver's classpath must take it (-Xshare:on: no silent fallback)
            _run(
                [
                    java,
                    "-Xshare:on",
                    f"-XX:SharedArchiveFile={tmp_archive}",
                    "-cp",
                    classpath,
                    *options,
                    "-version",
                ],
                "the new archive's check (java -Xshare:on)",
                timeout,
            )
            metadata = {
                "key": key,
                "format": FORMAT,
                "java": os.path.realpath(java),
                "java_version": java_identity(java)["version"],
                "spark_home": os.path.realpath(spark_home()),
                "classpath": classpath,
                "classpath_files": [
                    _stat(p) for p in classpath.split(os.pathsep) if os.path.isfile(p)
                ],
                "options": options,
                "classes": classes,
                "created": time.time(),
            }
            tmp_metadata.write_text(json.dumps(metadata, indent=1))
            # 4. complete on disk, then visible: metadata first (an archive is only used with
            # its metadata), the archive last
            _fsync(tmp_metadata)
            _fsync(tmp_archive)
            os.replace(tmp_metadata, _metadata_path(archive))
            os.replace(tmp_archive, archive)
            _fsync(cache)
        finally:
            tmp_archive.unlink(missing_ok=True)
            tmp_metadata.unlink(missing_ok=True)
    done = Prepared(archive, archive.stat().st_size, time.monotonic() - started, built=True)
    return _pruned(done, cache, keep_others)


def _pruned(done: Prepared, cache: Path, keep_others: int) -> Prepared:
    sizes = {p: _stat(p)[1] or 0 for p in cache.glob("*.jsa") if p != done.path}
    removed = prune(cache, done.path, keep_others)
    freed = sum(sizes.get(p, 0) for p in removed)
    return dataclasses.replace(done, removed=tuple(removed), removed_bytes=freed)
