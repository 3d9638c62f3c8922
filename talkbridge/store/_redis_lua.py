"""The Lua scripts of the Redis store: each multi-key operation runs as one atomic script.

Scripts never invent key names: every key comes from `RedisKeys`, either as a KEYS argument or as
a name stored beside the data when it was written (the delivery hash's `q`, the pairing's `tk`),
plus the delivery-hash prefix `RedisKeys.hook_delivery("")` passed as ARGV[1] to the hook scripts.
"""

from __future__ import annotations

from typing import Final

# KEYS: seen, pending, bodies, arrival, seen before retention[, history]
# ARGV: message_id, member, body[, entry]
ACCEPT_HEAD: Final = """
if redis.call('ZSCORE', KEYS[1], ARGV[1]) or redis.call('SISMEMBER', KEYS[5], ARGV[1]) == 1 then
  return 0
end
local n = redis.call('INCR', KEYS[4])
redis.call('ZADD', KEYS[1], n, ARGV[1])
redis.call('ZADD', KEYS[2], n, ARGV[2])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
"""
"""Dedupe (ids scored by arrival, plus the pre-retention set) and the pending inbox; shared with
the cluster's ACCEPT_PUBLISH, whose first five keys are the same."""

ACCEPT: Final = (
    ACCEPT_HEAD
    + """if #KEYS == 6 then
  local seq = redis.call('HINCRBY', KEYS[6], 'n', 1)
  redis.call('HSET', KEYS[6], tostring(seq), ARGV[4])
  return seq
end
return -1
"""
)

# KEYS: pending, bodies  ARGV: member
COMPLETE: Final = """
redis.call('ZREM', KEYS[1], ARGV[1])
return redis.call('HDEL', KEYS[2], ARGV[1])
"""

_HMGET_CHUNKED: Final = """
local function hmget_all(key, fields)
  local out = {}
  for i = 1, #fields, 1000 do
    local chunk = {}
    for j = i, math.min(i + 999, #fields) do chunk[#chunk + 1] = fields[j] end
    local values = redis.call('HMGET', key, unpack(chunk))
    for j = 1, #chunk do out[#out + 1] = values[j] end
  end
  return out
end
"""

# KEYS: pending, bodies
PENDING: Final = (
    _HMGET_CHUNKED
    + """
local out = {}
for _, body in ipairs(hmget_all(KEYS[2], redis.call('ZRANGE', KEYS[1], 0, -1))) do
  if body then out[#out + 1] = body end
end
return out
"""
)

# KEYS: history  ARGV: entry  -> the new seq
APPEND: Final = """
local seq = redis.call('HINCRBY', KEYS[1], 'n', 1)
redis.call('HSET', KEYS[1], tostring(seq), ARGV[1])
return seq
"""

# KEYS: history, id map, reverse map  ARGV: native id, entry, the native id's once-key
#   -> {1 if appended, seq}
APPEND_ONCE: Final = """
local earlier = redis.call('HGET', KEYS[2], ARGV[3])
if earlier then return {0, tonumber(earlier)} end
local seq = redis.call('HINCRBY', KEYS[1], 'n', 1)
redis.call('HSET', KEYS[1], tostring(seq), ARGV[2])
redis.call('HSET', KEYS[2], ARGV[3], tostring(seq))
redis.call('HSETNX', KEYS[3], tostring(seq), ARGV[1])
return {1, seq}
"""

# KEYS: history  ARGV: limit, after_seq, before_seq (0: none)  -> {first seq, entries};
# cost follows `limit` only
HISTORY: Final = (
    _HMGET_CHUNKED
    + """
local last = tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
local limit, after, before = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if after == 0 and before > 0 then last = math.min(last, before - 1) end
local first, stop
if after > 0 then
  first, stop = after + 1, math.min(last, after + limit)
else
  first, stop = math.max(1, last - limit + 1), last
end
if first > stop then return {first, {}} end
local fields = {}
for s = first, stop do fields[#fields + 1] = tostring(s) end
return {first, hmget_all(KEYS[1], fields)}
"""
)

# KEYS: history  ARGV: seq to look back from (0: the latest), most entries to look at, ids...
#   -> {entries erased, seq to go on from (0: none left), the ids found}
# Erases the entries of the ids and of their edits (`edit_of`), newest first: an edit comes
# after its message, so once a message is found, the caller looks no further for it.
FORGET_HISTORY: Final = """
local start, most = tonumber(ARGV[1]), tonumber(ARGV[2])
local last = tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
if start == 0 or start > last then start = last end
local wanted = {}
for i = 3, #ARGV do wanted[ARGV[i]] = true end
local erased, found = 0, {}
local stop = math.max(1, start - most + 1)
for s = start, stop, -1 do
  local raw = redis.call('HGET', KEYS[1], tostring(s))
  if raw then
    local entry = cjson.decode(raw)
    local data = entry[6]
    if type(data) ~= 'table' then data = {} end
    local hit = wanted[entry[2]]
    if hit then found[#found + 1] = entry[2] end
    local edit_of = data.edit_of
    if (hit or (type(edit_of) == 'string' and wanted[edit_of])) and data.deleted ~= true then
      entry[3], entry[4], entry[6] = '', '', {deleted = true}
      redis.call('HSET', KEYS[1], tostring(s), cjson.encode(entry))
      erased = erased + 1
    end
  end
end
return {erased, stop - 1, found}
"""

# KEYS: id map, reverse map  ARGV: native id, message id
MAP_ID: Final = """
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old and old ~= ARGV[2] and redis.call('HGET', KEYS[2], old) == ARGV[1] then
  redis.call('HDEL', KEYS[2], old)
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSETNX', KEYS[2], ARGV[2], ARGV[1])
return 1
"""

# KEYS: sent, order, counter  ARGV: idempotency key, message ids JSON
RECORD_SENT_HEAD: Final = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), ARGV[1])
"""
RECORD_SENT: Final = RECORD_SENT_HEAD + "return 1\n"

# KEYS: sent, sent before retention  ARGV: idempotency key
SENT_RESULT: Final = """
return redis.call('HGET', KEYS[1], ARGV[1]) or redis.call('HGET', KEYS[2], ARGV[1])
"""

# KEYS: marks  ARGV: cutoff  -> the largest counter a prune call saw at or before the cutoff
AGED_MARK: Final = """
local best = false
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])) do
  local n = tonumber(m)
  if not best or n > best then best = n end
end
return best
"""

# KEYS: marks, counter  ARGV: now  (NX: a counter keeps the time it was first seen)
MARK: Final = """
redis.call('ZADD', KEYS[1], 'NX', ARGV[1], redis.call('GET', KEYS[2]) or '0')
return 1
"""

# KEYS: seen, pending  ARGV: mark, limit, pending member prefix  -> ids removed
# Ids of messages still pending are kept (and stepped over).
PRUNE_SEEN: Final = """
local removed, kept, limit = 0, 0, tonumber(ARGV[2])
while removed < limit do
  local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', kept, limit - removed)
  if #ids == 0 then break end
  for _, id in ipairs(ids) do
    if redis.call('ZSCORE', KEYS[2], ARGV[3] .. id) then
      kept = kept + 1
    else
      redis.call('ZREM', KEYS[1], id)
      removed = removed + 1
    end
  end
end
return removed
"""

# KEYS: order, sent  ARGV: mark, limit  -> idempotency records removed
PRUNE_SENT: Final = """
local keys = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for i = 1, #keys, 1000 do
  local chunk = {}
  for j = i, math.min(i + 999, #keys) do chunk[#chunk + 1] = keys[j] end
  redis.call('HDEL', KEYS[2], unpack(chunk))
  redis.call('ZREM', KEYS[1], unpack(chunk))
end
return #keys
"""

# KEYS: failed sends (newest first)  ARGV: cutoff (ISO, UTC), limit  -> failures removed
PRUNE_FAILED: Final = """
local n, limit = 0, tonumber(ARGV[2])
while n < limit do
  local tail = redis.call('LINDEX', KEYS[1], -1)
  if not tail or cjson.decode(tail)[5] >= ARGV[1] then break end
  redis.call('RPOP', KEYS[1])
  n = n + 1
end
return n
"""

_PAIRING_FNS: Final = """
local function forget_pairing(pairings, order, pending, expiry, key)
  local raw = redis.call('HGET', pairings, key)
  if not raw then return end
  local p = cjson.decode(raw)
  redis.call('HDEL', pairings, key)
  redis.call('ZREM', order, key)
  redis.call('ZREM', expiry, key)
  if redis.call('HGET', pending, p.pf) == key then redis.call('HDEL', pending, p.pf) end
end
local function expired(expiry, key, p, now)
  if p.approved then return false end
  if p.expires_at == nil then return true end  -- given before pending codes expired
  if p.expires_at == cjson.null then return false end
  local at = redis.call('ZSCORE', expiry, key)
  return not at or tonumber(at) <= tonumber(now)
end
"""
"""A pending pairing's expiry is its score in the expiry set (epoch seconds), which holds the
pending pairings that expire; its JSON keeps the exact time as text for the store to return."""

# KEYS: pairings, order, pending, seq, expiry
# ARGV: pending field, code key, pairing JSON, now, expires (epoch s, or ''), forget before, limit
CREATE_PAIRING: Final = (
    _PAIRING_FNS
    + """
local existing = redis.call('HGET', KEYS[3], ARGV[1])
if existing then
  local raw = redis.call('HGET', KEYS[1], existing)
  if raw and not expired(KEYS[5], existing, cjson.decode(raw), ARGV[4]) then return {1, raw} end
  forget_pairing(KEYS[1], KEYS[2], KEYS[3], KEYS[5], existing)  -- a fresh code instead
  redis.call('HDEL', KEYS[3], ARGV[1])
end
local old = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', ARGV[6], 'LIMIT', 0, tonumber(ARGV[7]))
for _, key in ipairs(old) do forget_pairing(KEYS[1], KEYS[2], KEYS[3], KEYS[5], key) end
if redis.call('HEXISTS', KEYS[1], ARGV[2]) == 1 then
  return redis.error_reply('PAIRING_CODE_IN_USE')
end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), ARGV[2])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
if ARGV[5] ~= '' then redis.call('ZADD', KEYS[5], ARGV[5], ARGV[2]) end
return {0, ARGV[3]}
"""
)

# KEYS: pairings, pending, expiry  ARGV: code key, now
# -> the approved pairing JSON; as it was when it expired; or nil
APPROVE_PAIRING: Final = (
    _PAIRING_FNS
    + """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return false end
local p = cjson.decode(raw)
if expired(KEYS[3], ARGV[1], p, ARGV[2]) then return raw end
if not p.approved then
  p.approved = true
  raw = cjson.encode(p)
  redis.call('HSET', KEYS[1], ARGV[1], raw)
  redis.call('ZREM', KEYS[3], ARGV[1])
  if redis.call('HGET', KEYS[2], p.pf) == ARGV[1] then redis.call('HDEL', KEYS[2], p.pf) end
end
redis.call('SADD', p.tk, p.channel_user_id)
return raw
"""
)

# KEYS: pairings, order, pending, expiry  ARGV: code key  -> the pairing JSON it was, or nil
REVOKE_PAIRING: Final = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return false end
local p = cjson.decode(raw)
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
if redis.call('HGET', KEYS[3], p.pf) == ARGV[1] then redis.call('HDEL', KEYS[3], p.pf) end
if p.approved then redis.call('SREM', p.tk, p.channel_user_id) end  -- pending: trusted nobody
return raw
"""

# KEYS: pairings, order
PAIRINGS: Final = (
    _HMGET_CHUNKED
    + """
local out = {}
for _, raw in ipairs(hmget_all(KEYS[1], redis.call('ZRANGE', KEYS[2], 0, -1))) do
  if raw then out[#out + 1] = raw end
end
return out
"""
)

# -- durable hook queue ------------------------------------------------------------------------
# A delivery is a hash (dp .. id) with app, handler, conv, event, body, created, next, attempts,
# dead, error and q (its (app, handler) queue: a sorted set of ids). Global sorted sets: every
# id by id (ids) and by creation time (bytime).

_DROP: Final = """
local function drop(dp, id, ids, bytime)
  local k = dp .. id
  local q = redis.call('HGET', k, 'q')
  if q then redis.call('ZREM', q, id) end
  redis.call('DEL', k)
  redis.call('ZREM', ids, id)
  redis.call('ZREM', bytime, id)
end
"""

_FIELDS: Final = "'app', 'handler', 'conv', 'event', 'body', 'created', 'attempts', 'dead', 'error'"

# KEYS: seq, ids, bytime, queues of the app
# ARGV: dp, created, capacity, app, conv, event, body, then (handler, queue key) pairs
ENQUEUE_HOOK: Final = (
    _DROP
    + """
local dp, created, cap = ARGV[1], ARGV[2], tonumber(ARGV[3])
local dropped = 0
for i = 8, #ARGV, 2 do
  local q = ARGV[i + 1]
  local id = redis.call('INCR', KEYS[1])
  redis.call('HSET', dp .. id, 'app', ARGV[4], 'handler', ARGV[i], 'conv', ARGV[5],
    'event', ARGV[6], 'body', ARGV[7], 'created', created, 'next', created, 'attempts', 0,
    'dead', 0, 'q', q)
  redis.call('ZADD', q, id, id)
  redis.call('ZADD', KEYS[2], id, id)
  redis.call('ZADD', KEYS[3], created, id)
  redis.call('SADD', KEYS[4], q)
  local n = redis.call('ZCARD', q)
  if n > cap then
    for _, old in ipairs(redis.call('ZRANGE', q, 0, n - cap - 1)) do
      drop(dp, old, KEYS[2], KEYS[3])
      dropped = dropped + 1
    end
  end
end
return dropped
"""
)

# KEYS: the queue of each handler  ARGV: dp, now, lease until, limit
CLAIM_HOOKS: Final = f"""
local dp, now, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4])
local heads = {{}}
for _, q in ipairs(KEYS) do
  local seen = {{}}
  for _, id in ipairs(redis.call('ZRANGE', q, 0, -1)) do
    local f = redis.call('HMGET', dp .. id, 'conv', 'dead', 'next')
    if f[1] and f[2] == '0' and not seen[f[1]] then
      seen[f[1]] = true
      if tonumber(f[3]) <= now then heads[#heads + 1] = tonumber(id) end
    end
  end
end
table.sort(heads)
local out = {{}}
for i = 1, math.min(limit, #heads) do
  local k = dp .. heads[i]
  redis.call('HSET', k, 'next', ARGV[3])
  out[#out + 1] = {{heads[i], redis.call('HMGET', k, {_FIELDS})}}
end
return out
"""

# KEYS: ids, bytime  ARGV: dp, id
ACK_HOOK: Final = (
    _DROP
    + """
drop(ARGV[1], ARGV[2], KEYS[1], KEYS[2])
return 1
"""
)

# ARGV: dp, id, error, retry at ('' makes it a dead letter)
FAIL_HOOK: Final = """
local k = ARGV[1] .. ARGV[2]
if redis.call('EXISTS', k) == 0 then return 0 end
redis.call('HINCRBY', k, 'attempts', 1)
redis.call('HSET', k, 'error', ARGV[3])
if ARGV[4] == '' then
  redis.call('HSET', k, 'dead', 1)
else
  redis.call('HSET', k, 'next', ARGV[4])
end
return 1
"""

# ARGV: dp, id, now
RELEASE_HOOK: Final = """
local k = ARGV[1] .. ARGV[2]
if redis.call('HGET', k, 'dead') == '0' then redis.call('HSET', k, 'next', ARGV[3]) end
return 1
"""

# KEYS: ids  ARGV: dp, has app ('1'/'0'), app, dead filter ('', '0', '1'), limit
HOOK_BACKLOG: Final = f"""
local out = {{}}
local limit = tonumber(ARGV[5])
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if #out >= limit then break end
  local f = redis.call('HMGET', ARGV[1] .. id, {_FIELDS})
  if f[1] and (ARGV[2] == '0' or f[1] == ARGV[3]) and (ARGV[4] == '' or f[8] == ARGV[4]) then
    out[#out + 1] = {{tonumber(id), f}}
  end
end
return out
"""

# KEYS: ids  ARGV: dp, now, has app, app, then the ids to replay (none: every dead letter)
REPLAY_HOOKS: Final = """
local function replay(id)
  local k = ARGV[1] .. id
  local f = redis.call('HMGET', k, 'app', 'dead')
  if f[2] == '1' and (ARGV[3] == '0' or f[1] == ARGV[4]) then
    redis.call('HSET', k, 'dead', 0, 'attempts', 0, 'next', ARGV[2])
    return 1
  end
  return 0
end
local n = 0
if #ARGV > 4 then
  for i = 5, #ARGV do n = n + replay(ARGV[i]) end
else
  for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do n = n + replay(id) end
end
return n
"""

# KEYS: ids, bytime  ARGV: dp, cutoff (exclusive)
PURGE_HOOKS: Final = (
    _DROP
    + """
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[2])
for _, id in ipairs(old) do drop(ARGV[1], id, KEYS[1], KEYS[2]) end
return #old
"""
)

# KEYS: ids, bytime, queues of the app  ARGV: dp
CLEAR_HOOKS: Final = (
    _DROP
    + """
local n = 0
for _, q in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  for _, id in ipairs(redis.call('ZRANGE', q, 0, -1)) do
    drop(ARGV[1], id, KEYS[1], KEYS[2])
    n = n + 1
  end
  redis.call('DEL', q)
end
redis.call('DEL', KEYS[3])
return n
"""
)

# KEYS: state hash, the entry's own key (`RedisKeys.expiring_state`)  ARGV: field
GET_STATE: Final = """
local value = redis.call('GET', KEYS[2])
if value then return value end
return redis.call('HGET', KEYS[1], ARGV[1])
"""
"""An entry is in one of the two places: SET_STATE takes it out of the other."""

# KEYS: state hash, the entry's own key  ARGV: field, value, deadline (PXAT ms; "": for good)
SET_STATE: Final = """
if ARGV[3] == '' then
  redis.call('DEL', KEYS[2])
  return redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
redis.call('HDEL', KEYS[1], ARGV[1])
return redis.call('SET', KEYS[2], ARGV[2], 'PXAT', ARGV[3])
"""
"""A deadline already past leaves no key at all (Redis drops it at once)."""

# KEYS: state hash, the entry's own key  ARGV: field
DELETE_STATE: Final = """
redis.call('DEL', KEYS[2])
return redis.call('HDEL', KEYS[1], ARGV[1])
"""

ALL: Final[dict[str, str]] = {
    name: value
    for name, value in dict(globals()).items()
    if name.isupper()
    and not name.startswith("_")
    and name not in ("ALL", "ACCEPT_HEAD", "RECORD_SENT_HEAD")
}
"""Every script by name (loaded once per connection with SCRIPT LOAD)."""
