-- quotagate token buckets: one script decides every operation on every key it is given.
--
-- KEYS[i]  a bucket (a hash with fields tokens and ts)
-- ARGV[1]  the operation: take | add | set | peek
-- ARGV[2 + 3(i-1) .. 4 + 3(i-1)]  capacity, refill per second, amount for KEYS[i]
--   take: tokens to take, all or none      add: tokens to add (capped at capacity)
--   set:  tokens to start from, or -1 to keep the current ones (capped at capacity)
--
-- Returns one flat array, three entries per key (a flat reply parses faster than
-- nested ones): granted 0/1, tokens left as a string, state-was-missing 0/1.
--
-- The clock is the server's (TIME), so every client agrees on elapsed time. A
-- missing hash means the state was lost (a restart without persistence, an
-- eviction): the bucket restarts EMPTY, never full, so a lost state can cost
-- tokens but never grants more than capacity + refill * elapsed.
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local operation = ARGV[1]
local results = {}

for index, key in ipairs(KEYS) do
  local base = 2 + (index - 1) * 3
  local capacity = tonumber(ARGV[base])
  local refill = tonumber(ARGV[base + 1])
  local amount = tonumber(ARGV[base + 2])

  local state = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(state[1])
  local updated = tonumber(state[2])
  local missing = 0
  if tokens == nil or updated == nil then
    tokens, updated, missing = 0, now, 1
  end
  -- Refill since the last write; a clock that stepped back adds nothing.
  local elapsed = math.max(0, now - updated)
  tokens = math.min(capacity, tokens + elapsed * refill)
  updated = math.max(now, updated)

  local granted = 0
  if operation == 'take' then
    if tokens >= amount then
      tokens = tokens - amount
      granted = 1
    end
  elseif operation == 'add' then
    tokens = math.min(capacity, tokens + amount)
    granted = 1
  elseif operation == 'set' then
    if amount >= 0 then tokens = amount end
    tokens = math.min(capacity, tokens)
    granted = 1
  end
  if operation ~= 'peek' then
    -- %.17g and %.6f: a plain Lua number would be stored with 14 digits only.
    redis.call('HSET', key, 'tokens', string.format('%.17g', tokens),
               'ts', string.format('%.6f', updated))
  end
  results[#results + 1] = granted
  results[#results + 1] = string.format('%.17g', tokens)
  results[#results + 1] = missing
end
return results
