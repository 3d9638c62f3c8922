"""Lua scripts of distributed mode: each multi-step change is one atomic step on the server."""

from __future__ import annotations

from typing import Final

from talkbridge.store._redis_lua import ACCEPT_HEAD, RECORD_SENT_HEAD

# KEYS: lease[, fence]  ARGV: node, ttl_ms  -> {held 0|1, ms left, holder}
# The fence key (`ClusterKeys.fence`) is missing on a new deployment's first lease, and when
# Redis was emptied (FLUSHDB) or the deployment's keys deleted: the leases went with it, but
# their old holders learn so only at their next renewal. No lease is taken for a TTL from then
# on, so they have stopped what the leases guarded before another node starts it (a node
# started meanwhile included: it cannot tell an emptied Redis from a new one).
ACQUIRE: Final = """
if #KEYS == 2 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local fence = redis.call('GET', KEYS[2])
  if not fence then
    fence = now + tonumber(ARGV[2])
    redis.call('SET', KEYS[2], fence)
  end
  if tonumber(fence) > now then return {0, tonumber(fence) - now, false} end
end
local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
  return {1, tonumber(ARGV[2]), ARGV[1]}
end
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(ARGV[2]), cur}
end
return {0, redis.call('PTTL', KEYS[1]), cur}
"""

# KEYS: lease  ARGV: node, ttl_ms  -> 1 renewed, 0 not ours (any more)
RENEW: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS: lease  ARGV: node  -> 1 released, 0 not ours
RELEASE: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# A node says it is alive, with the number of inbound shards it splits the bus into: a node
# that joins (ARGV[4] = 1) is refused while live nodes split it into another number; a beat
# records the number if it is gone (a FLUSHDB), so a node joining later is checked still.
# A node that could not start one of its connections (ARGV[5] = 1) is listed as limited too.
# KEYS: nodes, shard count, limited nodes  ARGV: node, ttl_ms, shards, joining, limited
#   -> {1, live nodes (this one included), live limited ones} or {0, the live nodes' shard count}
HEARTBEAT: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if ARGV[4] == '1' then
  local others = redis.call('ZCARD', KEYS[1])
  if redis.call('ZSCORE', KEYS[1], ARGV[1]) then others = others - 1 end
  local current = redis.call('GET', KEYS[2])
  if current and current ~= ARGV[3] and others > 0 then
    return {0, tonumber(current)}
  end
  redis.call('SET', KEYS[2], ARGV[3])
else
  redis.call('SET', KEYS[2], ARGV[3], 'NX')
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
if ARGV[5] == '1' then
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
else
  redis.call('ZREM', KEYS[3], ARGV[1])
end
return {1, redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[3])}
"""

# The store's ACCEPT (dedupe + pending inbox [+ history]) and the XADD onto the inbound bus in
# one step: a crash can never leave a message accepted (so deduped) but not on the bus.
# KEYS: seen, pending, bodies, arrival, seen before retention, stream[, history]
# ARGV: message_id, member, body[, history entry]  -> 0 duplicate, 1 accepted
ACCEPT_PUBLISH: Final = (
    ACCEPT_HEAD
    + """redis.call('XADD', KEYS[6], '*', 'm', ARGV[3])
if #KEYS == 7 then
  local seq = redis.call('HINCRBY', KEYS[7], 'n', 1)
  redis.call('HSET', KEYS[7], tostring(seq), ARGV[4])
end
return 1
"""
)

# The store's COMPLETE plus the acknowledgement of the bus entry, in one step.
# KEYS: pending, bodies, stream  ARGV: member, group, entry id
COMPLETE_ACK: Final = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('XACK', KEYS[3], ARGV[2], ARGV[3])
return redis.call('XDEL', KEYS[3], ARGV[3])
"""

# An entry of a shard stream no node reads any more (`cluster.shards` was lowered) moves onto the
# stream its thread maps to now, marked as possibly worked on already; taken out first, so two
# nodes moving the same entry move it once.
# KEYS: from stream, to stream  ARGV: entry id, message JSON  -> 1 moved, 0 gone already
MOVE_ENTRY: Final = """
if redis.call('XDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('XADD', KEYS[2], '*', 'm', ARGV[2], 'r', '1')
return 1
"""

# Read new entries of held streams (inbound shards, a connection's send requests): each only
# while this node holds its lease in Redis, so a read that reaches Redis after the lease moved
# on (the node paused, or slow to hear of the loss) takes nothing that the new holder (whose
# take-over claim may be over) would not see. Nothing is ever put back: what a holder took stays
# pending, in stream order, for the next holder's claim.
# KEYS: lease, stream, lease, stream, ...  ARGV: node (the consumer), group, count
#   -> per pair: {0} not this node's lease; {1, the group's last delivered id} nothing new;
#      {2, entries}; {3, error} (the stream or its group is gone)
FENCED_READ: Final = """
local out = {}
for i = 1, #KEYS, 2 do
  local stream = KEYS[i + 1]
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then
    out[#out + 1] = {0}
  else
    local r = redis.pcall(
      'XREADGROUP', 'GROUP', ARGV[2], ARGV[1], 'COUNT', ARGV[3], 'STREAMS', stream, '>')
    if type(r) == 'table' and r.err then
      out[#out + 1] = {3, r.err}
    elseif r and r[1] then
      out[#out + 1] = {2, r[1][2]}
    else
      local last = '0-0'
      for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
        local fields = {}
        for j = 1, #g, 2 do fields[g[j]] = g[j + 1] end
        if fields['name'] == ARGV[2] then last = fields['last-delivered-id'] end
      end
      out[#out + 1] = {1, last}
    end
  end
end
return out
"""

# KEYS: stream  ARGV: group, entry id
ACK: Final = """
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return redis.call('XDEL', KEYS[1], ARGV[2])
"""

# KEYS: reply stream  ARGV: ttl_ms, then field/value pairs
REPLY: Final = """
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', 10000, '*', unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return id
"""

# A keyed send about to call the platform: sent already, being sent by another, or ours now.
# KEYS: sent, sent before retention, claim  ARGV: idempotency key, token, ttl_ms
# -> {1, message ids JSON} sent already; {0} claimed for the token; {2, ms left} another sends it
CLAIM_SEND: Final = """
local done = redis.call('HGET', KEYS[1], ARGV[1]) or redis.call('HGET', KEYS[2], ARGV[1])
if done then return {1, done} end
if redis.call('SET', KEYS[3], ARGV[2], 'NX', 'PX', ARGV[3]) then return {0} end
return {2, redis.call('PTTL', KEYS[3])}
"""

# The store's RECORD_SENT, and the claim given up in the same step (only if still the token's):
# no instant in which the send is neither claimed nor recorded.
# KEYS: sent, order, counter, claim  ARGV: idempotency key, message ids JSON, token
SENT_CLAIMED: Final = (
    RECORD_SENT_HEAD
    + """if redis.call('GET', KEYS[4]) == ARGV[3] then redis.call('DEL', KEYS[4]) end
return 1
"""
)
