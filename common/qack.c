/* common/qack.c - the script of qack.h. IDs are compared as (ms, seq)
 * pairs of Lua numbers: exact for every ID XADD * gives (ms < 2^53). */
#include "qack.h"

const char qack_lua[] =
    "local n = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])\n"
    "local function part(id, k) return tonumber(select(k, string.match(id, '^(%d+)-(%d+)$'))) end\n"
    "local function below(a, b)\n"
    "  return part(a, 1) < part(b, 1) or (part(a, 1) == part(b, 1) and part(a, 2) < part(b, 2))\n"
    "end\n"
    "for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do\n"
    "  local name, ld\n"
    "  for i = 1, #g, 2 do\n"
    "    if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then ld = g[i + 1] end\n"
    "  end\n"
    "  if name ~= ARGV[1] then\n"
    "    if below(ld, ARGV[2]) then return n end\n"
    "    if redis.call('XPENDING', KEYS[1], name, ARGV[2], ARGV[2], 1)[1] then return n end\n"
    "  end\n"
    "end\n"
    "redis.call('XDEL', KEYS[1], ARGV[2])\n"
    "return n\n";
