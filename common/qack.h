/* common/qack.h - acknowledging a queue entry and deleting it once no
 * consumer group needs it any more (bounded storage, issue 26).
 *
 * The queue streams (<prefix>requests, requests:<tenant>, jobs:<pool>)
 * keep an entry only while some group still has to handle it: the
 * dispatcher (group "dispatchers") and the workers (group "workers") ack
 * what they handled with QACK_LUA, which XACKs it and then XDELs it unless
 * another group of the stream has not read it yet or holds it pending (an
 * audit tap, a test reading what was sent). With the one group a queue
 * stream normally has, that is XACK + XDEL in one step. Redis 7.0 has no
 * XACKDEL; a script keeps the two together, so neither happens without the
 * other. */
#ifndef RL_QACK_H
#define RL_QACK_H

/* EVAL QACK_LUA 1 <stream> <group> <entry ID>: the XACK's count. */
extern const char qack_lua[];

/* QACK_LUA's text, for scripts that end with the same acknowledgement
 * (KEYS[1] the stream, ARGV[1] the group, ARGV[2] the entry ID; it
 * returns the XACK's count). */
#define QACK_LUA_BODY \
    "local n = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])\n" \
    "local function part(id, k) return tonumber(select(k, string.match(id, '^(%d+)-(%d+)$'))) end\n" \
    "local function below(a, b)\n" \
    "  return part(a, 1) < part(b, 1) or (part(a, 1) == part(b, 1) and part(a, 2) < part(b, 2))\n" \
    "end\n" \
    "for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do\n" \
    "  local name, ld\n" \
    "  for i = 1, #g, 2 do\n" \
    "    if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then ld = g[i + 1] end\n" \
    "  end\n" \
    "  if name ~= ARGV[1] then\n" \
    "    if below(ld, ARGV[2]) then return n end\n" \
    "    if redis.call('XPENDING', KEYS[1], name, ARGV[2], ARGV[2], 1)[1] then return n end\n" \
    "  end\n" \
    "end\n" \
    "redis.call('XDEL', KEYS[1], ARGV[2])\n" \
    "return n\n"

#endif
