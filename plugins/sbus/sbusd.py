"""``sbusd``: a drop-in for the reference sbus daemon, on the msgbroker hub.

::

    sbusd [-a address] [-f | -p pidfile] [-u user] ... [-cgor]
    sbusd -h | --help

The options are the reference's (combined flags like ``-cgor`` work, as with ``getopt``),
plus ``-h``/``--help``, which prints them on stdout and exits (0):

- ``-a address``: ``/run/sbus.socket`` by default; also ``/dev/fd/N`` (an inherited, bound
  socket), ``/dev/unix/abstract`` (a random abstract name, printed on stdout as
  ``/dev/unix/abstract/<hex>``, the hex of the whole ``sun_path`` as the reference prints
  it) and ``/dev/unix/abstract/<hex>``.
- ``-f``: stay in the foreground; stdin and stdout are closed once the socket listens, so
  a caller that reads stdout to its end knows the bus is ready. Without ``-f`` sbusd
  becomes a daemon, and the command returns (0) only once the daemon listens, or fails (1)
  with the daemon's error on stderr.
- ``-p pidfile``: ``/run/sbus.pid`` for a daemon (``/dev/null``: none); with ``-f`` there is
  none unless ``-p`` is given.
- ``-u user``: admit only these users (names or uids, repeatable), checked by SO_PEERCRED
  when a client connects. The user running sbusd is always admitted, as in the reference.
- ``-c``: exit when the last client leaves (once a client has connected).
- ``-g`` / ``-o``: give the group / others read, write and search permission on the
  socket file (mode 0700 by default).
- ``-r``: replace whatever is at the socket path (a stale socket is replaced anyway).

SIGINT and SIGTERM (and SIGHUP with ``-f``; a daemon ignores it) stop the bus: clients
are closed, and the socket file and the pidfile are removed. An error is one line
``sbusd: ...`` on stderr and exit status 1.

The bus is a :class:`~msgbroker.broker.Broker` with a single sbus listener and no other
protocol, so everything ``--listen sbus=...`` does (flood control, secret keys, ...) is
what sbusd does.
"""

from __future__ import annotations

import contextlib
import errno
import getopt
import os
import pwd
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from attrs import define, evolve, frozen
from twisted.internet import defer

from msgbroker.broker import Broker
from msgbroker.config import BrokerConfig, Listener
from msgbroker.service import BrokerService, ListenerService

from .seqpacket import (
    Credentials,
    SeqpacketAddress,
    SeqpacketPort,
    SeqpacketServerEndpoint,
    parse_address,
)
from .server import SbusFactory

PROG = "sbusd"
USAGE = "usage: sbusd [-a address] [-f | -p pidfile] [-u user] ... [-cgor]"
HELP = f"""{USAGE}

An sbus bus on a unix seqpacket socket (a drop-in for the reference sbusd).

  -a address  where to listen [/run/sbus.socket]; also /dev/fd/N (an inherited socket),
              /dev/unix/abstract (a random abstract name, printed on stdout) and
              /dev/unix/abstract/HEX
  -f          stay in the foreground (no pidfile unless -p); stdin and stdout are
              closed once the socket listens
  -p pidfile  the daemon's pidfile [/run/sbus.pid]; /dev/null: none
  -u user     admit only these users (names or uids; repeatable) and sbusd's own
  -c          exit when the last client leaves
  -g, -o      give the group, others, access to the socket file (mode 0700 otherwise)
  -r          replace whatever is at the socket path
  -h, --help  print this and exit

SIGINT and SIGTERM stop the bus (SIGHUP too with -f). Errors: one line on stderr, status 1.
"""
DEFAULT_ADDRESS = "/run/sbus.socket"
DEFAULT_PIDFILE = "/run/sbus.pid"
#: the protocol plugins sbusd does not load: it serves sbus only
OTHER_PROTOCOLS = ("ssmp", "stmp", "mm2", "mm2-extensions")
RANDOM_ABSTRACT = "/dev/unix/abstract"
#: how many random abstract names are tried before giving up (each is 107 random bytes)
_RANDOM_TRIES = 8


class SbusdError(Exception):
    """What went wrong, for one line on stderr."""


class UsageError(SbusdError):
    pass


class HelpAsked(Exception):
    """``-h`` or ``--help``: print :data:`HELP`, do nothing else."""


@frozen
class Options:
    address: str = DEFAULT_ADDRESS
    foreground: bool = False
    pidfile: str | None = None
    users: tuple[int, ...] = ()
    auto_close: bool = False
    mode: int = 0o700
    replace: bool = False


def parse_options(argv: Sequence[str]) -> Options:
    try:
        pairs, rest = getopt.getopt(list(argv), "a:cfgop:ru:h", ["help"])
    except getopt.GetoptError as e:
        raise UsageError(str(e)) from None
    if any(flag in ("-h", "--help") for flag, _ in pairs):
        raise HelpAsked
    if rest:
        raise UsageError(f"unexpected argument {rest[0]!r}")
    settings: dict[str, Any] = {}
    users: list[int] = []
    mode = 0o700
    for flag, value in pairs:
        if flag == "-a":
            settings["address"] = value
        elif flag == "-c":
            settings["auto_close"] = True
        elif flag == "-f":
            settings["foreground"] = True
        elif flag == "-g":
            mode |= 0o070
        elif flag == "-o":
            mode |= 0o007
        elif flag == "-p":
            settings["pidfile"] = value
        elif flag == "-r":
            settings["replace"] = True
        elif flag == "-u":
            users.append(user_id(value))
    if "pidfile" not in settings and not settings.get("foreground"):
        settings["pidfile"] = DEFAULT_PIDFILE
    if settings.get("pidfile") == "/dev/null":
        settings["pidfile"] = None
    return Options(users=tuple(users), mode=mode, **settings)


def user_id(text: str) -> int:
    """A ``-u`` value: a uid in decimal, or a user name."""
    if text.isdigit():
        return int(text)
    try:
        return pwd.getpwnam(text).pw_uid
    except KeyError:
        raise SbusdError(f"unknown user {text!r}") from None


def admitted(users: tuple[int, ...]) -> Callable[[Credentials], bool] | None:
    """The port's ``allow`` for ``-u``: the listed users and the one running sbusd (who
    owns the bus: the reference admits it too)."""
    if not users:
        return None
    allowed = frozenset((*users, os.getuid()))
    return lambda credentials: credentials.uid in allowed


class SbusdBroker(Broker):
    """The broker of one sbusd: no listener of its own (sbusd adds its one sbus listener,
    whose endpoint needs options no listener text carries); ``on_idle`` is called when the
    last client leaves (``-c``)."""

    on_idle: Callable[[], None] | None = None

    def listeners(self) -> tuple[Listener, ...]:
        return ()

    def msgbroker_session_closed(self, session: Any, reason: str) -> None:
        if self.on_idle is not None and not self.sessions:
            self.on_idle()


@frozen
class _Bound:
    """The endpoint the listener service starts: the port sbusd has bound already, so a bind
    error is reported in sbusd's words before any service starts."""

    port: SeqpacketPort

    def listen(self, factory: Any) -> defer.Deferred[SeqpacketPort]:
        return defer.succeed(self.port)


@define
class _Stopper:
    """Stops the reactor once, whoever asks first (a signal, ``-c``), even before it runs."""

    reactor: Any
    asked: bool = False

    def __call__(self, *_: Any) -> None:
        if not self.asked:
            self.asked = True
            self.reactor.callFromThread(self.reactor.stop)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``sbusd`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    try:
        options = parse_options(sys.argv[1:] if argv is None else argv)
    except HelpAsked:
        sys.stdout.write(HELP)
        return 0
    except UsageError as e:
        sys.stderr.write(f"{PROG}: {e}\n{USAGE}\n")
        return 1
    except SbusdError as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        return 1
    ready_pipe = None
    if not options.foreground:
        status, ready_pipe = _daemonize()
        if status is not None:
            return status
        options = _absolute(options)
    try:
        return _serve(options, ready_pipe)
    except SbusdError as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        return 1


def _daemonize() -> tuple[int | None, int | None]:
    """Fork twice (a new session, no controlling terminal). The caller's process gets
    ``(status, None)``: 0 once the daemon reports it listens, 1 if it ends first (it has
    said why on stderr). The daemon gets ``(None, fd)``: the pipe to report on. Done before
    the reactor exists, so nothing of it is shared across the fork."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child:
        os.close(write_end)
        os.waitpid(child, 0)
        with os.fdopen(read_end, "rb") as pipe:
            return (0 if pipe.read(1) else 1), None
    os.close(read_end)
    os.setsid()
    if os.fork():
        os._exit(0)  # the session leader goes: the daemon can never regain a terminal
    return None, write_end


def _absolute(options: Options) -> Options:
    """Paths made absolute, for a daemon that will ``chdir('/')`` but still removes its files
    at exit; a socket path that would then be too long for AF_UNIX stays relative (the
    daemon then keeps its working directory, see :func:`_detach`)."""
    address = options.address
    if not address.startswith("/") and len(os.fsencode(os.path.abspath(address))) < 108:
        address = os.path.abspath(address)
    pidfile = options.pidfile and os.path.abspath(options.pidfile)
    return evolve(options, address=address, pidfile=pidfile)


def _serve(options: Options, ready_pipe: int | None) -> int:
    from twisted.internet import reactor as global_reactor

    reactor: Any = global_reactor
    _log_warnings_to_stderr()
    stop = _Stopper(reactor)
    # installed before the socket listens: a signal right after readiness still cleans up
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop if options.foreground else signal.SIG_IGN)

    config = BrokerConfig(auth=("open",), no_plugins=OTHER_PROTOCOLS).validate()
    service = BrokerService(config, reactor, broker_class=SbusdBroker)
    broker: SbusdBroker = service.broker  # type: ignore[assignment]
    if options.auto_close:
        broker.on_idle = stop
    factory = SbusFactory(broker)
    port, address = _listen(reactor, options, factory)
    listener = Listener("sbus", f"unix:{address}")
    ListenerService(broker, listener, _Bound(port), factory).setServiceParent(service)
    service.startService()
    reactor.addSystemEventTrigger("before", "shutdown", service.stopService)

    status, pidfile = 0, None  # the pidfile once written: removed at exit
    try:
        if options.pidfile is not None:
            _write_pidfile(options.pidfile)
            pidfile = options.pidfile
        if options.address == RANDOM_ABSTRACT:
            _announce(address)
    except SbusdError as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        status = 1
        stop()  # through the reactor: its shutdown closes the port, removing the socket file
    else:
        _detach(ready_pipe, keep_cwd=not os.path.isabs(options.address))
    try:
        reactor.run(installSignalHandlers=False)
    finally:
        if pidfile is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(pidfile)
    return status


def _log_warnings_to_stderr() -> None:
    """Only what needs attention: stderr is for errors, as in the reference."""
    from twisted.logger import (
        FilteringLogObserver,
        LogLevel,
        LogLevelFilterPredicate,
        globalLogBeginner,
        textFileLogObserver,
    )

    to_stderr: Any = textFileLogObserver(sys.stderr)
    warnings: Any = LogLevelFilterPredicate(defaultLogLevel=LogLevel.warn)
    observer: Any = FilteringLogObserver(to_stderr, [warnings])
    globalLogBeginner.beginLoggingTo([observer], redirectStandardIO=False)


def _listen(
    reactor: Any, options: Options, factory: SbusFactory
) -> tuple[SeqpacketPort, SeqpacketAddress]:
    """Bind and listen at ``options.address``; a random abstract name is drawn again if
    taken."""
    for _ in range(_RANDOM_TRIES):
        try:
            address = parse_address(options.address)
        except ValueError as e:
            raise SbusdError(str(e)) from None
        if address.fd is not None and options.mode & 0o077:
            sys.stderr.write(
                f"{PROG}: ignoring -g and -o: an inherited socket keeps its permissions\n"
            )
        endpoint = SeqpacketServerEndpoint(
            reactor, address, options.mode, options.replace, admitted(options.users)
        )
        outcome: list[Any] = []
        endpoint.listen(factory).addBoth(outcome.append)
        result = outcome[0]
        if isinstance(result, SeqpacketPort):
            return result, address
        cause = getattr(result.value, "socketError", result.value)
        if options.address == RANDOM_ABSTRACT and getattr(cause, "errno", 0) == errno.EADDRINUSE:
            continue
        reason = cause.strerror if getattr(cause, "strerror", None) else str(cause)
        raise SbusdError(f"cannot listen on {address}: {reason}")
    raise SbusdError(f"no free random abstract address after {_RANDOM_TRIES} tries")


def _announce(address: SeqpacketAddress) -> None:
    """The random abstract name, on stdout, the only way anyone can learn it."""
    try:
        print(address, flush=True)
    except OSError as e:
        raise SbusdError(f"cannot print the address {address}: {e.strerror}") from None


def _write_pidfile(path: str) -> None:
    """``PID\\n``, mode 0644, never over another sbusd's: an existing pidfile is an error
    unless the process it names is gone (a daemon that was killed)."""
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if not _stale_pidfile(path):
                raise SbusdError(f"{path} exists: is sbusd running already?") from None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            continue
        except OSError as e:
            raise SbusdError(f"cannot create {path}: {e.strerror}") from None
        with os.fdopen(fd, "w") as f:
            os.fchmod(fd, 0o644)  # whatever the umask
            f.write(f"{os.getpid()}\n")
        return
    raise SbusdError(f"cannot create {path}: it keeps coming back")


def _stale_pidfile(path: str) -> bool:
    try:
        with open(path) as f:
            pid = int(f.read().strip())
        os.kill(pid, 0)
    except (OSError, ValueError) as e:
        # gone (ESRCH), or unreadable/garbage: only a vanished process makes it stale
        return isinstance(e, ProcessLookupError)
    return False


def _detach(ready_pipe: int | None, keep_cwd: bool) -> None:
    """Tell whoever waits that the bus is ready: stdin and stdout go to /dev/null (their
    readers see the end); a daemon also leaves its directory, drops stderr if it is a
    terminal, and writes one byte to the waiting caller."""
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        if ready_pipe is not None:
            if not keep_cwd:
                os.chdir("/")
            if os.isatty(2):
                os.dup2(devnull, 2)
    finally:
        os.close(devnull)
    if ready_pipe is not None:
        os.write(ready_pipe, b"\1")
        os.close(ready_pipe)


if __name__ == "__main__":
    sys.exit(main())
