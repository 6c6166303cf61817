/* common/qack.c - the script of qack.h. IDs are compared as (ms, seq)
 * pairs of Lua numbers: exact for every ID XADD * gives (ms < 2^53). */
#include "qack.h"

const char qack_lua[] = QACK_LUA_BODY;
