"""The skeleton of a ``msgbroker PROTOCOL ACTION ...`` command, on a blocking client.

A protocol's ``cli.py`` keeps the module contract :mod:`msgbroker.cli` loads (``NAME``,
``HELP``, ``add_arguments(parser)``, ``run(args) -> int``) and gets the plumbing from a
:class:`ClientCommand` subclass::

    class LineCommand(ClientCommand):
        options = (HOST, port(4450, "broker port [4450]"), identity(), timeout(), tls())

        def add_actions(self, add):
            add("sub", help="print what is sent to TOPIC").add_argument("topic")

        def open(self, args):
            return BlockingLineClient(args.host, args.port, ...)

        def act(self, client, args):
            return self.follow(args, lambda: subscribe(client, args),
                               (render(m) for m in client.messages()))

    COMMAND = LineCommand()
    add_arguments, run = COMMAND.add_arguments, COMMAND.run

What every command shares is here once: the connection options (:data:`HOST`,
:func:`port`, :func:`identity`, the login and TLS files) and the common actions'
arguments (from :mod:`.cliargs`, exported here), the ``connection`` group and the actions
as sub-parsers, the login scheme and identity a user gets by default, TLS
from ``--ca``/``--cert``/``--key``, errors as one line (``msgbroker: error: ...``, exit
status 1) — the protocol's own first (:meth:`ClientCommand.refused`,
:meth:`ClientCommand.failed`), then the common ones —, messages from the command line or
one per line of stdin (:func:`message_lines`), ``sub``'s announcement and its Ctrl-C
(:meth:`ClientCommand.follow`), ``sub`` reconnecting when the broker goes away
(:meth:`ClientCommand.reconnect`, a line on stderr each time), and payloads shown on one
unambiguous line (:func:`render_payload`). A broken pipe is :mod:`msgbroker.cli`'s.
"""

from __future__ import annotations

import argparse
import os
import secrets
import select
import ssl
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, BinaryIO, ClassVar

from msgbroker.cli import CommandError

from .cliargs import (
    CA,
    HOST,
    KEY,
    LOGIN,
    SCHEME,
    SECRET_FILE,
    TLS_FILES,
    Option,
    add_send,
    add_sub,
    add_topic_sub,
    cert,
    identity,
    message_argument,
    port,
    timeout,
    tls,
)
from .reconnect import Reconnect, Restored
from .session import ConnectionClosed

__all__ = [
    "CA",
    "HOST",
    "KEY",
    "LOGIN",
    "SCHEME",
    "SECRET_FILE",
    "TLS_FILES",
    "ClientCommand",
    "Option",
    "add_send",
    "add_sub",
    "add_topic_sub",
    "cert",
    "credential",
    "default_identity",
    "identity",
    "login_scheme",
    "message_argument",
    "message_lines",
    "port",
    "reason",
    "render_payload",
    "ssl_context",
    "timeout",
    "tls",
]

# -- showing payloads ------------------------------------------------------------------------------

_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def render_payload(payload: bytes) -> str:
    """``payload`` for a terminal line: UTF-8 text, escapes for the rest (``\\xNN`` for
    bytes that are not UTF-8, ``\\n``, ``\\t``, ``\\uNNNN`` ... for unprintable characters,
    ``\\\\`` for a backslash), so the output is one line and unambiguous."""
    text = payload.decode("utf-8", "surrogateescape")
    if text.isprintable() and "\\" not in text:
        return text
    out = []
    for char in text:
        code = ord(char)
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, from surrogateescape
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char.isprintable():
            out.append(char)
        elif code < 0x100:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "".join(out)


# -- what running needs --------------------------------------------------------------------------


def reason(error: BaseException) -> str:
    """An error in a few words (``Connection refused``, ...)."""
    return getattr(error, "strerror", None) or str(error) or type(error).__name__


def login_scheme(args: argparse.Namespace) -> str:
    """``--scheme``, else secret with ``--secret-file``, cert with ``--cert``, else open."""
    if getattr(args, "scheme", None):
        return str(args.scheme)
    if getattr(args, "secret_file", None):
        return "secret"
    return "cert" if args.cert else "open"


def default_identity(args: argparse.Namespace, scheme: str, name: str | None = None) -> str:
    """``name``, by default ``cli-PID-RANDOM``; with the cert scheme, the certificate's CN
    in front of it (``CN/cli-PID-RANDOM``: an identity the cert scheme accepts)."""
    generated = name or f"cli-{os.getpid()}-{secrets.token_hex(2)}"
    if scheme == "cert" and args.cert:
        from cryptography import x509
        from cryptography.x509.oid import NameOID

        try:
            with open(args.cert, "rb") as f:
                certificate = x509.load_pem_x509_certificate(f.read())
        except (OSError, ValueError) as e:
            raise CommandError(f"cannot read certificate {args.cert}: {e}") from None
        names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if names:
            common_name = names[0].value
            if isinstance(common_name, bytes):
                common_name = common_name.decode("utf-8", "replace")
            return f"{common_name}/{generated}"
    return generated


def credential(args: argparse.Namespace, scheme: str) -> bytes | None:
    """The secret in ``--secret-file`` (without its final line break); None without one."""
    if not args.secret_file:
        if scheme == "secret":
            raise CommandError("the secret scheme needs --secret-file")
        return None
    try:
        with open(args.secret_file, "rb") as f:
            return f.read().removesuffix(b"\n").removesuffix(b"\r")
    except OSError as e:
        raise CommandError(f"cannot read secret file {args.secret_file}: {e.strerror}") from None


def ssl_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """TLS when ``--tls``, ``--ca`` or ``--cert`` asks for it (None otherwise)."""
    if not (args.tls or args.ca or args.cert):
        return None
    try:
        # here, not at the top: .tls holds Twisted's TLS endpoint too, which a client
        # command without TLS should not have to import
        from .tls import ssl_context as make_context

        return make_context(args.ca, args.cert, args.key)
    except (OSError, ssl.SSLError) as e:
        raise CommandError(f"cannot set up TLS: {e}") from None


def message_lines(
    message: bytes,
    stdin: BinaryIO,
    idle: Callable[[], None] | None = None,
    interval: float = 15.0,
) -> Iterator[bytes]:
    """``message``, or with ``-`` every non-empty line of ``stdin`` (no protocol sends an
    empty line as a message). ``idle`` is called every ``interval`` seconds while stdin has
    nothing, and after each chunk read (to keep a connection alive: a heartbeat, the
    server's pings), when stdin is a real file."""
    if message != b"-":
        yield message
        return
    try:
        fd = stdin.fileno() if idle is not None else None
    except (OSError, ValueError):  # not a real file (tests): plain reads
        fd = None
    if fd is None:
        for raw in stdin:
            line = raw.removesuffix(b"\n").removesuffix(b"\r")
            if line:
                yield line
        return
    assert idle is not None
    pending = b""
    while True:
        ready, _, _ = select.select([fd], [], [], interval)
        if not ready:
            idle()
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            line = raw.removesuffix(b"\r")
            if line:
                yield line
        idle()
    line = pending.removesuffix(b"\r")
    if line:
        yield line


# -- the command ---------------------------------------------------------------------------------


class ClientCommand:
    """``msgbroker NAME ACTION ...`` on a blocking client: see the module docstring. A
    subclass sets :attr:`options` and implements :meth:`add_actions`, :meth:`open` and
    :meth:`act`; :meth:`check`, :meth:`refused`, :meth:`failed` and :meth:`where` are
    there to override."""

    #: the ``connection`` group, in ``--help``'s order
    options: ClassVar[Sequence[Option]] = ()

    # -- the module contract --------------------------------------------------------------------

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The options, in a ``connection`` group after the action (``msgbroker ssmp sub
        news --port 1``), and the actions as sub-parsers (``args.action``)."""
        common = argparse.ArgumentParser(add_help=False)
        group = common.add_argument_group("connection")
        for option in self.options:
            option.add_to(group)
        actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

        def add(name: str, **settings: Any) -> argparse.ArgumentParser:
            sub: argparse.ArgumentParser = actions.add_parser(name, parents=[common], **settings)
            return sub

        self.add_actions(add)

    def run(self, args: argparse.Namespace) -> int:
        """Check the arguments, connect, act, close; every error a one-line
        :class:`~msgbroker.cli.CommandError`."""
        self.check(args)
        client = self.connect(args)
        try:
            return self.act(client, args)
        except Exception as e:
            message = self.failed(e, args)
            if message is None and isinstance(e, ConnectionClosed | TimeoutError):
                message = f"{self.where(args)}: {reason(e)}"
            if message is None:
                raise
            raise CommandError(message) from None
        finally:
            client.close()

    def connect(self, args: argparse.Namespace) -> Any:
        """:meth:`open`, its errors told in one line."""
        try:
            return self.open(args)
        except CommandError:
            raise
        except Exception as e:
            message = self.refused(e, args) or self._refusal(e, args)
            if message is None:
                raise
            raise CommandError(message) from None

    def _refusal(self, error: Exception, args: argparse.Namespace) -> str | None:
        where = self.where(args)
        if isinstance(error, ssl.SSLError):
            return f"TLS with {where} failed: {error.reason or error}"
        if isinstance(error, ConnectionClosed):
            return f"{where}: {reason(error)}"
        if isinstance(error, OSError):
            return f"cannot connect to {where}: {reason(error)}"
        if isinstance(error, ValueError):  # an identity the protocol cannot carry, say
            return str(error)
        return None

    # -- for subclasses ----------------------------------------------------------------------

    def add_actions(self, add: Callable[..., argparse.ArgumentParser]) -> None:
        """Add the actions: ``add(name, help=..., description=...)`` is a sub-parser that
        already has the connection options."""
        raise NotImplementedError

    def check(self, args: argparse.Namespace) -> None:
        """Refuse what can be refused before connecting (raise CommandError)."""

    def open(self, args: argparse.Namespace) -> Any:
        """The connected (logged-in) blocking client."""
        raise NotImplementedError

    def act(self, client: Any, args: argparse.Namespace) -> int:
        """Do ``args.action``; the exit status."""
        raise NotImplementedError

    def refused(self, error: Exception, args: argparse.Namespace) -> str | None:
        """The line for an error of :meth:`open` the protocol knows (a refused login);
        None for the common ones (TLS, refused connections, ...)."""
        return None

    def failed(self, error: Exception, args: argparse.Namespace) -> str | None:
        """The line for an error of :meth:`act` the protocol knows; None for the common
        ones (the connection lost)."""
        return None

    def where(self, args: argparse.Namespace) -> str:
        """The broker, as the error lines name it."""
        return f"{args.host}:{args.port}"

    def reconnect(self, args: argparse.Namespace) -> Reconnect:
        """How ``sub``'s client reconnects once subscribed (:meth:`follow`): the default
        waits, each loss and reconnection told on stderr."""
        where = self.where(args)

        def lost(error: BaseException) -> None:
            _say(f"lost the connection to {where} ({reason(error)}); reconnecting")

        def restored(done: Restored) -> None:
            what = getattr(args, "following", None)
            again = f"; subscribed to {what} again" if what else ""
            _say(f"reconnected to {where}{again}")

        return Reconnect(on_lost=lost, on_restored=restored)

    def login(self, args: argparse.Namespace) -> tuple[str, str, bytes | None]:
        """(identity, scheme, credential) from ``--id``, ``--scheme``, ``--secret-file``
        and ``--cert``, the defaults filled in; also kept as ``args.login`` and
        ``args.scheme`` for the error lines."""
        args.scheme = login_scheme(args)
        args.login = args.id or default_identity(args, args.scheme)
        return args.login, args.scheme, credential(args, args.scheme)

    def follow_topics(self, args: argparse.Namespace, client: Any, lines: Iterable[str]) -> int:
        """:meth:`follow` for a client with ``subscribe(topic, presence=...)`` and an
        ``identity``: subscribes to ``args.topics`` (``--presence``)."""

        def subscribe() -> tuple[str, str]:
            for topic in args.topics:
                client.subscribe(topic, presence=args.presence)
            return " ".join(args.topics), str(client.identity)

        return self.follow(args, subscribe, lines, client)

    def follow(
        self,
        args: argparse.Namespace,
        subscribe: Callable[[], tuple[str, str]],
        lines: Iterable[str | None],
        client: Any = None,
    ) -> int:
        """``sub``: ``subscribe()`` (its subscriptions in force when it returns, and what
        it subscribed to and as whom, for stderr), then print each of ``lines`` (None: not
        shown) until Ctrl-C, which exits 0. Once subscribed, ``client`` (a blocking client)
        reconnects (:meth:`reconnect`) when the broker goes away; an error before ends it."""
        try:
            what, who = subscribe()
            args.following = what
            if client is not None:
                client.set_reconnect(self.reconnect(args))
            _say(f"subscribed to {what} as {who} on {self.where(args)}; Ctrl-C to stop")
            for line in lines:
                if line is not None:
                    sys.stdout.write(line + "\n")
                    sys.stdout.flush()
        except KeyboardInterrupt:
            return 0
        return 0  # the stream only ends by raising


def _say(line: str) -> None:
    """A line on stderr, at once."""
    sys.stderr.write(f"msgbroker: {line}\n")
    sys.stderr.flush()
