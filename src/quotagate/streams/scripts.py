"""The Lua scripts of the stream layer: every fenced step is one atomic script.

Each script that writes on behalf of a partition's owner first checks the
partition lease (``owner`` and ``generation`` both match: after a takeover by
a worker of the same name only the generation tells the old process from the
new one), then does its work; a stale caller gets the error ``STALE`` and
nothing changes. Acquisition happens only when the lease is free or expired,
judged by the Redis server's clock (``TIME``), and every acquisition moves the
generation on — the rules of ``store.lease``, here in Lua.

Scripts are registered with redis-py (``register_script``): sent once,
called by SHA, re-sent on NOSCRIPT. All keys of one call share a hash slot
(see ``streams.keys``).
"""

from __future__ import annotations

# Shared prelude: the server clock in ms and the fence check.
_PRELUDE = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function fenced(lease, owner, generation)
  local held = redis.call('HMGET', lease, 'owner', 'generation')
  if held[1] ~= owner or tonumber(held[2] or '0') ~= tonumber(generation) then
    return redis.error_reply('STALE lease ' .. lease .. ' is held by ' .. tostring(held[1]) ..
      ' generation ' .. tostring(held[2]))
  end
  return nil
end
local function id_parts(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function id_less(a, b)
  local am, as = id_parts(a)
  local bm, bs = id_parts(b)
  return am < bm or (am == bm and as < bs)
end
"""

# KEYS: lease, the topic's lease floor. ARGV: owner, ttl_ms.
# → {acquired, generation, expires_ms, owner}. A lease made again after its topic
# was deleted starts above the floor the delete left (RETIRE): no generation repeats.
ACQUIRE = _PRELUDE + """
local now = now_ms()
local held = redis.call('HMGET', KEYS[1], 'owner', 'generation', 'expires')
local owner, generation, expires = held[1], tonumber(held[2] or '0'), tonumber(held[3] or '0')
if owner and owner ~= '' and expires >= now then
  return {0, generation, expires, owner}
end
generation = math.max(generation, tonumber(redis.call('GET', KEYS[2]) or '0')) + 1
expires = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'generation', generation, 'expires', expires)
return {1, generation, expires, ARGV[1]}
"""

# KEYS: lease, the topic's lease floor. Deletes the lease (its topic is deleted) and keeps
# its generation in the floor, the highest of them. → the floor.
RETIRE = """
local floor = tonumber(redis.call('GET', KEYS[2]) or '0')
local generation = tonumber(redis.call('HGET', KEYS[1], 'generation') or '0')
if generation > floor then
  floor = generation
  redis.call('SET', KEYS[2], floor)
end
redis.call('DEL', KEYS[1])
return floor
"""

# KEYS: lease. ARGV: owner, generation, ttl_ms. → expires_ms, or STALE.
RENEW = _PRELUDE + """
local refused = fenced(KEYS[1], ARGV[1], ARGV[2])
if refused then return refused end
local expires = now_ms() + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'expires', expires)
return expires
"""

# KEYS: lease. ARGV: owner, generation. → 1, or STALE. The generation stays.
RELEASE = _PRELUDE + """
local refused = fenced(KEYS[1], ARGV[1], ARGV[2])
if refused then return refused end
redis.call('HSET', KEYS[1], 'owner', '', 'expires', now_ms())
return 1
"""

# KEYS: lease, stream. ARGV: owner, generation, group, consumer, count.
# → XREADGROUP's reply for new entries (nil when none), or STALE.
READ = _PRELUDE + """
local refused = fenced(KEYS[1], ARGV[1], ARGV[2])
if refused then return refused end
return redis.call('XREADGROUP', 'GROUP', ARGV[3], ARGV[4], 'COUNT', ARGV[5],
                  'STREAMS', KEYS[2], '>')
"""

# KEYS: lease, stream, frontier, retry. ARGV: owner, generation, group, n_acked,
# acked ids…, then (failed id, error) pairs.
# Acks, records the errors of failed entries, and advances the commit frontier:
# the id below which every entry is acked — just before the oldest pending
# entry, or the newest acked one when nothing is pending. It never moves back.
# → {acked, frontier}, or STALE.
SETTLE = _PRELUDE + """
local refused = fenced(KEYS[1], ARGV[1], ARGV[2])
if refused then return refused end
local n = tonumber(ARGV[4])
local acked = 0
local newest = nil
if n > 0 then
  local ids = {}
  for i = 5, 4 + n do
    ids[#ids + 1] = ARGV[i]
    if newest == nil or id_less(newest, ARGV[i]) then newest = ARGV[i] end
  end
  acked = redis.call('XACK', KEYS[2], ARGV[3], unpack(ids))
  redis.call('HDEL', KEYS[4], unpack(ids))
end
for i = 5 + n, #ARGV, 2 do
  redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
end
local pending = redis.call('XPENDING', KEYS[2], ARGV[3])
local candidate = nil
if tonumber(pending[1]) > 0 then
  local before = redis.call('XREVRANGE', KEYS[2], '(' .. pending[2], '-', 'COUNT', 1)
  if before[1] then candidate = before[1][1] end
else
  candidate = newest
end
local frontier = redis.call('GET', KEYS[3])
if candidate and (not frontier or id_less(frontier, candidate)) then
  redis.call('SET', KEYS[3], candidate)
  frontier = candidate
end
return {acked, frontier or false}
"""

# KEYS: lease, stream, retry, dlq. ARGV: owner, generation, group, consumer,
# min_idle_ms, count, max_deliveries, dlq_max_len.
# Entries pending longer than min_idle: those delivered max_deliveries times
# go to the DLQ with their last error (and are acked); the rest are claimed
# for this consumer. → {dead-lettered ids, claimed entries}, or STALE.
CLAIM = _PRELUDE + """
local refused = fenced(KEYS[1], ARGV[1], ARGV[2])
if refused then return refused end
local pending = redis.call('XPENDING', KEYS[2], ARGV[3], 'IDLE', ARGV[5], '-', '+', ARGV[6])
local claim = {}
local dead = {}
for _, entry in ipairs(pending) do
  local id, deliveries = entry[1], tonumber(entry[4])
  if deliveries >= tonumber(ARGV[7]) then
    local found = redis.call('XRANGE', KEYS[2], id, id)
    local fields = {'source', KEYS[2], 'id', id, 'group', ARGV[3], 'deliveries', deliveries,
                    'error', redis.call('HGET', KEYS[3], id) or 'visibility timeout'}
    if found[1] then
      for _, value in ipairs(found[1][2]) do fields[#fields + 1] = value end
    end
    redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[8], '*', unpack(fields))
    redis.call('XACK', KEYS[2], ARGV[3], id)
    redis.call('HDEL', KEYS[3], id)
    dead[#dead + 1] = id
  else
    claim[#claim + 1] = id
  end
end
local claimed = {}
if #claim > 0 then
  claimed = redis.call('XCLAIM', KEYS[2], ARGV[3], ARGV[4], ARGV[5], unpack(claim))
end
return {dead, claimed}
"""

# KEYS: members. ARGV: name, ttl_ms. Heartbeat; → the live members, by name.
MEMBERS = _PRELUDE + """
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 10)
local live = redis.call('ZRANGE', KEYS[1], 0, -1)
table.sort(live)
return live
"""

# KEYS: in-flight hash. ARGV: instance, wanted total, cap, ttl_ms, held now.
# Each consumer instance keeps "count|expires_ms" of the entries it holds or
# is about to read; instances that stopped heartbeating (killed) are dropped.
# → the total this instance may hold (never below what it already holds).
IN_FLIGHT = _PRELUDE + """
local now = now_ms()
local others = 0
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local count, expires = string.match(fields[i + 1], '^(%d+)|(%d+)$')
  if fields[i] == ARGV[1] then
    -- this instance's own count is replaced below
  elseif tonumber(expires) < now then
    redis.call('HDEL', KEYS[1], fields[i])
  else
    others = others + tonumber(count)
  end
end
local wanted = tonumber(ARGV[2])
local allowed = math.max(0, tonumber(ARGV[3]) - others)
-- What it already holds is unacked whatever the cap says: never below that.
local total = math.max(tonumber(ARGV[5]), math.min(wanted, allowed))
redis.call('HSET', KEYS[1], ARGV[1], total .. '|' .. (now + tonumber(ARGV[4])))
return total
"""


def _produce_script() -> str:
    """Take from the topic's bucket and append the batch, in one step (one round trip).

    The bucket is decided by the rate store's own script (``rate/token_bucket.lua``),
    run here as a function — its ``KEYS``/``ARGV`` are the function's parameters — so
    there is one bucket algorithm, not two. Only when the bucket lives in the same
    (non-cluster) Redis as the topic; otherwise the producer takes, then appends.

    KEYS: bucket, then the topic's partition streams. ARGV: capacity, refill,
    amount, max length ('' for none), then per message: partition (0-based index
    into the streams), data, key ('' for none).
    → {granted, tokens left, state missing, entry ids…}.
    """
    from quotagate.rate.redis import SCRIPT as BUCKET

    return "local function bucket(KEYS, ARGV)\n" + BUCKET + "\nend\n" + """
-- The bucket script answers "status tokens" (status: 1 granted, plus 2 if the state was missing).
local answer = bucket({KEYS[1]}, {'take', ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3]})
local status_text, tokens = string.match(answer, '^(%S+) (%S+)$')
local status = tonumber(status_text)
local granted, missing = status % 2, 0
if status >= 2 then missing = 1 end
local reply = {granted, tokens, missing}
if granted == 0 then return reply end
local maxlen = ARGV[4]
for i = 5, #ARGV, 3 do
  local stream = KEYS[tonumber(ARGV[i]) + 2]
  local fields = {'data', ARGV[i + 1]}
  if ARGV[i + 2] ~= '' then fields = {'data', ARGV[i + 1], 'key', ARGV[i + 2]} end
  if maxlen == '' then
    reply[#reply + 1] = redis.call('XADD', stream, '*', unpack(fields))
  else
    reply[#reply + 1] = redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', unpack(fields))
  end
end
return reply
"""


PRODUCE = _produce_script()
