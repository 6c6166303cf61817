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

#endif
