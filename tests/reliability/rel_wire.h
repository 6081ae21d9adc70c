/*
 * rel_wire — a small blocking client of mapflowd's wire protocol for the reliability
 * drivers (crash, load, faults, security). It speaks frames directly (proto/mf_frame.h)
 * instead of using libmapflow, so a driver can also send what no well-behaved client
 * sends (half frames, wrong tokens, huge counts) and does not depend on client/.
 *
 * Ownership: a rel_conn_t owns its socket, its frame reader, the mapped arena and the
 * last reply's payload copy (valid until the next call). Replies returned by rel_call
 * belong to the caller (mf_envelope_free). Rows from rel_row are malloc'd, 64-aligned.
 * Thread safety: one connection per thread; the functions share no state.
 */
#ifndef REL_WIRE_H
#define REL_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "mf_frame.h"
#include "mf_clock.h"
#include "mf_hash.h"
#include "mf_row.h"

typedef struct rel_conn {
    int fd;
    uint8_t *arena;          /* host arena mapping (unix + want_arena), else NULL */
    size_t arena_len;
    uint64_t next_id;
    mf_frame_reader_t rd;
    uint8_t *payload;        /* last reply's payload (16-aligned copy) */
    size_t payload_len;
    char err[160];           /* last ErrorReply message */
    uint32_t max_batch;      /* the daemon's, from the HelloReply */
} rel_conn_t;

/* "unix:PATH", "tcp:HOST:PORT" or a bare path. Receive timeout: timeout_ms (0 = none).
 * Returns 0, or -1 (errno kept). */
int rel_dial(rel_conn_t *c, const char *target, int timeout_ms);
void rel_close(rel_conn_t *c);

/* Hello. Returns 0, the ErrorReply code (> 0), or -1 on I/O failure / close. */
int rel_hello(rel_conn_t *c, const char *ns, const char *token, int want_arena);
/* Hello carrying admin_token too (NULL = none). */
int rel_hello_admin(rel_conn_t *c, const char *ns, const char *token, const char *admin_token,
                    int want_arena);
/* dial + hello; -1 / code as rel_hello. */
int rel_open(rel_conn_t *c, const char *target, const char *ns, const char *token,
             int want_arena, int timeout_ms);

int rel_send(rel_conn_t *c, mf_envelope_t *env, const void *payload, size_t plen);
int rel_send_raw(rel_conn_t *c, const void *buf, size_t len);
/* One recvmsg(flags) on fd into a frame reader; an fd passed with SCM_RIGHTS goes to
 * *fd_out (closed when fd_out is NULL). Returns the bytes read, 0 on EOF, -1 on error. */
ssize_t rel_recv_into(int fd, mf_frame_reader_t *rd, int flags, int *fd_out);
/* Next reply (NULL: closed, timed out or malformed). Payload copied to c->payload. */
mf_envelope_t *rel_recv(rel_conn_t *c, int *fd_out);
/* One request, one reply with the same id. */
mf_envelope_t *rel_call(rel_conn_t *c, mf_envelope_t *req, const void *payload, size_t plen);

/* Status of a reply: 0 when it is `want_case`, the ErrorReply code, -1 otherwise. */
int rel_status(const mf_envelope_t *r, int want_case, rel_conn_t *c);

/* Two-phase put of a sealed row (arena when mapped, else payload). Returns 0 / code / -1;
 * *durable_out (may be NULL) gets PutCommitReply.durable. */
int rel_put(rel_conn_t *c, const uint8_t *row, size_t len, int durable, int *durable_out);
/* PutBegin only (the reservation is never committed); *rid gets its id. */
int rel_put_begin(rel_conn_t *c, const uint8_t *row, size_t len, uint64_t *rid);

/* Lookup: blocks[nl] hit counts. */
int rel_lookup(rel_conn_t *c, const char *model, uint32_t B, const uint32_t *layers,
               size_t nl, const uint32_t *tokens, size_t ntok, uint32_t *blocks);

/* Prefix Get; returns the reply (GetReply or ErrorReply) or NULL. The copy payload is in
 * c->payload. */
mf_envelope_t *rel_get_prefix(rel_conn_t *c, const char *model, uint32_t B,
                              const uint32_t *layers, size_t nl, const uint32_t *tokens,
                              size_t ntok, uint32_t first, uint32_t n, int lease);
/* Get copy of one row by its key (no prefix: the block's earlier blocks need not be
 * there); the reply or NULL, the payload in c->payload. */
mf_envelope_t *rel_get_key(rel_conn_t *c, const char *model, uint32_t layer, mf_hash128_t h);
int rel_release(rel_conn_t *c, const uint64_t *ids, size_t n, uint32_t *released);
/* Stats counter by name (UINT64_MAX when missing or on error). */
uint64_t rel_counter(rel_conn_t *c, const char *name);
/* Simple admin calls: 0 / code / -1; *n gets the count the reply carries. */
int rel_flush_scope(rel_conn_t *c, int all_namespaces, uint64_t *n); /* all: admin only */
#define rel_flush(c, n) rel_flush_scope((c), 0, (n))
int rel_list_count(rel_conn_t *c, const char *model, uint64_t *n);
int rel_delete_model(rel_conn_t *c, const char *model, uint64_t *n);
int rel_evict(rel_conn_t *c, int tier, uint64_t *entries);

/* ---- rows ------------------------------------------------------------------------- */

typedef struct rel_row_spec {
    const char *ns, *model;
    uint32_t layer, B;
    const uint32_t *tokens;  /* all tokens from block 0 */
    uint32_t block;          /* i */
    mf_codec_t codec;        /* MASK: small rows; FP8_E4M3: B×B tiles (bulk) */
    unsigned seed;
    const mf_hash128_t *force_hash;  /* non-NULL: header hash set to this (planted collision) */
} rel_row_spec_t;

/* A valid row for block i (2 heads, sink + diagonal), hashes as the daemon computes. */
uint8_t *rel_row(const rel_row_spec_t *s, size_t *size);
/* Hash of block i and of its parent. */
void rel_block_hashes(const char *ns, const char *model, uint32_t B, const uint32_t *tokens,
                      uint32_t i, mf_hash128_t *parent, mf_hash128_t *hash);
/* Client-side check of a row read back: checksum, model, layer, block, tokens, parent and
 * hash as expected. 0 = good; else a static reason in *why. */
int rel_row_check(const uint8_t *row, size_t len, const char *ns, const char *model,
                  uint32_t layer, uint32_t B, const uint32_t *tokens, uint32_t i,
                  const char **why);

/*
 * A real XXH3-128 collision of one block, for any parent (B = 8 or 16: mf_hash_next then
 * hashes 48 or 80 bytes, XXH3's 17..128-byte path). The last 16 input bytes (tokens B-4..
 * B-1, as two u64 words x, y) reach the state only as mix16B(x, y) = fold((x ^ s16) *
 * (y ^ s24)) and as x + y (s = the default secret): with x = s16 or y = s24 the product
 * is 0, so (s16, d) and (s16 + d - s24, s24) collide. Rewrites blk's last 4 tokens to the
 * first form (d from seed) and writes the second form into partner (B tokens); checks
 * the two hashes agree under a random parent. 0, or -1 (other B, or no collision).
 */
int rel_collide_block(uint32_t *blk, uint32_t B, uint32_t *partner, uint64_t seed);

/* Deterministic tokens (xorshift), never zero. */
void rel_tokens(uint32_t *t, size_t n, uint64_t seed);

/* Resident anonymous memory (RssAnon, kB) of a process; -1 when unreadable. */
long rel_rss_anon_kb(int pid);


#endif /* REL_WIRE_H */
