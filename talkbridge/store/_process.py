"""The group-commit writer in a child process: SQLite commits on another core than the loop.

Why not a thread: SQLite releases the GIL around each statement and then has to win it back from
an event loop that is busy computing turns, which takes up to the interpreter's switch interval
each time. So a writer thread only made progress while the loop idled, and the loop idled waiting
for its commits: `benchmarks/core.py` spent about 36 µs per message idle in `epoll`, a quarter of
the time, with the writer's work never overlapping the turns'. A process has its own GIL.

The cost is serializing: each loop turn's operations go to the child as one frame on a
socketpair (marshal, or pickle for anything else), and each batch's results come back as one
pickled frame. Operations are named (a `BulkOp`'s name or a
method name of the operations object), since the child has its own copy of them, built by the
`setup` function it is started with.

The child is forked by a small fork server (one per bridge process, started with the first store
and ending with it) that preloaded the store's module: a child starts in a few milliseconds and
never inherits the loop's threads. Not `multiprocessing`: its forkserver re-runs the parent's main
script in every child, which would start a second bridge in any script not guarded by
`if __name__ == "__main__"`. It ignores SIGINT and SIGTERM (a Ctrl-C or a
`systemctl stop` reaches the whole process group, and the bridge still drains through its store)
and exits when the parent's end of the socket closes, whether by `stop()` or by the parent dying.

A child that dies is replaced. Calls it had not answered fail with an error that says so; writes
nobody waits for that it had not confirmed (a result for a later call confirms them) are sent to
the new child first, so a crash of the writer alone loses none of them.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import marshal
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from talkbridge.cancellation import cancel_and_wait
from talkbridge.errors import StoreError
from talkbridge.store._checkpoint import WalCheckpointer
from talkbridge.store._writer import (
    MAX_BATCH,
    BatchRunner,
    BulkOp,
    QueueingWriter,
    Token,
    _Item,
    _Result,
    settle,
)

log = logging.getLogger("talkbridge.store")

_HEADER = struct.Struct("!I")
_READY = -1
_HEALTH = -2
"""The token of a result that is no operation's: whether writes fail (`BatchRunner.failing`)."""
RESTART_PAUSE = 1.0
"""Seconds at least between starts of one store's writer when it keeps dying."""


class _WriterGone(StoreError):
    """The writer process ended without being asked to."""


class ChildOps(NamedTuple):
    """What the child needs to run operations: built in the child by the writer's `setup`."""

    connect: Callable[[], Any]
    resolve: Callable[[str], Callable[..., Any]]
    on_rollback: Callable[[], None]
    map_error: Callable[[Exception], Exception]
    checkpointer: WalCheckpointer | None = None


def available() -> bool:
    return hasattr(os, "fork") and hasattr(socket, "send_fds")


class _ForkServer:
    """The parent's handle on the fork server: one control socket, one request at a time."""

    _lock = threading.Lock()
    _current: _ForkServer | None = None

    def __init__(self, preload: str) -> None:
        ours, theirs = socket.socketpair()
        code = (
            "import json, sys; sys.path[:0] = json.loads(sys.argv[1]);"
            "from talkbridge.store._process import fork_server;"
            "fork_server(int(sys.argv[2]), sys.argv[3])"
        )
        paths = [p for p in sys.path if p]
        self._process = subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(paths), str(theirs.fileno()), preload],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self._control = ours
        self._owner = os.getpid()

    @classmethod
    def _ours(cls) -> _ForkServer | None:
        """The running server, if this process started it (a forked copy of the bridge, e.g.
        a pre-forking server's worker, must not share the parent's)."""
        server = cls._current
        if server is None or server._owner != os.getpid() or server._process.poll() is not None:
            return None
        return server

    @classmethod
    def shutdown(cls) -> None:
        """End the fork server (its children live on until their stores close)."""
        with cls._lock:
            server, cls._current = cls._ours(), None
        if server is not None:
            server._control.close()  # EOF: it returns from its loop
            with contextlib.suppress(subprocess.TimeoutExpired):
                server._process.wait(timeout=5)

    @classmethod
    def fork(
        cls, sock: socket.socket, setup: Callable[..., ChildOps], args: tuple[Any, ...]
    ) -> int:
        """Start a child serving `sock` (blocking: call it off the event loop); its pid."""
        with cls._lock:
            for attempt in (1, 2):
                server = cls._ours()
                if server is None:
                    server = cls._current = cls(setup.__module__)
                try:
                    request = pickle.dumps((setup, args), protocol=pickle.HIGHEST_PROTOCOL)
                    socket.send_fds(
                        server._control, [_HEADER.pack(len(request)) + request], [sock.fileno()]
                    )
                    reply = server._control.recv(_HEADER.size)
                    if len(reply) == _HEADER.size:
                        (pid,) = _HEADER.unpack(reply)
                        return int(pid)
                except OSError:
                    if attempt == 2:
                        raise
                cls._current = None  # it died between requests: start another
            raise OSError("the sqlite fork server does not answer")


def fork_server(control_fd: int, preload: str) -> None:
    """The fork server's main loop: fork one writer child per request until the parent leaves."""
    __import__(preload)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    # Sockets are closed by `with`, not left to the collector: under `-W default` (or
    # PYTHONWARNINGS) each one left open printed a ResourceWarning as the bridge stopped.
    with socket.socket(fileno=control_fd) as control:
        while True:
            try:
                header, fds, _, _ = socket.recv_fds(control, _HEADER.size, 1)
            except OSError:
                return
            if len(header) < _HEADER.size or not fds:
                return  # the parent is gone
            (size,) = _HEADER.unpack(header)
            body = b""
            while len(body) < size:
                chunk = control.recv(size - len(body))
                if not chunk:
                    return
                body += chunk
            setup, args = pickle.loads(body)
            pid = os.fork()
            if pid == 0:
                control.close()
                code = 0
                try:
                    with socket.socket(fileno=fds[0]) as sock:
                        _serve(sock, setup, args)
                except BaseException:
                    code = 1
                os._exit(code)
            os.close(fds[0])
            control.sendall(_HEADER.pack(pid))


def op_name(fn: Callable[..., Any]) -> str:
    """The name the child knows an operation by."""
    if isinstance(fn, BulkOp):
        return fn.name
    if getattr(fn, "__self__", None) is None:
        raise TypeError(f"{fn!r} cannot run in the writer process: only store operations can")
    name: str = fn.__name__
    return name


def _frame(obj: Any) -> bytes:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


_MARSHAL, _PICKLE = b"m", b"p"
_SYNC = "__sync__"
"""An operation that does nothing: its result confirms the writes sent before it."""
SYNC_AFTER_FRAMES = 256
"""Frames of writes nobody waits for that may go unconfirmed before a sync is asked for."""


def _nothing() -> None:
    return None


def _ops_frame(ops: list[Any]) -> bytes:
    """Operations for the child. Nearly all are strings, numbers and tuples, which `marshal`
    writes in half pickle's time (~1 µs a message); a frame with anything else is pickled."""
    try:
        body = _MARSHAL + marshal.dumps(ops)
    except ValueError:
        body = _PICKLE + pickle.dumps(ops, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


def _read_ops(body: memoryview) -> Any:
    if body[:1] == _MARSHAL:
        return marshal.loads(body[1:])
    return pickle.loads(body[1:])


# -- the parent's side ----------------------------------------------------------------------------


class ProcessWriter(QueueingWriter):
    flush_at = 64
    """Measured with `benchmarks/core.py`: 16 and 256 were slower. A thread writer gains nothing
    from this (it cannot run while the loop computes)."""

    def __init__(
        self,
        *,
        name: str,
        setup: Callable[..., ChildOps],
        args: tuple[Any, ...],
        describe: str,
        not_running: Callable[[], Exception],
        replayed: Callable[[_Item], _Item] = lambda item: item,
    ) -> None:
        super().__init__(not_running=not_running)
        self._name = name
        self._setup = setup
        self._args = args
        self._describe = describe
        self._replayed = replayed
        """How a write the dead writer may have made already is sent to its successor."""
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._next = 0
        self._unconfirmed: deque[tuple[int, list[_Item]]] = deque()
        """Frames sent but not known to be committed, with the last request number given out
        when each was sent: a result for a later number confirms it (the child commits in
        order). A writer that dies has their writes nobody waits for sent to the next one."""
        self._syncing = False
        self._pid: int | None = None
        self._reader: asyncio.StreamReader | None = None
        self._stream: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None
        self._stopping = False
        self._started_at = 0.0
        self._replacing: asyncio.Task[Any] | None = None
        self.restarted = asyncio.Event()
        """Set each time a writer that died has been replaced."""
        self.restart_failed = asyncio.Event()
        """Set when a writer that died could not be replaced: the store stays down."""
        self._trouble: str | None = None
        """Why the writer is not up, for `health()`."""
        self._failing: str | None = None
        """Why its writes fail while it runs, as the child last said (`_HEALTH`)."""

    async def start(self) -> None:
        """Start the child and wait until it has opened the database (or failed to)."""
        self._loop = loop = asyncio.get_running_loop()
        self._stopping = False
        self._failing = None  # a new child has seen no failure yet
        self._started_at = loop.time()
        ours, theirs = socket.socketpair()
        try:
            self._pid = await loop.run_in_executor(
                None, _ForkServer.fork, theirs, self._setup, self._args
            )
        except OSError as exc:
            ours.close()
            raise StoreError(f"{self._describe}: cannot start the writer process: {exc}") from exc
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._reader, self._stream = await asyncio.open_unix_connection(sock=ours)
        refused: BaseException | None
        try:
            [(_, refused, _)] = await self._read()
        except (asyncio.IncompleteReadError, OSError) as failed:
            refused = StoreError(f"{self._describe}: the writer process did not start ({failed})")
        if refused is not None:
            await self._end()
            raise refused
        self._reading = loop.create_task(self._read_results(), name=f"{self._name} results")
        _running.add(self)
        self._accepting = True

    async def stop(self) -> None:
        """Refuse new operations, finish the queued ones, close the database, end the child."""
        self._stopping = True
        replacing, self._replacing = self._replacing, None
        if replacing is not None and replacing is not asyncio.current_task():
            await cancel_and_wait(replacing)  # a writer that died is not replaced any more
        if self._loop is None or self._stream is None:
            return
        try:
            reading = self._reading
            if self._accepting and reading is not None and not reading.done():
                self._accepting = False
                self._flush()
                done: asyncio.Future[None] = self._loop.create_future()
                self._send([(None, (), self._token(done))])
                with contextlib.suppress(_WriterGone):  # already logged; nothing left to close
                    await done
        finally:
            self._accepting = False
            await self._end()

    def health(self) -> dict[str, Any]:
        if self._accepting:
            if self._failing is not None:
                return {"state": "down", "error": self._failing}
            return {"state": "up"}
        if self._replacing is not None:
            return {"state": "restarting", "error": self._trouble}
        return {"state": "down", "error": self._trouble or "not open"}

    def _op(self, fn: Callable[..., Any]) -> Any:
        return op_name(fn)

    def _token(self, fut: asyncio.Future[Any]) -> Token:
        self._next += 1
        self._waiting[self._next] = fut
        return self._next

    def _send(self, items: list[_Item]) -> None:
        if self._stream is None:  # the child died and is being replaced: tell the callers
            err = self._not_running()
            for _, _, token in items:
                self._resolve(token, err)
            return
        payload: list[Any] = items  # operations are already named (`_op`)
        try:
            frame = _ops_frame(payload)
        except Exception:  # an argument that does not pickle: fail it alone
            frame = self._frame_each(payload)
        self._stream.write(frame)
        self._unconfirmed.append((self._next, items))
        if len(self._unconfirmed) > SYNC_AFTER_FRAMES and not self._syncing:
            self._sync()

    def _sync(self) -> None:
        """Only writes nobody waits for lately: ask for a result, which confirms them."""
        self._syncing = True
        done: asyncio.Future[None] = self._loop.create_future()  # type: ignore[union-attr]
        done.add_done_callback(self._synced)
        sync: Any = (_SYNC, (), self._token(done))  # named already, as `_op` names the rest
        self._enqueue(sync)

    def _synced(self, done: asyncio.Future[None]) -> None:
        self._syncing = False
        if not done.cancelled():
            done.exception()  # a writer that died: said where it is noticed

    def _confirm(self, through: int) -> None:
        """Results up to request `through` arrived: frames sent before it are committed."""
        unconfirmed = self._unconfirmed
        while unconfirmed and unconfirmed[0][0] < through:
            unconfirmed.popleft()

    def _frame_each(self, payload: list[tuple[Any, ...]]) -> bytes:
        sendable: list[tuple[Any, ...]] = []
        for item in payload:
            try:
                pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                self._resolve(item[2], TypeError(f"{item[0]}: argument cannot be sent: {exc}"))
            else:
                sendable.append(item)
        return _ops_frame(sendable)

    async def _read(self) -> list[_Result]:
        assert self._reader is not None
        header = await self._reader.readexactly(_HEADER.size)
        (size,) = _HEADER.unpack(header)
        results: list[_Result] = pickle.loads(await self._reader.readexactly(size))
        return results

    async def _read_results(self) -> None:
        try:
            while True:
                latest = 0
                for token, exc, value in await self._read():
                    if token == _HEALTH:
                        self._failing = value
                        continue
                    self._resolve(token, exc, value)
                    if token is not None and token > latest:
                        latest = token
                self._confirm(latest)
        except (asyncio.IncompleteReadError, OSError):
            pass
        if not (self._waiting or self._accepting):
            return  # stopped on purpose
        died = self._accepting and not self._stopping
        err = _WriterGone(
            f"{self._describe}: the writer process (pid {self._pid}) exited unexpectedly;"
            " writes not yet confirmed may be lost"
        )
        log.error("%s", err)
        self._trouble = str(err)
        self._accepting = False
        # Writes nobody waits for go to the next writer, those it may have made already marked
        # so (`replayed`); callers that wait were told, and may try again themselves.
        replay = [
            self._replayed(item)
            for _, items in self._unconfirmed
            for item in items
            if item[2] is None
        ]
        replay += [item for item in self._outbox if item[2] is None]  # never sent
        self._unconfirmed.clear()
        self._outbox = []
        for token in list(self._waiting):
            self._resolve(token, err)
        if died:
            await self._replace(replay)
        else:
            _lost(replay)

    async def _replace(self, replay: list[_Item]) -> None:
        """Start a new child for a writer that died, so the bridge carries on. Calls the old one
        had not answered failed (their callers were told); the writes nobody waits for that it
        had not confirmed, `replay`, go to the new one first."""
        self._replacing, self._reading = asyncio.current_task(), None
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
        loop = asyncio.get_running_loop()
        pause = RESTART_PAUSE - (loop.time() - self._started_at)
        if pause > 0:  # one that dies at once is not restarted in a tight loop
            await asyncio.sleep(pause)
        if self._stopping:
            _lost(replay)
            return
        dead = self._pid
        try:
            await self.start()
        except Exception as exc:
            log.error("%s: the writer process could not be restarted: %s", self._describe, exc)
            _lost(replay)
            self._trouble = f"the writer process could not be restarted: {exc}"
            self.restart_failed.set()
            return
        finally:
            self._replacing = None
        if replay:  # before anything else reaches the new writer
            self._send(replay)
        self._trouble = None
        log.warning(
            "%s: writer process %s replaced by %s (%d unconfirmed writes sent to it again)",
            self._describe,
            dead,
            self._pid,
            len(replay),
        )
        self.restarted.set()

    def _resolve(self, token: Token, exc: BaseException | None, value: Any = None) -> None:
        if token is None:
            settle(None, exc, value)
        elif (fut := self._waiting.pop(token, None)) is not None:
            settle(fut, exc, value)

    async def _end(self) -> None:
        _running.discard(self)
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()  # the child, if still there, reads EOF and exits
            with contextlib.suppress(OSError):
                await stream.wait_closed()
        reading, self._reading = self._reading, None
        if reading is not None:
            await reading  # ends with the connection

    def _abandon(self) -> None:
        """At interpreter exit: close our end so the child sees EOF and exits."""
        if self._stream is not None:
            with contextlib.suppress(Exception):
                self._stream.transport.abort()


def _lost(writes: list[_Item]) -> None:
    if writes:
        log.error("%d store writes nobody waited for were not made", len(writes))


_running: weakref.WeakSet[ProcessWriter] = weakref.WeakSet()


@atexit.register
def _abandon_all() -> None:
    # Stores nobody closed: their children see EOF now rather than when this process is gone.
    for writer in list(_running):
        writer._abandon()
    _ForkServer.shutdown()


# -- the child's side -----------------------------------------------------------------------------


class _Frames:
    """Length-prefixed frames (marshal or pickle, `_read_ops`) from a blocking socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray()

    def read(self, idle: Callable[[], None] | None = None) -> list[Any] | None:
        """Every complete frame there is, waiting for at least one; None when the parent is gone.
        `idle` runs first if nothing has arrived yet."""
        frames: list[Any] = []
        if idle is not None and not self._buf:
            got = self._pull(frames, socket.MSG_DONTWAIT)
            if got is None:
                return None
            if not got:
                idle()
        while not frames:
            if self._pull(frames, 0) is None:
                return None
        while self._pull(frames, socket.MSG_DONTWAIT):
            pass  # and whatever else already arrived, so it joins this batch
        return frames

    def _pull(self, frames: list[Any], flags: int) -> bool | None:
        """Receive once and take the frames completed: True if bytes came, False if none were
        there (non-blocking), None when the parent is gone."""
        try:
            chunk = self._sock.recv(1 << 20, flags)
        except BlockingIOError:
            return False
        if not chunk:
            return None
        self._buf += chunk
        self._take(frames)
        return True

    def _take(self, frames: list[Any]) -> None:
        buf, at = self._buf, 0
        while len(buf) - at >= _HEADER.size:
            (size,) = _HEADER.unpack_from(buf, at)
            end = at + _HEADER.size + size
            if len(buf) < end:
                break
            frames.append(_read_ops(memoryview(buf)[at + _HEADER.size : end]))
            at = end
        del buf[:at]


def _report(sock: socket.socket, results: list[_Result]) -> None:
    results = [r for r in results if r[0] is not None or r[1] is not None]
    if not results:
        return
    try:
        frame = _frame(results)
    except Exception:
        frame = _frame([_picklable(r) for r in results])
    sock.sendall(frame)


def _picklable(result: _Result) -> _Result:
    token, exc, _ = result
    try:
        pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as failed:
        detail = f"{type(exc).__name__}: {exc}" if exc is not None else f"result: {failed}"
        return (token, StoreError(detail), None)
    return result


def _serve(sock: socket.socket, setup: Callable[..., ChildOps], args: tuple[Any, ...]) -> None:
    ops = setup(*args)
    try:
        conn = ops.connect()
    except Exception as exc:
        _report(sock, [(_READY, exc, None)])
        return
    runner = BatchRunner(conn, on_rollback=ops.on_rollback, map_error=ops.map_error)
    keeper = ops.checkpointer
    if keeper is not None:
        keeper.start(conn)
    _report(sock, [(_READY, None, None)])
    frames = _Frames(sock)
    resolved: dict[str, Callable[..., Any]] = {_SYNC: _nothing}
    idle = keeper.idle if keeper is not None else None
    try:
        while (got := frames.read(idle)) is not None:
            items = [item for frame in got for item in frame]
            stop = items.pop() if items and items[-1][0] is None else None
            for first in range(0, len(items), MAX_BATCH):
                batch: list[_Item] = []
                for name, op_args, token in items[first : first + MAX_BATCH]:
                    fn = resolved.get(name)
                    if fn is None:
                        fn = resolved[name] = ops.resolve(name)
                    batch.append((fn, op_args, token))
                failing = runner.failing
                results = runner.run(batch)
                if runner.failing != failing:  # told the parent, for `health()`
                    results.append((_HEALTH, None, runner.failing))
                _report(sock, results)
                if keeper is not None:
                    keeper.committed()
            if stop is not None:
                if keeper is not None:
                    keeper.close()
                _report(sock, [(stop[2], runner.close(), None)])
                return
    except OSError:  # the parent is gone
        pass
    if keeper is not None:
        keeper.close()
    runner.close()
