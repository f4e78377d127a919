"""The class-data archive (:mod:`msgbroker.analytics.classcache`): its key, finding it, building
it once for the module (about a minute: a Spark session, ``java -Xshare:dump``), and drivers
that map it, or, when it does not fit, run without it and print nothing more."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from msgbroker.analytics import classcache
from msgbroker.analytics.java import JAVA_MISSING, find_java
from msgbroker.analytics.session import _class_archive_option
from msgbroker.cli import main

# a driver started in a child process (its own JVM): prints how long the session and a first
# job took, and where SparkContext's class came from
_DRIVER = """
import json, sys, time
started = time.monotonic()
from msgbroker.analytics.session import start_session
spark = start_session("local[1]", **json.loads(sys.argv[1]))
spark.range(3).count()
seconds = time.monotonic() - started
options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions")
spark.stop()
print(json.dumps({"seconds": seconds, "options": options}))
"""
_SPARK_CONTEXT_LOADED = re.compile(r"org\.apache\.spark\.SparkContext source: (.*)$", re.M)


def _fake_setup(root: Path) -> tuple[str, Path]:
    """A java (a JDK layout with a release file) and a Spark home with two jars."""
    jdk = root / "jdk"
    (jdk / "bin").mkdir(parents=True)
    (jdk / "bin" / "java").write_text("#!/bin/sh\n")
    (jdk / "release").write_text('JAVA_VERSION="17.0.15"\n')
    home = root / "spark"
    (home / "jars").mkdir(parents=True)
    (home / "conf").mkdir()
    for name in ("a.jar", "b.jar"):
        (home / "jars" / name).write_bytes(b"PK" + name.encode())
    return str(jdk / "bin" / "java"), home


def test_the_key_changes_with_what_the_archive_depends_on(tmp_path):
    java, home = _fake_setup(tmp_path)
    env: dict[str, str] = {}

    def key(**changes: str) -> str:
        return classcache.setup_key(java, home, changes.get("pyspark", "4.3.0"), env)

    first = key()
    assert key() == first
    assert len(first) == 64
    seen = {first}

    def changed() -> None:
        now = key()
        assert now not in seen
        seen.add(now)

    (home / "jars" / "c.jar").write_bytes(b"PK")  # a jar more
    changed()
    (home / "jars" / "c.jar").unlink()  # ... and gone again: the first key again
    assert key() == first
    os.utime(home / "jars" / "a.jar", ns=(0, 10**18))  # a jar's mtime
    changed()
    (home / "jars" / "b.jar").write_bytes(b"PK-something-longer")  # a jar's size
    changed()
    assert key(pyspark="4.3.1") not in seen  # PySpark
    env["SPARK_DIST_CLASSPATH"] = "/opt/hadoop/*"  # more on the driver's classpath
    changed()
    (tmp_path / "conf2").mkdir()
    env["SPARK_CONF_DIR"] = str(tmp_path / "conf2")  # another conf directory
    changed()
    (tmp_path / "jdk" / "release").write_text('JAVA_VERSION="17.0.16"\n')  # Java's version
    changed()
    # the same JDK through a symlink: the same java
    (tmp_path / "jdk-link").symlink_to(tmp_path / "jdk")
    assert (
        classcache.setup_key(str(tmp_path / "jdk-link" / "bin" / "java"), home, "4.3.0", env)
        == key()
    )
    assert classcache.java_identity(java)["version"] == "17.0.16"


def test_cache_dir_follows_xdg(tmp_path):
    assert classcache.cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == (
        tmp_path / "msgbroker" / "spark-cds"
    )
    assert classcache.cache_dir({}) == Path.home() / ".cache" / "msgbroker" / "spark-cds"
    # relative: invalid by the XDG spec, ignored
    assert classcache.cache_dir({"XDG_CACHE_HOME": "rel"}) == classcache.cache_dir({})


def _needs_java_and_pyspark() -> str:
    pytest.importorskip("pyspark")
    if find_java() is None:
        pytest.skip("no java")
    key = classcache.current_key()
    assert key is not None
    return key


def _fake_archive(cache: Path, key: str, classpath_files: list[list[object]] | None = None) -> Path:
    archive = classcache.archive_path(key, cache)
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.write_bytes(b"not really an archive")
    metadata = {"key": key, "classpath_files": classpath_files or []}
    archive.with_suffix(".json").write_text(json.dumps(metadata))
    return archive


def test_archive_for_current_setup_finds_only_a_complete_current_archive(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    key = _needs_java_and_pyspark()
    cache = classcache.cache_dir()
    assert classcache.archive_for_current_setup() is None  # nothing there
    archive = classcache.archive_path(key, cache)
    cache.mkdir(parents=True)
    # a prepare still writing (or one that crashed): its temporary files are never picked up
    (cache / f".{archive.name}.tmp-123-abcd").write_bytes(b"\0" * 1000)
    (cache / f".{archive.with_suffix('.json').name}.tmp-123-abcd").write_text(
        json.dumps({"key": key})
    )
    assert classcache.archive_for_current_setup() is None
    # an archive without its metadata is not used, nor one for another key
    archive.write_bytes(b"x")
    assert classcache.archive_for_current_setup() is None
    _fake_archive(cache, "0" * 64)
    assert classcache.archive_for_current_setup() is None

    assert _fake_archive(cache, key) == archive
    assert classcache.archive_for_current_setup() == archive
    # a file on the recorded classpath changed since: not used
    jar = tmp_path / "extra.jar"
    jar.write_bytes(b"PK")
    st = jar.stat()
    _fake_archive(cache, key, [[str(jar), st.st_size, st.st_mtime_ns]])
    assert classcache.archive_for_current_setup() == archive
    jar.write_bytes(b"PK, changed")
    assert classcache.archive_for_current_setup() is None
    jar.unlink()
    assert classcache.archive_for_current_setup() is None


def test_the_driver_gets_the_archive_unless_switched_off(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(classcache.ENV_SWITCH, raising=False)
    key = _needs_java_and_pyspark()
    assert _class_archive_option({}) is None  # none prepared
    archive = _fake_archive(classcache.cache_dir(), key)
    assert _class_archive_option({}) == f"-XX:SharedArchiveFile={archive}"
    assert _class_archive_option({"spark.master": "spark://head:7077"}) is not None
    # the driver elsewhere, or its own choice of archive
    assert _class_archive_option({"spark.submit.deployMode": "cluster"}) is None
    assert _class_archive_option({"spark.driver.extraJavaOptions": "-Xshare:off"}) is None
    for off in ("off", "OFF", "0"):
        monkeypatch.setenv(classcache.ENV_SWITCH, off)
        assert not classcache.enabled()
        assert _class_archive_option({}) is None
    monkeypatch.setenv(classcache.ENV_SWITCH, "on")
    assert _class_archive_option({}) is not None


def test_java_option_is_one_word_of_extra_java_options():
    assert classcache.java_option(Path("/c/a.jsa")) == "-XX:SharedArchiveFile=/c/a.jsa"
    assert (
        classcache.java_option(Path("/my cache/a.jsa")) == "'-XX:SharedArchiveFile=/my cache/a.jsa'"
    )
    assert classcache.java_option(Path("/it's mine/a.jsa")) is None


def test_prepare_without_java_is_one_line(tmp_path, monkeypatch, capsys):
    pytest.importorskip("pyspark")
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("JAVA_HOME", str(empty))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert main(["analytics", "prepare"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"msgbroker: error: {JAVA_MISSING}\n"
    assert not (tmp_path / "msgbroker").exists()


def test_prepare_says_where_how_big_and_how_long(tmp_path, monkeypatch, capsys):
    built = classcache.Prepared(tmp_path / "a.jsa", 170 * 2**20, 52.4, built=True)
    monkeypatch.setattr(classcache, "prepare", lambda force: built)
    assert main(["analytics", "prepare", "--force"]) == 0
    assert capsys.readouterr().out == f"prepared {tmp_path / 'a.jsa'} (170 MB) in 52 s\n"

    def failing(force: bool) -> classcache.Prepared:
        raise classcache.PrepareFailed("java -Xshare:dump failed (exit status 1): no space")

    monkeypatch.setattr(classcache, "prepare", failing)
    assert main(["analytics", "prepare"]) == 1
    assert capsys.readouterr().err == (
        "msgbroker: error: java -Xshare:dump failed (exit status 1): no space\n"
    )


def _setup_archive(cache: Path, name: str, java: str, home: Path, created: float) -> Path:
    """An archive (a few bytes) and its metadata as :func:`classcache.prepare` writes them."""
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / f"spark-{name}.jsa"
    archive.write_bytes(b"archive " + name.encode())
    jar = home / "jars" / "a.jar"
    metadata = {
        "key": name,
        "java": java,
        "spark_home": str(home),
        "classpath_files": [classcache._stat(jar)],
        "created": created,
    }
    archive.with_suffix(".json").write_text(json.dumps(metadata))
    return archive


def test_prune_keeps_the_current_and_the_newest_others_and_drops_the_dead(tmp_path):
    """A cache shared by five virtualenvs and two Java versions over time: what can never be
    used again goes, and of the usable, the current one and the two newest others stay."""
    java, _ = _fake_setup(tmp_path / "a")
    cache = tmp_path / "cache"
    homes = {}
    for name in ("current", "old-1", "old-2", "old-3", "gone", "changed", "replaced"):
        _, homes[name] = _fake_setup(tmp_path / name)
    homes["replaced"] = homes["current"]  # same Java and Spark home: an earlier build
    current = _setup_archive(cache, "current", java, homes["current"], created=100)
    archives = {
        name: _setup_archive(cache, name, java, homes[name], created=created)
        for name, created in [
            ("old-1", 90), ("old-2", 80), ("old-3", 70), ("gone", 95), ("changed", 99),
            ("replaced", 50),
        ]
    }  # fmt: skip
    shutil.rmtree(homes["gone"])  # a deleted virtualenv
    (homes["changed"] / "jars" / "a.jar").write_bytes(b"PK-upgraded")  # its jar changed
    orphan = cache / "spark-orphan.jsa"  # no metadata: never used
    orphan.write_bytes(b"x")
    crashed = cache / ".spark-x.jsa.tmp-1-abcd"
    crashed.write_bytes(b"x")
    os.utime(crashed, (0, 0))
    running = cache / ".spark-y.jsa.tmp-2-abcd"  # a prepare running now
    running.write_bytes(b"x")
    foreign = cache / "notes.txt"
    foreign.write_text("mine\n")

    removed = classcache.prune(cache, current)
    assert sorted(p.name for p in removed) == sorted(
        f"spark-{name}.jsa" for name in ("old-3", "gone", "changed", "replaced", "orphan")
    )
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [
            *(f"spark-{n}.{ext}" for n in ("current", "old-1", "old-2") for ext in ("jsa", "json")),
            running.name,
            foreign.name,
        ]
    )
    assert classcache.prune(cache, current) == []  # nothing more to do
    assert [p.name for p in classcache.prune(cache, current, keep_others=0)] == [
        "spark-old-1.jsa",
        "spark-old-2.jsa",
    ]
    assert not archives["old-1"].exists()


def test_prepare_prunes_and_says_what_it_freed(tmp_path, monkeypatch, capsys):
    done = classcache.Prepared(
        tmp_path / "a.jsa", 170 * 2**20, 0.0, built=False,
        removed=(tmp_path / "b.jsa", tmp_path / "c.jsa"), removed_bytes=400 * 2**20,
    )  # fmt: skip
    monkeypatch.setattr(classcache, "prepare", lambda force: done)
    assert main(["analytics", "prepare"]) == 0
    assert capsys.readouterr().out == (
        f"already prepared: {tmp_path / 'a.jsa'} (170 MB)\n"
        "removed 2 old class-data archives (400 MB)\n"
    )


# --- with Java: the real archive, built once for this module -------------------------------


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The archive, built through ``msgbroker analytics prepare`` in a fresh cache: the
    XDG_CACHE_HOME to use, the archive, its metadata and what the command printed."""
    pytest.importorskip("pyspark")
    if find_java() is None:
        pytest.skip("no java")
    xdg = tmp_path_factory.mktemp("xdg-cache")
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(xdg))
        with contextlib.redirect_stdout(out):
            status = main(["analytics", "prepare"])
        assert status == 0
        archive = classcache.archive_for_current_setup()
    assert archive is not None
    metadata = json.loads(archive.with_suffix(".json").read_text())
    return {"xdg": xdg, "archive": archive, "metadata": metadata, "printed": out.getvalue()}


def _driver(extra: dict[str, str], env: dict[str, str]) -> tuple[dict[str, object], str]:
    """Start a session in a child process: what it printed as JSON, and its stderr."""
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, json.dumps(extra)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_prepare_builds_an_archive_java_accepts(prepared):
    archive = prepared["archive"]
    metadata = prepared["metadata"]
    size_mb = archive.stat().st_size / 2**20
    assert re.fullmatch(
        rf"prepared {re.escape(str(archive))} \({size_mb:.0f} MB\) in \d+ s\n", prepared["printed"]
    )
    assert size_mb > 20  # Spark's classes, not just the JDK's
    assert metadata["classes"] > 5000
    assert "spark-core" in metadata["classpath"]
    assert any(o.startswith("--add-opens=") for o in metadata["options"])
    # nothing left behind by the build
    assert sorted(p.name for p in archive.parent.iterdir()) == sorted(
        [archive.name, archive.with_suffix(".json").name]
    )
    java = metadata["java"]
    base = [java, "-Xshare:on", f"-XX:SharedArchiveFile={archive}"]
    accepted = subprocess.run(
        [*base, "-cp", metadata["classpath"], *metadata["options"], "-version"],
        capture_output=True,
        text=True,
    )
    assert accepted.returncode == 0, accepted.stderr
    assert "sharing" in accepted.stderr
    # the check can fail: with another classpath -Xshare:on refuses the archive
    refused = subprocess.run([*base, "-cp", str(archive.parent), "-version"], capture_output=True)
    assert refused.returncode != 0


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_cli_prepare_again_is_already_prepared(prepared, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(prepared["xdg"]))
    archive = prepared["archive"]
    mtime = archive.stat().st_mtime_ns
    assert main(["analytics", "prepare"]) == 0
    size_mb = archive.stat().st_size / 2**20
    assert capsys.readouterr().out == f"already prepared: {archive} ({size_mb:.0f} MB)\n"
    assert archive.stat().st_mtime_ns == mtime


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_sessions_map_the_archive_and_mismatches_are_silent(prepared, tmp_path):
    """Three drivers, each logging where its classes came from: with the archive, Spark's
    classes come from it; switched off, and with a classpath the archive does not fit (an
    extra entry before Spark's), from the jars, and stderr has nothing more than without."""
    env = {"XDG_CACHE_HOME": str(prepared["xdg"])}
    runs = {}
    for name, extra_env, extra in [
        ("archive", {}, {}),
        ("off", {classcache.ENV_SWITCH: "off"}, {}),
        ("mismatch", {}, {"spark.driver.extraClassPath": str(tmp_path)}),
    ]:
        log = tmp_path / f"{name}.log"
        extra["spark.driver.extraJavaOptions"] = f"-Xlog:class+load=info:file={log}"
        result, stderr = _driver(extra, {**env, **extra_env})
        sources = _SPARK_CONTEXT_LOADED.findall(log.read_text())
        assert len(sources) == 1, name
        runs[name] = (result, stderr, sources[0])

    archive_option = f"-XX:SharedArchiveFile={prepared['archive']}"
    assert archive_option in runs["archive"][0]["options"]
    assert runs["archive"][2] == "shared objects file"
    assert archive_option not in runs["off"][0]["options"]
    assert runs["off"][2].startswith("jar:file:") or runs["off"][2].startswith("file:")
    # the archive was passed but the JVM declined it, silently
    assert archive_option in runs["mismatch"][0]["options"]
    assert runs["mismatch"][2] != "shared objects file"

    def normal(stderr: str) -> str:
        return re.sub(r"msgbroker-log4j2-\w+", "", stderr)

    assert normal(runs["mismatch"][1]) == normal(runs["off"][1])
    assert normal(runs["archive"][1]) == normal(runs["off"][1])


@pytest.mark.spark
def test_a_jar_changed_under_an_archive_is_silent(tmp_path):
    """The JVM's own check: a jar on the archive's classpath modified since the dump makes
    Java 17 (-Xshare:auto) run without the archive, printing nothing."""
    pytest.importorskip("pyspark")
    java = find_java()
    if java is None:
        pytest.skip("no java")
    from pyspark.find_spark_home import _find_spark_home

    jar = tmp_path / "lang3.jar"
    [source] = Path(_find_spark_home(), "jars").glob("commons-lang3-*.jar")
    jar.write_bytes(source.read_bytes())
    class_list = tmp_path / "classes.lst"
    class_list.write_text("java/lang/Object\norg/apache/commons/lang3/StringUtils\n")
    archive = tmp_path / "mini.jsa"
    subprocess.run(
        [java, "-Xshare:dump", f"-XX:SharedClassListFile={class_list}",
         f"-XX:SharedArchiveFile={archive}", "-cp", str(jar)],
        capture_output=True, check=True,
    )  # fmt: skip
    version = [java, f"-XX:SharedArchiveFile={archive}", "-cp", str(jar), "-version"]
    fits = subprocess.run(version, capture_output=True, text=True, check=True)
    assert "sharing" in fits.stderr
    os.utime(jar, ns=(0, jar.stat().st_mtime_ns + 10**9))
    stale = subprocess.run(version, capture_output=True, text=True, check=True)
    assert stale.stdout == fits.stdout == ""
    assert stale.stderr == fits.stderr.replace(", sharing", "")
