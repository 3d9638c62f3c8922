"""An HTTP answer for the requests websockets' own parser cannot read, and for clients that
half-close once their request is out.

websockets reads the request head itself, before `process_request` (our routes) runs, and it
reads no request body: a `Content-Length` other than 0 or a `Transfer-Encoding` (`curl -d`, a
form, a proxy's POST health check), like an HTTP/2 preface, a line not ended by CRLF or a path
that is not ASCII, makes it close the connection without a word ("Empty reply from server", a
proxy's 502); a TLS handshake (`https://` to this plain port) even waited 10 s for a line that
never came. So the connection runs the same parser on a copy of the head first; when that copy
fails, it answers itself and hands websockets nothing. It is plugged in with
`serve(create_connection=...)`, websockets' option for a connection subclass (and
`process_response`, which only tells it when the answer is being written).
"""

from __future__ import annotations

from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import HeaderLineTooLong, RequestLineTooLong, TooManyHeaders
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.streams import StreamReader

from talkbridge.webchat.routes import (
    ALLOWED_METHODS,
    headers_only,
    method_not_allowed,
    text_response,
)

TLS_HANDSHAKE = b"\x16\x03"
"""How a TLS connection starts (a handshake record, TLS 1.x): `https://` to this plain port."""


class HeadReader:
    """websockets' request parser, run on a copy of the bytes before the real one sees them."""

    def __init__(self) -> None:
        self._reader = StreamReader()
        self._parser = Request.parse(self._reader.read_line)
        self._head = bytearray()
        self.done = False
        """The head was read (or refused): nothing more to look at."""
        self.beyond = 0
        """Once the head was read: how many bytes of the last `feed` came after it."""

    def feed(self, data: bytes) -> Response | None:
        """The answer to give instead of websockets when the head so far cannot be read."""
        self._head += data
        if self._head.startswith(TLS_HANDSHAKE):  # no line may ever end: it waited 10 s
            self.done = True
            return text_response(400, "this port speaks plain HTTP, not TLS: use http://\n")
        self._reader.feed_data(data)
        try:
            next(self._parser)
        except StopIteration:  # a head websockets reads: it carries on from here
            self.done = True
            self.beyond = len(self._reader.buffer)
        except Exception as exc:
            self.done = True
            return refusal(bytes(self._head), exc)
        return None


def refusal(head: bytes, exc: Exception) -> Response:
    """Why a head cannot be read, as the client can act on it. Nothing of the request is
    echoed back."""
    method, _, rest = head.partition(b" ")
    target_and_version = rest.partition(b"\r\n")[0].partition(b"\n")[0]
    version = target_and_version.rpartition(b" ")[2]
    if declares_body(head):
        if method.decode("latin-1") not in ALLOWED_METHODS:
            response = method_not_allowed(", and no request body is read")
        else:
            response = text_response(
                400,
                "a GET or HEAD request here carries no body (no Content-Length, no "
                "Transfer-Encoding)\n",
            )
    elif version.startswith(b"HTTP/") and version not in (b"HTTP/1.1", b"HTTP/1.0"):
        response = text_response(505, "only HTTP/1.1 (and HTTP/1.0) is served here\n")
    else:
        status, reason = _unreadable(exc)
        response = text_response(status, reason + "\n")
    return headers_only(response) if method == b"HEAD" else response


def declares_body(head: bytes) -> bool:
    """Whether a request head announces a body (a `Content-Length` other than 0, or any
    `Transfer-Encoding`)."""
    for line in head.partition(b"\r\n\r\n")[0].split(b"\n")[1:]:
        name, colon, value = line.partition(b":")
        name = name.strip().lower()
        if colon and name == b"transfer-encoding":
            return True
        if colon and name == b"content-length" and value.strip() != b"0":
            return True
    return False


def _unreadable(exc: Exception) -> tuple[int, str]:
    if isinstance(exc, RequestLineTooLong):
        return 414, "the request line is too long"
    if isinstance(exc, HeaderLineTooLong | TooManyHeaders):
        return 431, "the request's header fields are too large"
    if isinstance(exc, UnicodeDecodeError):
        return 400, "the method and the path must be ASCII: percent-encode other characters"
    if isinstance(exc, EOFError):  # what the parser says of a line without CRLF
        return 400, "every line of the request head must end with CRLF (\\r\\n)"
    return 400, "not an HTTP/1.1 request head this server can read (METHOD /path HTTP/1.1)"


def close_after_answer(connection: ServerConnection, request: Request, response: Response) -> None:
    """serve's `process_response` hook: it changes no answer, it only tells the connection."""
    if isinstance(connection, AnsweringConnection):
        connection.answering(response)


class AnsweringConnection(ServerConnection):
    """A websockets server connection that answers a request head websockets cannot read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_reader: HeadReader | None = HeadReader()
        self._answered = False
        self._peer_done = False
        """The client ended its sending side after its request (a half-close)."""
        self._held: bytearray | None = None
        """What came after a readable head, until its answer is decided (`answering`)."""

    def data_received(self, data: bytes) -> None:
        if self._answered:
            return  # the rest of a body it refused: read and dropped, so no reset loses the answer
        if self._held is not None:
            self._held += data
            return
        head = self._head_reader
        if head is not None:
            answer = head.feed(data)
            if head.done:
                self._head_reader = None
            if answer is not None:
                self._answer(answer)
                return
            if head.done:
                data = self._hold_beyond(data, head.beyond)
        super().data_received(data)

    def _hold_beyond(self, data: bytes, beyond: int) -> bytes:
        """The head alone goes to websockets: it reads whatever follows as WebSocket frames,
        and a pipelined second request (`GET` right behind the first) failed the connection
        with no answer to either. It is kept until the answer: frames for a socket, dropped
        otherwise (every answer closes the connection)."""
        self._held = bytearray(data[len(data) - beyond :])
        return data[: len(data) - beyond]

    def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio allows True
        """A client may end its sending side once its request is out (`socat`, `nc -N`, a
        script's `shutdown(SHUT_WR)`): its answer must still go back. websockets closed the
        connection there and then, before `process_request` had answered."""
        if self._awaits_answer():
            self._peer_done = True
            return True  # kept open for the answer; closed once it is written (`answering`)
        return super().eof_received()

    def _awaits_answer(self) -> bool:
        """A request is read and nothing was written back yet (`close_expected`: the answer
        and its EOF went out)."""
        return (
            self.request is not None
            and self.protocol.state is State.CONNECTING
            and not self.protocol.close_expected()
        )

    def answering(self, response: Response) -> None:
        """websockets is about to write `response`: the bytes held behind the head go to it
        for a socket. To a client that half-closed, the connection is closed once the answer is
        out. Else websockets waits `close_timeout` (10 s) for a close that cannot come, since
        the transport reads no more after the EOF."""
        held, self._held = self._held, None
        if response.status_code == 101:
            if held:
                super().data_received(bytes(held))  # frames sent right behind the handshake
            return
        if self._peer_done:
            self.loop.call_soon(self._close_if_answered)

    def _close_if_answered(self) -> None:
        if self.protocol.close_expected():  # the answer and our EOF went to the transport
            self.transport.close()  # flushes what it still holds, then closes

    def _answer(self, response: Response) -> None:
        """Write the answer and end the sending side; websockets still waits for a request,
        until the client closes or its `open_timeout` ends the connection."""
        self._answered = True
        self.logger.info("HTTP response sent (%d %s)", response.status_code, response.reason_phrase)
        self.transport.write(response.serialize())
        if self.transport.can_write_eof():
            self.transport.write_eof()
        else:  # TLS cannot half-close
            self.transport.close()
