-- quotagate token buckets: one script decides every operation on every key it is given.
--
-- KEYS[i]  a bucket (a hash with fields tokens and ts)
-- ARGV[1]  the operation: take | add | set | peek
-- ARGV[2]  for each key in order, "capacity refill amount", all separated by spaces
--   take: tokens to take, all or none      add: tokens to add (capped at capacity)
--   set:  tokens to start from, or -1 to keep the current ones (capped at capacity)
--
-- Returns one string, two words per key: a status (1 granted, plus 2 if the
-- state was missing) and the tokens left. One argument in and one string out,
-- instead of three of each per key: a batch of 100 spent most of its client
-- time encoding and parsing them (docs/performance.md).
--
-- The clock is the server's (TIME), so every client agrees on elapsed time. A
-- missing hash means the state was lost (a restart without persistence, an
-- eviction): the bucket restarts EMPTY, never full, so a lost state can cost
-- tokens but never grants more than capacity + refill * elapsed.
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local operation = ARGV[1]
-- A batch repeats a few shapes: each distinct word is converted once (parsing
-- was a third of a batch's server time).
local numbers = {}
local parsed = {}
local count = 0
for word in string.gmatch(ARGV[2], '%S+') do
  local number = parsed[word]
  if number == nil then
    number = tonumber(word)
    parsed[word] = number
  end
  count = count + 1
  numbers[count] = number
end
local results = {}
-- A batch may name one bucket many times: each is read once, decided in
-- order in memory, and written once at the end.
local buckets = {}
local written = {}

for index, key in ipairs(KEYS) do
  local base = (index - 1) * 3
  local capacity = numbers[base + 1]
  local refill = numbers[base + 2]
  local amount = numbers[base + 3]

  local bucket = buckets[key]
  local status = 0
  if bucket == nil then
    local state = redis.call('HMGET', key, 'tokens', 'ts')
    local tokens = tonumber(state[1])
    local updated = tonumber(state[2])
    if tokens == nil or updated == nil then
      tokens, updated, status = 0, now, 2
    end
    bucket = {tokens = tokens, updated = updated}
    buckets[key] = bucket
  end
  -- Refill since the last write; a clock that stepped back adds nothing.
  local tokens = math.min(capacity, bucket.tokens + math.max(0, now - bucket.updated) * refill)
  bucket.updated = math.max(now, bucket.updated)

  if operation == 'take' then
    if tokens >= amount then
      tokens = tokens - amount
      status = status + 1
    end
  elseif operation == 'add' then
    tokens = math.min(capacity, tokens + amount)
    status = status + 1
  elseif operation == 'set' then
    if amount >= 0 then tokens = amount end
    tokens = math.min(capacity, tokens)
    status = status + 1
  end
  bucket.tokens = tokens
  if operation ~= 'peek' and not written[key] then
    written[key] = true
    written[#written + 1] = key
  end
  results[#results + 1] = status
  results[#results + 1] = string.format('%.17g', tokens)
end
-- %.17g and %.6f: a plain Lua number would be stored with 14 digits only.
for _, key in ipairs(written) do
  local bucket = buckets[key]
  redis.call('HSET', key, 'tokens', string.format('%.17g', bucket.tokens),
             'ts', string.format('%.6f', bucket.updated))
end
return table.concat(results, ' ')
