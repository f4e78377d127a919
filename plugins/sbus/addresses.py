"""Unix seqpacket sockets without Twisted: addresses as ``sbusd -a`` writes them, binding a
listening socket safely, connecting a blocking client, and SO_PEERCRED credentials. The
transport in :mod:`.seqpacket` and the clients and ``sbusd`` build on these."""

from __future__ import annotations

import errno
import os
import socket
import struct
import tempfile

from attrs import frozen

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@frozen
class Credentials:
    """A peer's SO_PEERCRED, as the kernel saw it when the socket was connected."""

    pid: int
    uid: int
    gid: int


def peer_credentials(sock: socket.socket) -> Credentials:
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return Credentials(pid, uid, gid)


# -- addresses -----------------------------------------------------------------------------


def default_path() -> str:
    """Where the embedded default listens (its directory is made, mode 0700, on bind)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "msgbroker", "sbus.socket")
    return os.path.join(tempfile.gettempdir(), f"msgbroker-{os.getuid()}", "sbus.socket")


#: ``sizeof(sockaddr_un.sun_path)`` on Linux
SUN_PATH = 108


@frozen
class SeqpacketAddress:
    """Where an sbus bus is: a filesystem ``path``, an ``abstract`` name (bytes, without the
    leading NUL), or an inherited, already bound socket ``fd`` (``/dev/fd/N``).

    The reference's ``/dev/unix/abstract/<hex>`` is the hex of the whole ``sun_path``
    (``00`` first, then the name, padded with NULs to 108 bytes), and it binds and connects
    with the full ``sockaddr_un`` length: so the name is those 107 bytes, trailing NULs
    included, and that is what such addresses hold here too. ``@name`` is Twisted's form:
    exactly ``name``, nothing padded."""

    path: str | None = None
    abstract: bytes | None = None
    fd: int | None = None

    def sockaddr(self) -> str | bytes:
        if self.abstract is not None:
            return b"\0" + self.abstract
        if self.path is None:
            raise ValueError("an inherited socket has no address to bind or connect to")
        return self.path

    def __str__(self) -> str:
        if self.abstract is not None:
            if len(self.abstract) == SUN_PATH - 1:  # the reference's form, as it prints it
                return "/dev/unix/abstract/" + (b"\0" + self.abstract).hex()
            return "@" + self.abstract.decode("utf-8", "backslashreplace")
        if self.fd is not None:
            return f"/dev/fd/{self.fd}"
        return self.path or ""


def parse_address(text: str) -> SeqpacketAddress:
    """An address as ``sbusd -a`` takes it: a path; ``/dev/fd/N`` (an inherited socket);
    ``/dev/unix/abstract`` (a random abstract name); ``/dev/unix/abstract/<hex>`` (the hex
    of a ``sun_path``, as the reference prints it: an abstract name when it starts with
    ``00``, else a path); or ``@name`` (an abstract name in text, as Twisted writes them)."""
    if text.startswith("/dev/fd/"):
        number = text[len("/dev/fd/") :]
        if not number.isdigit():
            raise ValueError(f"bad file descriptor address {text!r}")
        return SeqpacketAddress(fd=int(number))
    if text == "/dev/unix/abstract":
        # like the reference: every byte of sun_path after the leading NUL is random
        return SeqpacketAddress(abstract=os.urandom(SUN_PATH - 1))
    if text.startswith("/dev/unix/abstract/"):
        try:
            sun_path = bytes.fromhex(text[len("/dev/unix/abstract/") :])
        except ValueError:
            raise ValueError(f"bad abstract address {text!r}: not hexadecimal") from None
        if len(sun_path) > SUN_PATH:
            raise ValueError(f"bad abstract address {text!r}: longer than {SUN_PATH} bytes")
        if not sun_path:
            raise ValueError(f"bad abstract address {text!r}: empty")
        if sun_path[0]:
            return SeqpacketAddress(path=os.fsdecode(sun_path.split(b"\0", 1)[0]))
        return SeqpacketAddress(abstract=sun_path[1:].ljust(SUN_PATH - 1, b"\0"))
    if text.startswith("@"):
        return SeqpacketAddress(abstract=text[1:].encode())
    if not text:
        raise ValueError("empty socket address")
    return SeqpacketAddress(path=text)


def new_socket() -> socket.socket:
    return socket.socket(
        socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
    )


def bind(
    address: SeqpacketAddress, mode: int = 0o700, replace: bool = False, backlog: int = 128
) -> socket.socket:
    """A listening socket at ``address``. A socket file gets ``mode`` before ``listen``, so
    no client can connect while it is still more open than asked. An existing socket file
    is replaced when ``replace`` is set, or when it is stale (nobody accepts on it: a
    broker that was killed); a live one is ``EADDRINUSE``."""
    if address.fd is not None:
        sock = socket.socket(fileno=os.dup(address.fd))
        if sock.type != socket.SOCK_SEQPACKET or sock.family != socket.AF_UNIX:
            sock.close()
            raise OSError(errno.EINVAL, f"/dev/fd/{address.fd} is not a unix seqpacket socket")
        sock.setblocking(False)
        sock.listen(backlog)  # harmless if it listens already
        return sock
    sock = new_socket()
    try:
        if (
            address.path is not None
            and os.path.exists(address.path)
            and (replace or _stale(address.path))
        ):
            os.unlink(address.path)
        sock.bind(address.sockaddr())
        if address.path is not None:
            os.chmod(address.path, mode)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def _stale(path: str) -> bool:
    import stat

    if not stat.S_ISSOCK(os.stat(path).st_mode):
        return False  # never remove what is not a socket
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    finally:
        probe.close()
    return False


def connect(address: SeqpacketAddress | str, timeout: float | None = None) -> socket.socket:
    """A blocking client socket connected to ``address`` (for clients and tools)."""
    if isinstance(address, str):
        address = parse_address(address)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        if address.fd is not None:
            sock.close()
            sock = socket.socket(fileno=os.dup(address.fd))
        else:
            sock.connect(address.sockaddr())
    except BaseException:
        sock.close()
        raise
    return sock
