"""The journal's observer: the hooks a broker with a journal runs, handing each message and
session event to the :class:`~.writer.JournalWriter`. Imported (with pyarrow, through the
writer) only when a journal is configured: :mod:`.plugin` is what every broker loads."""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING

from msgbroker import hookimpl
from msgbroker.auth import Accept

from . import schema

if TYPE_CHECKING:
    from msgbroker.auth import AuthResult, LoginRequest
    from msgbroker.message import Message, MessageRun, RouteResult
    from msgbroker.session import Session

    from .writer import JournalWriter

#: the ``session.data`` key holding a session's id
SESSION_KEY = "journal"


class Journal:
    """The observation hooks of a broker with a journal. Each takes a timestamp and hands a
    tuple to the :class:`JournalWriter`; nothing here touches the disk.

    Session ids count up from the journal's start time in microseconds, so they are
    unique across restarts of the broker on one directory (unless it opened more than one
    session per microsecond on average)."""

    def __init__(self, writer: JournalWriter, first_session_id: int | None = None) -> None:
        self.writer = writer
        start = time.time_ns() // 1000 if first_session_id is None else first_session_id
        self._ids = itertools.count(start)
        # bound once: these run per message
        self._message = writer.message
        self._run = writer.run
        self._session = writer.session

    @hookimpl
    def msgbroker_message_routed(self, message: Message, result: RouteResult) -> None:
        self._message(
            time.time_ns() // 1000,
            message.protocol,
            message.sender,
            message.kind,
            message.topic,
            message.payload,
            result.recipients,
            result.skipped,
            result.dropped,
            message.origin_node,
        )

    @hookimpl
    def msgbroker_run_routed(self, run: MessageRun, result: RouteResult) -> None:
        self._run(
            time.time_ns() // 1000,
            run.protocol,
            run.sender,
            run.kind,
            run.topic,
            run.count,
            run.payloads,
            result.recipients,
            result.dropped,
            run.payload_bytes,
            run.origin_node,
        )

    @hookimpl
    def msgbroker_session_opened(self, session: Session) -> None:
        session_id = next(self._ids)
        session.data[SESSION_KEY] = session_id
        self._session(
            time.time_ns() // 1000,
            schema.OPEN,
            session.protocol,
            session_id,
            None,
            session.host,
            None,
            None,
        )

    @hookimpl
    def msgbroker_session_login(
        self, session: Session, request: LoginRequest, result: AuthResult
    ) -> None:
        if isinstance(result, Accept):
            event, identity, reason = schema.LOGIN, result.identity, None
        else:
            event, identity, reason = schema.AUTH_FAILURE, request.identity, result.reason
        self._session(
            time.time_ns() // 1000,
            event,
            session.protocol,
            session.data.get(SESSION_KEY),
            identity,
            request.host or session.host,
            request.scheme,
            reason,
        )

    @hookimpl
    def msgbroker_session_closed(self, session: Session, reason: str) -> None:
        self._session(
            time.time_ns() // 1000,
            schema.CLOSE,
            session.protocol,
            session.data.get(SESSION_KEY),
            session.identity,
            session.host,
            None,
            session.close_text or str(reason),  # the reason, then what it was about
        )
