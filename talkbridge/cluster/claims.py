"""One platform call per idempotency key, whichever node makes it.

A node that lost an inbound shard mid-send still finishes that send, and the shard's new holder
runs the turn again: without more, the reply goes out twice (as it does when a send request
reaches a connection's owner after the new holder's). So right before a keyed send calls the
platform, the queue doing it asks Redis, in one step, whether the key was sent already (the
send is then answered from the record, and nothing goes out), whether another send holds it now
(it waits until that one is recorded or gives up), or else claims it. The claim is a lease
renewed while the call runs, and it is replaced by the send's record in one step when the call
returns (given up when it fails, so another attempt may send it).

A claim is only as good as it is fresh: a node paused (SIGSTOP, a VM frozen, a long GC) or cut
off from Redis between taking the claim and calling the platform may find its claim run out and
the key claimed, sent and recorded by another node meanwhile. So right before the call, a claim
whose answer came later than `SURE_OF_LEASE` of its TTL after it was asked for is confirmed
again in Redis (renewed, only if still this send's); one that is not is looked up again.

What no claim closes: the platform call is no transaction. A node that dies, or is cut off from
Redis for longer than the claim's TTL, while its call is under way (or before its record is
written) leaves a claim that runs out; the next send of the key then calls the platform again,
though the first call may have gone through. At least once, never twice while the node that
sent first can reach Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from talkbridge.backoff import Backoff
from talkbridge.cancellation import cancel_and_wait, raise_if_cancelling
from talkbridge.cluster import scripts
from talkbridge.cluster.keys import ClusterKeys
from talkbridge.cluster.lease import SURE_OF_LEASE, Lease
from talkbridge.errors import TransientError
from talkbridge.message import SendResult

log = logging.getLogger("talkbridge.cluster.claims")

_MINE, _SENT = 0, 1
"""CLAIM_SEND's answers (2: another send holds the claim)."""


class SendClaims:
    """Claims on keyed sends, with the TTL of the cluster's leases (renewed every third)."""

    def __init__(self, client: aioredis.Redis, keys: ClusterKeys, ttl: float) -> None:
        self._client = client
        self._keys = keys
        self._ttl = ttl
        self._ms = max(1, round(ttl * 1000))
        self._claim = client.register_script(scripts.CLAIM_SEND)
        self._sent = client.register_script(scripts.SENT_CLAIMED)

    async def send_once(
        self, connection_id: str, key: str, call: Callable[[], Awaitable[SendResult]]
    ) -> SendResult:
        """`call()` (the platform call of a send with idempotency key `key`) unless the key was
        sent already, by any node: then its recorded result. Records it when it goes out."""
        result, _ = await self.claimed_send(connection_id, key, call)
        return result

    async def claimed_send(
        self, connection_id: str, key: str, call: Callable[[], Awaitable[SendResult]]
    ) -> tuple[SendResult, bool]:
        """`send_once`, and whether the send is on record (sent before, or recorded now; False
        when recording it failed, which the caller then does)."""
        token = uuid.uuid4().hex
        claim = Lease(self._client, self._keys.send_claim(connection_id, key), token, self._ttl)
        earlier = await self._fresh_claim(connection_id, key, claim)
        if earlier is not None:
            return SendResult(message_ids=tuple(earlier)), True
        # No await between the claim found fresh and the call: nothing can pause in between
        # but the process itself.
        keeper = asyncio.create_task(claim.keep(), name=f"claim:{connection_id}")
        try:
            result = await call()
        except BaseException:
            await cancel_and_wait(keeper)
            with contextlib.suppress(RedisError, OSError):  # else it runs out by itself
                await claim.release()
            raise
        await cancel_and_wait(keeper)
        return result, await self._record(connection_id, key, token, result.message_ids)

    async def _fresh_claim(self, connection_id: str, key: str, claim: Lease) -> list[str] | None:
        """Claim `key` for the claim's token (None), surely still held now; or the ids it was
        sent as. A claim answered too late for that (this node was paused, or Redis slow) is
        renewed first; one that ran out meanwhile is taken again, or found sent by another."""
        loop = asyncio.get_running_loop()
        sure_for = self._ttl * SURE_OF_LEASE
        while True:
            earlier, asked = await self._take(connection_id, key, claim.node_id)
            if earlier is not None:
                return earlier
            while loop.time() - asked > sure_for:
                asked = loop.time()
                try:
                    if not await claim.renew():
                        break
                except (RedisError, OSError) as exc:
                    raise_if_cancelling()
                    raise TransientError(f"cannot confirm the send's claim: {exc}") from exc
            else:
                return None
            log.warning(
                "%s: the claim on %s ran out before its send began (this node was paused or "
                "cut off from redis); looking again",
                connection_id,
                key,
            )

    async def _take(
        self, connection_id: str, key: str, token: str
    ) -> tuple[list[str] | None, float]:
        """Claim `key` for `token` (None), or the ids it was sent as; waits while another
        send holds it. With it, the loop's time right before the answering request was made.
        A Redis error is a passing failure: the queue retries the send."""
        k = self._keys
        keys = [
            k.sent(connection_id),
            k.sent_before_retention(connection_id),
            k.send_claim(connection_id, key),
        ]
        backoff: Backoff | None = None
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time()
            state, value = await self._try(keys, key, token)
            if state == _MINE:
                return None, asked
            if state == _SENT:
                return list(json.loads(value)), asked
            if backoff is None:  # no event to wait for: another node's call, seen through Redis
                log.info("%s: %s is being sent by another send; waiting", connection_id, key)
                backoff = Backoff(base=0.02, cap=min(1.0, self._ttl / 3))
            await asyncio.sleep(backoff.next())

    async def _try(self, keys: list[str], key: str, token: str) -> tuple[int, str]:
        """(_MINE, ""), (_SENT, ids JSON), or (2, ms the other's claim has left)."""
        try:
            answer = await self._claim(keys=keys, args=[key, token, self._ms])
        except (RedisError, OSError) as exc:
            raise_if_cancelling()
            raise TransientError(f"cannot claim the send in redis: {exc}") from exc
        return int(answer[0]), str(answer[1]) if len(answer) > 1 else ""

    async def _record(
        self, connection_id: str, key: str, token: str, message_ids: Sequence[str]
    ) -> bool:
        k = self._keys
        keys = [
            k.sent(connection_id),
            k.sent_order(connection_id),
            k.sent_count(),
            k.send_claim(connection_id, key),
        ]
        try:
            await self._sent(keys=keys, args=[key, json.dumps(list(message_ids)), token])
        except (RedisError, OSError) as exc:  # the queue's own record follows (retried)
            raise_if_cancelling()
            log.warning("%s: recording the send of %s failed: %s", connection_id, key, exc)
            return False
        return True
