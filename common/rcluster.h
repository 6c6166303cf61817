/* common/rcluster.h - the pure parts of Redis Cluster support: key slots
 * (CRC16 with hash tags), which argument of a command is its key, the
 * slot map parsed from CLUSTER SLOTS, MOVED/ASK redirects, and the key
 * names that differ in cluster mode.
 *
 * Nothing here does I/O: common/rconn.c owns the connections and uses
 * these to route; the functions are separate so that cmocka can check
 * them against known values (tests/unit/test_rcluster.c). */
#ifndef RL_RCLUSTER_H
#define RL_RCLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "rconn.h"

#define RCL_N_SLOTS 16384
#define RCL_MAX_NODES 64  /* masters we route to */
#define RCL_HOST_MAX 256

/* CRC16-CCITT (XModem), the one Redis Cluster uses: "123456789" -> 0x31C3. */
uint16_t rcl_crc16(const char *buf, size_t len);

/* The slot of a key: CRC16 of the whole key, or of the part between the
 * first '{' and the first '}' after it when that part is not empty. */
int rcl_key_slot(const char *key, size_t len);

/* The index in argv of the key a command is routed by, or -1 for a
 * command with no key (MULTI, EXEC, PING, INFO, SCAN, CLUSTER ...): XREAD
 * and XREADGROUP name theirs after STREAMS, XGROUP and XINFO at 2, EVAL
 * and EVALSHA at 3 (when numkeys > 0), the rest at 1. lens NULL: C strings. */
int rcl_command_key(int argc, const char *const *argv, const size_t *lens);

/* The slot the command goes to, -1 when it has none. */
int rcl_command_slot(int argc, const char *const *argv, const size_t *lens);

/* Which master serves each slot. A plain record: rconn owns one. */
struct rcl_node {
    char host[RCL_HOST_MAX];
    int port;
};
struct rcl_map {
    int n_nodes;
    struct rcl_node nodes[RCL_MAX_NODES];
    int16_t slot_node[RCL_N_SLOTS]; /* index into nodes, -1 = no master known */
};

/* Empties m (every slot unknown). */
void rcl_map_clear(struct rcl_map *m);
/* The index of host:port in m, added if new; -1 when m is full. */
int rcl_map_node(struct rcl_map *m, const char *host, int port);
/* Fills m from a CLUSTER SLOTS reply ([[start, end, [host, port, id...],
 * replicas...]...]). An empty host (a node that does not know its own
 * address) means seed_host, the address we asked. -RL_EFORMAT for a
 * malformed reply; m is cleared first either way. */
int rcl_map_parse(struct rcl_map *m, const struct rconn_reply *r, const char *seed_host,
                  struct rl_err *err);
/* Slots with no master in m (0 once the cluster covers all of them). */
int rcl_map_n_uncovered(const struct rcl_map *m);

enum rcl_redirect { RCL_NONE = 0, RCL_MOVED = 1, RCL_ASK = 2 };
/* Parses "MOVED 3999 127.0.0.1:6381" / "ASK 3999 host:port" into slot,
 * host (RCL_HOST_MAX) and port; RCL_NONE for anything else. */
enum rcl_redirect rcl_parse_redirect(const char *s, int *slot, char *host, int *port);

/* "host:port,host:port,...": splits a seed list into up to max entries of
 * seeds (each RCL_HOST_MAX + 8). Returns the count, or -RL_EINVAL (err
 * names the entry) for an empty entry or one over the size. */
int rcl_split_seeds(const char *list, char (*seeds)[RCL_HOST_MAX + 8], int max,
                    struct rl_err *err);

/* The key <prefix><kind><id>, or <prefix><kind>{<id>} in cluster mode,
 * so that every key of one request (out:, cancel:, tok:) lives in the
 * slot of its id and requests spread over the shards
 * (schemas/README.md, "Key layout"). Returns the length, or -1 when it
 * does not fit in cap. */
int rcl_tagged_key(char *buf, size_t cap, bool cluster, const char *prefix, const char *kind,
                   const char *id);

/* The queue keys (requests, jobs:<pool>, jobs:<model>:<pool>, dead) of
 * one prefix: <prefix><rest>, or {<prefix>}<rest> in cluster mode, one
 * slot for all of them, because the dispatcher forwards a request in one
 * MULTI (XADD jobs:<pool> + XACK requests) and a worker BLOCKs on all its
 * pools in one XREADGROUP. Returns the length, or -1 when it does not fit. */
int rcl_queue_key(char *buf, size_t cap, bool cluster, const char *prefix, const char *rest);
/* What rcl_queue_key's rest is for a pool: "jobs:<pool>", or
 * "jobs:<model>:<pool>" for a model with pools of its own (model non-NULL:
 * pool_scope = model); and the pool name of LoRA adapter `adapter`'s own
 * stream, "lora@<adapter>" (schemas/README.md, "LoRA adapters"). The
 * worker that reads these streams and the dispatcher that fills them spell
 * them here, once. Each returns the length, or -1 when it does not fit. */
int rcl_pool_rest(char *buf, size_t cap, const char *model, const char *pool);
int rcl_lora_pool(char *buf, size_t cap, const char *adapter);

/* Pool shards (issue 27, schemas/README.md "Key layout on a Redis
 * Cluster"): on a cluster each pool stream is split over pool_shards hash
 * tags so that the queue traffic spreads over the masters.
 *
 * The key of shard `shard` (0 <= shard < n_shards <= RCL_MAX_SHARDS) of a
 * cluster queue key "{<prefix>}<rest>": shard 0 is the key itself (what
 * a single instance and pool_shards = 1 use, and where jobs XADDed
 * directly to the pool land); shard s > 0 is "{<prefix><s>.<n>}<rest>",
 * n the smallest number >= 0 that puts its slot exactly
 * round(s * RCL_N_SLOTS / n_shards) slots after the slot of shard 0 (mod
 * RCL_N_SLOTS). The shards thus sit evenly over the slot space, and
 * masters holding even contiguous ranges (what redis-cli --cluster create
 * makes) hold n_shards / masters each (but for a prefix whose slot is
 * within a slot or two of a range's end), while every process computes
 * the same names from the prefix alone. Finding n takes ~16384 CRCs (a
 * few ms): callers that name shards often take it once from rcl_shard_n
 * and build keys with rcl_shard_key_n.
 * The same shard of every pool (and of the dispatcher's forward markers,
 * "fwd:...") shares one tag. Returns the length, or -1 when it does not
 * fit, key has no leading "{...}" tag, or shard is out of range. */
#define RCL_MAX_SHARDS 16
int rcl_shard_key(char *buf, size_t cap, const char *key, int shard, int n_shards);
/* The n of shard `shard` (1 <= shard < n_shards) of keys tagged {tag}
 * (tag_len bytes, not empty): the same for every pool and marker of one
 * prefix. -1 when out of range. */
long rcl_shard_n(const char *tag, size_t tag_len, int shard, int n_shards);
/* rcl_shard_key with n from rcl_shard_n (ignored for shard 0): no search. */
int rcl_shard_key_n(char *buf, size_t cap, const char *key, int shard, long n);

/* The slot of shard `shard` of keys whose shard 0 sits in slot0:
 * round(shard * RCL_N_SLOTS / n_shards) slots after it. -1 when out of
 * range. */
int rcl_shard_slot(int slot0, int shard, int n_shards);

/* The shard a request in slot `slot` (its keys' slot, out:{<id>}) is
 * forwarded to: the one whose slot comes first at or after it, going
 * round. A function of the request's id alone, so that a dispatcher that
 * re-forwards an entry (it died before the XACK) writes into the same
 * shard, whose forward marker refuses the duplicate; and, the shards
 * sitting evenly over the slot space, a master with a contiguous range
 * that holds a shard is the master of the jobs whose requests it holds
 * from the start of its range on: the request slots (rcl_map_request_slots)
 * are those starts, so a worker that reads one master's shard writes that
 * master's streams (issue 27 point 4, schemas/README.md "Pool shards").
 * Ids spread evenly over the slots spread evenly over the shards. */
int rcl_shard_for_slot(int slot0, int slot, int n_shards);

/* Ids that share a slot (issue 27 point 4, schemas/README.md "Request
 * slots"). On a cluster every key of one request carries its id as hash
 * tag, so requests with ids of one slot can be written by one script call
 * and read by one XREAD; ids of a slot each (the default for ids a client
 * makes up) cost a call each. A client that makes ids picks, per request,
 * one of the "request slots" (rcl_map_request_slots) and fills a window of
 * its id with rcl_slot_fill.
 *
 * Overwrites id[at .. at + RCL_SLOT_FILL_LEN) with letters 'h'..'o' so
 * that the slot of the whole id (len bytes, as hashed: the part between
 * the braces of out:{<id>}) is slot. CRC16 with a zero start is linear
 * over GF(2), so the letters come from solving 14 equations in the
 * window's 18 free bits, not from a search: a few microseconds. Returns 0,
 * or -1 when the window does not fit in len or slot is out of range. */
#define RCL_SLOT_FILL_LEN 6
int rcl_slot_fill(char *id, size_t len, size_t at, int slot);

/* The bell (common/xmux.h) that writers of streams in slot ring: on a
 * single instance <prefix>bell, one for every stream; on a cluster
 * <prefix>bell{<six letters>}, the letters putting it in slot, since a
 * script that writes a stream must ring in its slot. Returns the length,
 * or -1 when it does not fit in cap. */
int rcl_bell_key(char *buf, size_t cap, bool cluster, const char *prefix, int slot);

/* The request slots of a cluster: for each master of m (in node order),
 * the lowest slot it serves, so that every client of one cluster picks the
 * same ones from its own map. Returns the count (<= max), 0 for an empty
 * map. */
int rcl_map_request_slots(const struct rcl_map *m, int *slots, int max);

#endif
