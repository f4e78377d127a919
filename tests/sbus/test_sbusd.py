"""The ``sbusd`` command, run as the real console script, with raw seqpacket clients: its
readiness (stdout ends), addresses, socket permissions, ``-r``, pidfiles, signals, ``-c``,
``-u``, daemon mode and errors."""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from attrs import define, field

from tests.sbus.server_support import RawClient
from tests.ssmp.e2e_support import WAIT

SBUSD = Path(sys.executable).with_name("sbusd")
#: uids nobody in the test runs as; only root can connect as them
OTHER_UID, THIRD_UID = 65534, 65533

as_root = pytest.mark.skipif(os.getuid() != 0, reason="connecting as another user needs root")


def wait_for_exit(pid: int, timeout: float = WAIT) -> None:
    """Wait for a process that is not our child (a daemon) to end: its pidfd becomes
    readable when it exits, reaped or not."""
    pidfd = os.pidfd_open(pid)
    try:
        readable, _, _ = select.select([pidfd], [], [], timeout)
    finally:
        os.close(pidfd)
    if not readable:
        raise AssertionError(f"process {pid} still runs after {timeout} s")


def read_to_end(stream: Any, timeout: float = WAIT) -> bytes:
    """Everything on ``stream`` until its end, which is sbusd's readiness signal."""
    deadline = time.monotonic() + timeout
    chunks = []
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                raise AssertionError("sbusd did not close its stdout (not ready)")
            chunk = os.read(stream.fileno(), 4096)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a daemon is not our child: it may linger as a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def connect(address: str | bytes) -> RawClient:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(WAIT)
    sock.connect(address)
    return RawClient(sock)


def whoami(client: RawClient) -> bytes:
    client.send(b"CMSG !/cred/whoami")
    return client.recv()


def whoami_as(uid: int, address: str | bytes) -> bytes | None:
    """The ``!/cred/whoami`` reply to a client connected as ``uid`` (in a forked child), or
    None when the server closed that connection instead."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        status = 1
        try:
            os.close(read_end)
            os.setuid(uid)
            try:
                reply = whoami(connect(address))
            except OSError:  # reset, or a send after the server closed
                reply = b""
            os.write(write_end, b"+" + reply if reply else b"-")
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        result = pipe.read()
    assert os.waitpid(pid, 0)[1] == 0
    return result[1:] if result.startswith(b"+") else None


@define
class Sbusd:
    """One foreground ``sbusd -f``; stdout is its readiness, stderr is read once it ends."""

    process: subprocess.Popen[bytes]
    #: what it printed before it was ready (a random abstract address)
    out: bytes = b""

    def ready(self) -> None:
        self.out = read_to_end(self.process.stdout)
        assert self.process.poll() is None, self.finish()

    def finish(self, timeout: float = WAIT) -> tuple[int, str]:
        """Wait for the end: (exit status, stderr)."""
        _, err = self.process.communicate(timeout=timeout)
        return self.process.returncode, err.decode()

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str]:
        self.process.send_signal(sig)
        return self.finish()


@define
class Runner:
    directory: Path
    started: list[Sbusd] = field(factory=list)
    daemons: list[Path] = field(factory=list)  # their pidfiles

    def path(self, name: str = "bus") -> str:
        return str(self.directory / name)

    def start(self, *args: str, **popen: Any) -> Sbusd:
        popen.setdefault("stdout", subprocess.PIPE)
        process = subprocess.Popen(
            [str(SBUSD), "-f", *args], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, **popen
        )
        self.started.append(Sbusd(process))
        return self.started[-1]

    def serve(self, *args: str, **popen: Any) -> Sbusd:
        sbusd = self.start(*args, **popen)
        sbusd.ready()
        return sbusd

    def fail(self, *args: str) -> tuple[int, str]:
        """Run a foreground sbusd expected to fail at once: (exit status, stderr)."""
        return self.start(*args).finish()

    def daemon(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        """``sbusd`` without ``-f``; its stderr goes to a file (the daemon keeps it)."""
        pidfile = self.directory / f"pid{len(self.daemons)}"
        self.daemons.append(pidfile)
        with open(self.directory / "daemon.err", "wb") as err:
            return subprocess.run(
                [str(SBUSD), "-p", str(pidfile), *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                timeout=WAIT,
                check=False,
            )

    def daemon_stderr(self) -> str:
        return (self.directory / "daemon.err").read_text()

    def close(self) -> None:
        for sbusd in self.started:
            if sbusd.process.poll() is None:
                sbusd.process.kill()
            sbusd.process.communicate()
        for pidfile in self.daemons:
            with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)


@pytest.fixture
def sbusd() -> Iterator[Runner]:
    # short: AF_UNIX paths have at most 107 bytes
    directory = Path(tempfile.mkdtemp(prefix="sb", dir="/tmp"))
    runner = Runner(directory)
    try:
        yield runner
    finally:
        runner.close()
        shutil.rmtree(directory, ignore_errors=True)


def exchange(address: str | bytes) -> None:
    """Two clients through the bus: a subscriber gets the other's message, byte for byte."""
    subscriber, publisher = connect(address), connect(address)
    subscriber.send(b"SUB news/*")
    subscriber.sync()  # the subscription is in before anything is published
    publisher.send(b"MSG news/today\0hello")
    subscriber.expect(b"MSG news/today\0hello")
    subscriber.close()
    publisher.close()


def hex_name() -> str:
    return os.urandom(8).hex()


# -- readiness and the bus -------------------------------------------------------------------


def test_f_closes_stdout_when_ready_and_two_clients_exchange_a_message(sbusd):
    bus = sbusd.serve("-a", sbusd.path())
    assert stat.S_ISSOCK(os.stat(sbusd.path()).st_mode)
    exchange(sbusd.path())
    assert bus.stop() == (0, "")


@pytest.mark.parametrize(
    ("flags", "mode"), [((), 0o700), (("-g",), 0o770), (("-o",), 0o707), (("-go",), 0o777)]
)
def test_socket_mode_is_0700_and_g_o_open_it(sbusd, flags, mode):
    sbusd.serve("-a", sbusd.path(), *flags)
    assert stat.S_IMODE(os.stat(sbusd.path()).st_mode) == mode


# -- an existing socket file -----------------------------------------------------------------


@pytest.fixture
def live_socket(sbusd) -> Iterator[socket.socket]:
    """Someone else listening at the bus path."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as other:
        other.bind(sbusd.path())
        other.listen()
        yield other


def test_a_live_socket_without_r_is_an_error_and_is_left_alone(sbusd, live_socket):
    status, err = sbusd.fail("-a", sbusd.path())
    assert status == 1
    assert err == f"sbusd: cannot listen on {sbusd.path()}: Address already in use\n"
    connect(sbusd.path()).close()
    live_socket.settimeout(WAIT)
    live_socket.accept()[0].close()  # the connection went to the other listener


def test_r_replaces_a_live_socket(sbusd, live_socket):
    sbusd.serve("-r", "-a", sbusd.path())
    exchange(sbusd.path())


def test_a_stale_socket_is_replaced_without_r(sbusd):
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as dead:
        dead.bind(sbusd.path())  # bound, never listening: nobody accepts on it
    sbusd.serve("-a", sbusd.path())
    exchange(sbusd.path())


def test_a_regular_file_at_the_path_is_an_error_without_r(sbusd):
    Path(sbusd.path()).write_text("not a socket")
    status, err = sbusd.fail("-a", sbusd.path())
    assert (status, err.startswith("sbusd: cannot listen on")) == (1, True)
    assert Path(sbusd.path()).read_text() == "not a socket"


# -- pidfile and signals ---------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_stops_and_removes_socket_and_pidfile(sbusd, sig):
    pidfile = Path(sbusd.path("pid"))
    bus = sbusd.serve("-a", sbusd.path(), "-p", str(pidfile))
    assert pidfile.read_text() == f"{bus.process.pid}\n"
    assert stat.S_IMODE(pidfile.stat().st_mode) == 0o644
    client = connect(sbusd.path())
    assert bus.stop(sig) == (0, "")
    assert client.closed_by_server()
    assert not os.path.exists(sbusd.path())
    assert not pidfile.exists()


def test_f_writes_no_pidfile_unless_asked(sbusd):
    sbusd.serve("-a", sbusd.path(), cwd=sbusd.directory)
    assert sorted(os.listdir(sbusd.directory)) == ["bus"]


def test_pidfile_dev_null_means_none_and_is_never_removed(sbusd):
    bus = sbusd.serve("-a", sbusd.path(), "-p", os.devnull, cwd=sbusd.directory)
    assert bus.stop() == (0, "")
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    assert os.listdir(sbusd.directory) == []


def test_a_pidfile_of_a_running_process_is_an_error_and_the_socket_is_removed(sbusd):
    pidfile = Path(sbusd.path("pid"))
    pidfile.write_text(f"{os.getpid()}\n")
    status, err = sbusd.fail("-a", sbusd.path(), "-p", str(pidfile))
    assert (status, err) == (1, f"sbusd: {pidfile} exists: is sbusd running already?\n")
    assert pidfile.read_text() == f"{os.getpid()}\n"
    assert not os.path.exists(sbusd.path())


def test_a_pidfile_of_a_vanished_process_is_replaced(sbusd):
    with subprocess.Popen([sys.executable, "-c", ""]) as ended:
        pass  # waited for: its pid names no process now
    pidfile = Path(sbusd.path("pid"))
    pidfile.write_text(f"{ended.pid}\n")
    bus = sbusd.serve("-a", sbusd.path(), "-p", str(pidfile))
    assert pidfile.read_text() == f"{bus.process.pid}\n"


# -- -c --------------------------------------------------------------------------------------


def test_c_exits_when_the_last_client_leaves(sbusd):
    bus = sbusd.serve("-c", "-a", sbusd.path())
    first, second = connect(sbusd.path()), connect(sbusd.path())
    assert whoami(first).startswith(b"CMSG !/cred/whoami\0")
    first.close()
    assert whoami(second).startswith(b"CMSG !/cred/whoami\0")  # still serving
    second.close()
    assert bus.finish() == (0, "")
    assert not os.path.exists(sbusd.path())


def sun_path(name: bytes) -> bytes:
    """The abstract address the reference binds for ``/dev/unix/abstract/00<hex of name>``:
    the whole sun_path, NUL-padded to 108 bytes."""
    return (b"\0" + name).ljust(108, b"\0")


# -- -u --------------------------------------------------------------------------------------


@as_root
def test_u_refuses_a_user_not_listed_right_after_accept(sbusd):
    address = sun_path(hex_name().encode())
    sbusd.serve("-u", str(OTHER_UID), "-a", "/dev/unix/abstract/" + address.hex())
    assert whoami_as(THIRD_UID, address) is None
    reply = whoami_as(OTHER_UID, address)
    assert reply is not None
    assert reply.rsplit(b"/", 2)[1] == str(OTHER_UID).encode()  # .../gid/uid/pid


def test_u_always_admits_the_user_running_sbusd(sbusd):
    sbusd.serve("-u", str(OTHER_UID), "-a", sbusd.path())
    assert whoami(connect(sbusd.path())).startswith(b"CMSG !/cred/whoami\0")


@as_root
def test_u_takes_user_names(sbusd):
    import pwd

    nobody = pwd.getpwuid(OTHER_UID).pw_name
    address = sun_path(hex_name().encode())
    sbusd.serve("-u", nobody, "-a", "/dev/unix/abstract/" + address.hex())
    assert whoami_as(OTHER_UID, address) is not None
    assert whoami_as(THIRD_UID, address) is None


def test_an_unknown_user_is_an_error(sbusd):
    assert sbusd.fail("-u", "no-such-user-here", "-a", sbusd.path()) == (
        1,
        "sbusd: unknown user 'no-such-user-here'\n",
    )
    assert not os.path.exists(sbusd.path())


# -- addresses -------------------------------------------------------------------------------


def test_random_abstract_address_is_printed_and_reachable(sbusd):
    out = sbusd.serve("-a", "/dev/unix/abstract").out.decode()
    prefix, _, name = out.rstrip("\n").rpartition("/")
    assert (prefix, out.count("\n")) == ("/dev/unix/abstract", 1)
    # as the reference prints it: the whole sun_path, its leading NUL included
    assert len(name) == 2 * 108 and name.startswith("00")
    exchange(bytes.fromhex(name))


def test_an_address_nobody_can_read_is_an_error_and_leaves_no_pidfile(sbusd):
    read_end, write_end = os.pipe()
    os.close(read_end)  # printing the random address fails: its name would be lost
    pidfile = Path(sbusd.path("pid"))
    try:
        bus = sbusd.start("-a", "/dev/unix/abstract", "-p", str(pidfile), stdout=write_end)
    finally:
        os.close(write_end)
    status, err = bus.finish()
    assert status == 1
    assert err.startswith("sbusd: cannot print the address /dev/unix/abstract/")
    assert err.endswith(": Broken pipe\n")
    assert not pidfile.exists()


def test_abstract_address_in_hex(sbusd):
    name = hex_name().encode()
    assert sbusd.serve("-a", "/dev/unix/abstract/00" + name.hex()).out == b""
    exchange(sun_path(name))  # the reference's clients connect with the whole sun_path


def test_an_abstract_address_in_use_is_an_error(sbusd):
    name = hex_name().encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as other:
        other.bind(sun_path(name))
        status, err = sbusd.fail("-r", "-a", "/dev/unix/abstract/00" + name.hex())
    assert (status, err.endswith(": Address already in use\n")) == (1, True)


def test_bad_hex_is_an_error(sbusd):
    status, err = sbusd.fail("-a", "/dev/unix/abstract/xyz")
    assert (status, err) == (
        1,
        "sbusd: bad abstract address '/dev/unix/abstract/xyz': not hexadecimal\n",
    )


def test_inherited_socket_dev_fd(sbusd):
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as inherited:
        inherited.bind(sbusd.path())
        fd = inherited.fileno()
        bus = sbusd.serve("-g", "-a", f"/dev/fd/{fd}", pass_fds=[fd])
    exchange(sbusd.path())
    status, err = bus.stop()
    assert (status, err) == (
        0,
        "sbusd: ignoring -g and -o: an inherited socket keeps its permissions\n",
    )
    # the socket file belongs to whoever made the socket: sbusd leaves it
    assert stat.S_ISSOCK(os.stat(sbusd.path()).st_mode)


def test_a_dev_fd_that_is_no_socket_is_an_error(sbusd):
    status, err = sbusd.fail("-a", "/dev/fd/0")
    assert (status, err.startswith("sbusd: cannot listen on /dev/fd/0: ")) == (1, True)


# -- daemon mode -----------------------------------------------------------------------------


def test_daemon_returns_once_ready_and_serves_until_sigterm(sbusd):
    done = sbusd.daemon("-a", sbusd.path())
    assert (done.returncode, done.stdout) == (0, b"")
    pidfile = sbusd.daemons[-1]
    pid = int(pidfile.read_text())
    assert alive(pid)
    assert os.getsid(pid) != os.getsid(0)  # a session of its own: no terminal to lose
    exchange(sbusd.path())
    os.kill(pid, signal.SIGTERM)
    wait_for_exit(pid)
    assert not pidfile.exists()
    assert not os.path.exists(sbusd.path())


def test_daemon_prints_a_random_abstract_address_before_returning(sbusd):
    done = sbusd.daemon("-a", "/dev/unix/abstract")
    assert done.returncode == 0
    exchange(bytes.fromhex(done.stdout.decode().strip().rpartition("/")[2]))


def test_daemon_failure_is_reported_by_the_command(sbusd, live_socket):
    done = sbusd.daemon("-a", sbusd.path())
    assert done.returncode == 1
    assert sbusd.daemon_stderr() == (
        f"sbusd: cannot listen on {sbusd.path()}: Address already in use\n"
    )
    assert not sbusd.daemons[-1].exists()


# -- usage -----------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [("-x",), ("-a",), ("extra",)])
def test_usage_errors(sbusd, args):
    status, err = sbusd.fail(*args)
    assert status == 1
    assert err.startswith("sbusd: ")
    assert err.endswith("usage: sbusd [-a address] [-f | -p pidfile] [-u user] ... [-cgor]\n")


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_prints_the_options_on_stdout_and_starts_nothing(flag, tmp_path):
    """What a new user types first; combined with other flags, help wins and nothing is
    bound or written."""
    done = subprocess.run(
        [str(SBUSD), flag, "-a", str(tmp_path / "bus"), "-p", str(tmp_path / "pid")],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(
        "usage: sbusd [-a address] [-f | -p pidfile] [-u user] ... [-cgor]\n"
    )
    for option in ("-a address", "-f", "-p pidfile", "-u user", "-c", "-g, -o", "-r", "-h, --help"):
        assert f"\n  {option} " in done.stdout, option
    assert list(tmp_path.iterdir()) == []
