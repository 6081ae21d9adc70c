/* mf_frame — incremental frame reader and frame encoder (see mf_frame.h). */
#include "mf_frame.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static uint32_t get_u32le(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static void put_u32le(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

mf_status_t mf_frame_reader_init(mf_frame_reader_t *r, uint32_t max_frame)
{
    if (!r || max_frame < MF_FRAME_MIN_MAX)
        return MF_INVALID_ARGUMENT;
    memset(r, 0, sizeof(*r));
    r->max_frame = max_frame;
    return MF_OK;
}

void mf_frame_reader_deinit(mf_frame_reader_t *r)
{
    if (!r)
        return;
    free(r->buf);
    r->buf = NULL;
    r->cap = r->start = r->end = 0;
}

mf_status_t mf_frame_reader_space(mf_frame_reader_t *r, size_t want, uint8_t **ptr,
                                  size_t *avail)
{
    if (r->start > 0 && r->start == r->end)
        r->start = r->end = 0;
    if (r->cap - r->end < want && r->start > 0) {
        /* Slide unread bytes to the front before growing. */
        memmove(r->buf, r->buf + r->start, r->end - r->start);
        r->end -= r->start;
        r->start = 0;
    }
    if (r->cap - r->end < want) {
        size_t ncap = r->cap ? r->cap : 4096;
        while (ncap - r->end < want)
            ncap *= 2;
        uint8_t *nb = realloc(r->buf, ncap);
        if (!nb)
            return MF_RESOURCE_EXHAUSTED;
        r->buf = nb;
        r->cap = ncap;
    }
    *ptr = r->buf + r->end;
    *avail = r->cap - r->end;
    return MF_OK;
}

void mf_frame_reader_commit(mf_frame_reader_t *r, size_t n)
{
    r->end += n;
}

mf_status_t mf_frame_reader_feed(mf_frame_reader_t *r, const void *data, size_t len)
{
    uint8_t *p;
    size_t avail;
    if (len == 0)
        return MF_OK;
    mf_status_t st = mf_frame_reader_space(r, len, &p, &avail);
    if (st != MF_OK)
        return st;
    memcpy(p, data, len);
    mf_frame_reader_commit(r, len);
    return MF_OK;
}

size_t mf_frame_reader_pending(const mf_frame_reader_t *r)
{
    return r->end - r->start;
}

/* Validates the two lengths of a frame header. */
static mf_status_t check_header(const uint8_t *p, uint32_t max_frame, uint32_t *frame_len,
                                uint32_t *msg_len, int have_msg_len, const char **why)
{
    *frame_len = get_u32le(p);
    if (*frame_len > max_frame) {
        *why = "frame exceeds max_frame";
        return MF_RESOURCE_EXHAUSTED;
    }
    if (*frame_len < 4) {
        *why = "frame shorter than its message length field";
        return MF_INVALID_ARGUMENT;
    }
    if (have_msg_len) {
        *msg_len = get_u32le(p + 4);
        if (*msg_len > *frame_len - 4) {
            *why = "message length exceeds frame length";
            return MF_INVALID_ARGUMENT;
        }
    }
    return MF_OK;
}

mf_status_t mf_frame_reader_next(mf_frame_reader_t *r, mf_frame_t *out, int *have,
                                 const char **why)
{
    const char *dummy;
    uint32_t flen, mlen = 0; /* set whenever used; initialised for gcc -O1's flow check */
    if (!why)
        why = &dummy;
    *have = 0;
    if (r->failed) {
        *why = r->why;
        return r->failed;
    }
    size_t n = r->end - r->start;
    if (n < 4)
        return MF_OK;
    const uint8_t *p = r->buf + r->start;
    mf_status_t st = check_header(p, r->max_frame, &flen, &mlen, n >= 8, why);
    if (st != MF_OK) {
        r->failed = st;
        r->why = *why;
        return st;
    }
    if (n < 4 + (size_t)flen)
        return MF_OK;
    out->msg = p + 8;
    out->msg_len = mlen;
    out->payload = p + 8 + mlen;
    out->payload_len = flen - 4 - mlen;
    r->start += 4 + (size_t)flen;
    *have = 1;
    return MF_OK;
}

mf_status_t mf_frame_parse(const void *data, size_t len, uint32_t max_frame,
                           mf_frame_t *out, size_t *consumed, const char **why)
{
    const char *dummy;
    uint32_t flen, mlen;
    if (!why)
        why = &dummy;
    if (len < MF_FRAME_HEADER) {
        *why = "truncated frame header";
        return MF_INVALID_ARGUMENT;
    }
    mf_status_t st = check_header(data, max_frame, &flen, &mlen, 1, why);
    if (st != MF_OK)
        return st;
    if (len < 4 + (size_t)flen) {
        *why = "truncated frame";
        return MF_INVALID_ARGUMENT;
    }
    const uint8_t *p = data;
    out->msg = p + 8;
    out->msg_len = mlen;
    out->payload = p + 8 + mlen;
    out->payload_len = flen - 4 - mlen;
    if (consumed)
        *consumed = 4 + (size_t)flen;
    return MF_OK;
}

static int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    *v = 0;
    for (unsigned shift = 0; *p < end && shift < 64; shift += 7) {
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return 0;
    }
    return -1;
}

/* Whether a message of type d can hold a string field, itself or in a submessage (a type
 * nested deeper than 16 counts as yes). The NUL walk below skips submessages that cannot:
 * a GetReply's thousands of RowRefs are not walked again at all. */
static int desc_has_strings(const ProtobufCMessageDescriptor *d, int depth)
{
    if (depth >= 16)
        return 1;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *fd = &d->fields[i];
        if (fd->type == PROTOBUF_C_TYPE_STRING ||
            (fd->type == PROTOBUF_C_TYPE_MESSAGE && fd->descriptor != d &&
             desc_has_strings(fd->descriptor, depth + 1)))
            return 1;
    }
    return 0;
}

/* protobuf-c hands strings over as C strings, so one carrying a NUL would be read cut
 * short ("ab\0cd" as "ab", "token\0junk" as "token"). The message decoded already; walk
 * its wire bytes with the descriptors and refuse a NUL in any string field. */
static int strings_have_nul(const ProtobufCMessageDescriptor *d, const uint8_t *p,
                            size_t len, int depth)
{
    const uint8_t *end = p + len;
    const ProtobufCFieldDescriptor *last = NULL; /* a repeated field's elements come together */
    int last_nested = 0;
    while (p < end) {
        uint64_t key, n;
        if (read_varint(&p, end, &key) != 0)
            return 0; /* unpack accepted it; nothing more to learn here */
        switch (key & 7) {
        case 0:
            if (read_varint(&p, end, &n) != 0)
                return 0;
            break;
        case 1: p += 8; break;
        case 5: p += 4; break;
        case 2: {
            if (read_varint(&p, end, &n) != 0 || n > (uint64_t)(end - p))
                return 0;
            const ProtobufCFieldDescriptor *fd =
                last && last->id == (uint32_t)(key >> 3)
                    ? last
                    : protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3));
            if (fd != last) {
                last = fd;
                last_nested = fd && fd->type == PROTOBUF_C_TYPE_MESSAGE &&
                              desc_has_strings(fd->descriptor, depth + 1);
            }
            if (fd && fd->type == PROTOBUF_C_TYPE_STRING && memchr(p, 0, (size_t)n))
                return 1;
            if (last_nested && depth < 16 &&
                strings_have_nul(fd->descriptor, p, (size_t)n, depth + 1))
                return 1;
            p += n;
            break;
        }
        default: return 0; /* groups: not in this protocol */
        }
    }
    return 0;
}

/*
 * The memory of one decoded envelope: protobuf-c allocates every submessage, repeated
 * array and string through this bump allocator (a GetReply of 15,360 RowRefs would
 * otherwise be 15,360 mallocs and as many frees), frees are no-ops, and the chunks go
 * together in mf_envelope_free. The envelope itself is protobuf-c's first allocation,
 * so it sits at the start of the first chunk and finds its chunks from there.
 */
typedef struct dec_chunk {
    struct dec_chunk *next; /* the first chunk: the later ones; a later one: the next */
    size_t cap, used;
    max_align_t data[];
} dec_chunk_t;

typedef struct dec_arena {
    dec_chunk_t *first, *cur;
    size_t total;     /* bytes of every chunk: the next one doubles it */
    int failed;
} dec_arena_t;

#define DEC_ALIGN 16u

static dec_chunk_t *dec_chunk_new(size_t cap)
{
    dec_chunk_t *c = malloc(sizeof(*c) + cap);
    if (c)
        *c = (dec_chunk_t){NULL, cap, 0};
    return c;
}

static void *dec_alloc(void *state, size_t size)
{
    dec_arena_t *a = state;
    if (size > SIZE_MAX / 2) {
        a->failed = 1;
        return NULL;
    }
    size = (size + DEC_ALIGN - 1) & ~(size_t)(DEC_ALIGN - 1);
    dec_chunk_t *c = a->cur;
    if (c->cap - c->used < size) {
        size_t cap = a->total > size ? a->total : size;
        dec_chunk_t *nc = dec_chunk_new(cap);
        if (!nc) {
            a->failed = 1;
            return NULL;
        }
        nc->next = a->first->next; /* the first chunk heads the list of the later ones */
        a->first->next = nc;
        a->cur = c = nc;
        a->total += cap;
    }
    void *p = (uint8_t *)c->data + c->used;
    c->used += size;
    return p;
}

static void dec_free(void *state, void *p)
{
    (void)state;
    (void)p; /* the chunks go together */
}

static void dec_chunks_free(dec_chunk_t *first)
{
    if (!first)
        return;
    for (dec_chunk_t *c = first->next, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    free(first);
}

/* Back to an empty first chunk (a fast decode that handed the message to protobuf-c). */
static void dec_reset(dec_arena_t *a)
{
    for (dec_chunk_t *c = a->first->next, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    a->first->next = NULL;
    a->first->used = 0;
    a->cur = a->first;
    a->total = a->first->cap;
    a->failed = 0;
}

/*
 * GetReply envelopes decoded by hand into the arena, the same structs protobuf-c would
 * make: a leased prefix Get's reply is 15,360 RowRefs, which protobuf-c scans, sorts into
 * per-field slabs and unpacks through the descriptors one by one. Only the plain form
 * is taken (one-byte tags of known fields, each of its wire type; 32-bit fields below
 * 2^32; GetReply once; varints of up to 10 bytes read as protobuf-c reads them): anything else, unknown fields or
 * malformed bytes included, returns -1 and goes to protobuf-c, whose answer stands.
 */
static int row_ref_fast(const uint8_t *p, const uint8_t *end, Mapflow__V1__RowRef *r)
{
    while (p < end) {
        uint8_t key = *p++;
        uint64_t v;
        if ((key & 0x87) != 0 || read_varint(&p, end, &v) != 0)
            return -1; /* wire type 0 and a field below 16 */
        unsigned n = key >> 3;
        if (n >= 5 && n <= 8) {
            *(n == 5 ? &r->length : n == 6 ? &r->lease_id : n == 7 ? &r->arena_offset
                                                                 : &r->payload_offset) = v;
        } else if (v > UINT32_MAX) {
            return -1;
        } else if (n == 4) {
            if (v > INT32_MAX)
                return -1;
            r->tier = (Mapflow__V1__Tier)v;
        } else if (n == 1 || n == 2 || n == 3 || n == 9) {
            *(n == 1 ? &r->status : n == 2 ? &r->layer : n == 3 ? &r->block
                                                                : &r->gpu_arena) = (uint32_t)v;
        } else {
            return -1;
        }
    }
    return 0;
}

/* Rows counted first (pass 1), then decoded into one array of RowRefs. */
static int get_reply_fast(const uint8_t *p, const uint8_t *end, Mapflow__V1__GetReply *g,
                          dec_arena_t *a)
{
    size_t n = 0;
    for (const uint8_t *q = p; q < end;) {
        uint8_t key = *q++;
        uint64_t v;
        if (read_varint(&q, end, &v) != 0)
            return -1;
        if (key == (1 << 3 | 2)) {
            if (v > (uint64_t)(end - q))
                return -1;
            q += v;
            n++;
        } else if (key != (2 << 3 | 0)) {
            return -1;
        }
    }
    Mapflow__V1__RowRef *rows = NULL;
    if (n) {
        g->rows = dec_alloc(a, n * sizeof(*g->rows));
        rows = dec_alloc(a, n * sizeof(*rows));
        if (!g->rows || !rows)
            return -1;
    }
    while (p < end) {
        uint8_t key = *p++;
        uint64_t v;
        read_varint(&p, end, &v); /* pass 1 read it */
        if (key == (2 << 3 | 0)) {
            g->lease_ttl_ms = v;
            continue;
        }
        Mapflow__V1__RowRef *r = &rows[g->n_rows];
        mapflow__v1__row_ref__init(r);
        if (row_ref_fast(p, p + v, r) != 0)
            return -1;
        g->rows[g->n_rows++] = r;
        p += v;
    }
    return 0;
}

/* 0: *env is the GetReply envelope, the arena's first allocation. */
static int get_reply_env_fast(const uint8_t *p, size_t len, dec_arena_t *a,
                              mf_envelope_t **env)
{
    const uint8_t *end = p + len;
    mf_envelope_t *e = dec_alloc(a, sizeof(*e));
    Mapflow__V1__GetReply *g = dec_alloc(a, sizeof(*g));
    if (!e || !g || (void *)e != (void *)a->first->data)
        return -1;
    mapflow__v1__envelope__init(e);
    mapflow__v1__get_reply__init(g);
    while (p < end) {
        uint64_t v;
        if (*p == (1 << 3 | 0)) {
            p++;
            if (read_varint(&p, end, &v) != 0)
                return -1;
            e->request_id = v;
        } else if (end - p >= 2 && p[0] == (uint8_t)(0x80 | (22 << 3 | 2)) && p[1] == 22 >> 4 &&
                   !e->get_reply) {
            p += 2;
            if (read_varint(&p, end, &v) != 0 || v > (uint64_t)(end - p) ||
                get_reply_fast(p, p + v, g, a) != 0)
                return -1;
            e->body_case = MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY;
            e->get_reply = g;
            p += v;
        } else {
            return -1;
        }
    }
    if (!e->get_reply)
        return -1;
    *env = e;
    return 0;
}

mf_status_t mf_envelope_decode(const mf_frame_t *f, mf_envelope_t **env, const char **why)
{
    const char *dummy;
    if (!why)
        why = &dummy;
    /* The unpacked form is a few times the wire size (RowRef: ~30 wire bytes, an 80-byte
     * struct, its pointer and 32 bytes of protobuf-c scan state); pages a chunk does not
     * use are never touched. Past 16 MiB later chunks double it as needed. */
    size_t cap = 1024 + 6 * (size_t)f->msg_len;
    if (cap > ((size_t)16 << 20))
        cap = (size_t)16 << 20;
    dec_arena_t a = {dec_chunk_new(cap), NULL, cap, 0};
    if (!a.first) {
        *env = NULL;
        *why = "out of memory";
        return MF_RESOURCE_EXHAUSTED;
    }
    a.cur = a.first;
    if (get_reply_env_fast(f->msg, f->msg_len, &a, env) == 0)
        return MF_OK; /* no string fields: nothing for the NUL walk */
    dec_reset(&a);
    ProtobufCAllocator al = {dec_alloc, dec_free, &a};
    *env = mapflow__v1__envelope__unpack(&al, f->msg_len, f->msg);
    const char *bad = NULL;
    mf_status_t st = MF_INVALID_ARGUMENT;
    if (!*env && a.failed) {
        bad = "out of memory";
        st = MF_RESOURCE_EXHAUSTED;
    } else if (!*env) {
        bad = "malformed message";
    } else if ((void *)*env != (void *)a.first->data) {
        bad = "decoder's envelope outside its arena"; /* a protobuf-c that allocates otherwise */
        st = MF_INTERNAL;
    } else if ((*env)->body_case == MAPFLOW__V1__ENVELOPE__BODY__NOT_SET) {
        bad = "unknown message type";
        st = MF_UNIMPLEMENTED;
    } else if (strings_have_nul(&mapflow__v1__envelope__descriptor, f->msg, f->msg_len, 0)) {
        bad = "a string field contains a NUL byte";
    }
    if (bad) {
        dec_chunks_free(a.first);
        *env = NULL;
        *why = bad;
        return st;
    }
    return MF_OK;
}

void mf_envelope_free(mf_envelope_t *env)
{
    if (env)
        dec_chunks_free((dec_chunk_t *)((uint8_t *)env - offsetof(dec_chunk_t, data)));
}

/*
 * GetReply envelopes packed by hand: byte for byte what protobuf-c writes (fields in
 * number order, proto3 zeros left out, enums as int32 varints; test_proto_frame compares
 * the two on random replies), without its per-field descriptor walk, done twice (size,
 * then pack) for each of a leased prefix Get's 15,360 RowRefs. Any unknown fields: the
 * generic packer.
 */
static size_t varint_size(uint64_t v)
{
    return 1 + (size_t)(63 - __builtin_clzll(v | 1)) / 7; /* 7 bits a byte */
}

static uint8_t *varint_put(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/* A proto3 scalar field of number n < 16 (one tag byte): 0 when v is 0 (not written). */
#define FIELD_SIZE(v) ((v) ? 1 + varint_size(v) : 0)
#define ENUM_U64(e) ((uint64_t)(int64_t)(int32_t)(e))

static size_t row_ref_size(const Mapflow__V1__RowRef *r)
{
    return FIELD_SIZE(r->status) + FIELD_SIZE(r->layer) + FIELD_SIZE(r->block) +
           FIELD_SIZE(ENUM_U64(r->tier)) + FIELD_SIZE(r->length) + FIELD_SIZE(r->lease_id) +
           FIELD_SIZE(r->arena_offset) + FIELD_SIZE(r->payload_offset) +
           FIELD_SIZE(r->gpu_arena);
}

static uint8_t *field_put(uint8_t *p, unsigned n, uint64_t v)
{
    if (!v)
        return p;
    *p++ = (uint8_t)(n << 3);
    return varint_put(p, v);
}

/* The GetReply body's size, or 0 with *generic set when it needs the generic packer. */
static size_t get_reply_size(const Mapflow__V1__GetReply *g, int *generic)
{
    size_t n = FIELD_SIZE(g->lease_ttl_ms);
    *generic = g->base.n_unknown_fields != 0;
    for (size_t i = 0; i < g->n_rows && !*generic; i++) {
        const Mapflow__V1__RowRef *r = g->rows[i];
        *generic = r->base.n_unknown_fields != 0;
        n += 2 + row_ref_size(r); /* tag, one length byte (get_reply_env_pack) */
    }
    return n;
}

static size_t get_reply_env_size(const mf_envelope_t *env, size_t *body, int *generic)
{
    *generic = env->base.n_unknown_fields != 0 || !env->get_reply;
    if (*generic)
        return 0;
    *body = get_reply_size(env->get_reply, generic);
    return FIELD_SIZE(env->request_id) +
           varint_size((uint64_t)MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY << 3 | 2) +
           varint_size(*body) + *body;
}

static void get_reply_env_pack(const mf_envelope_t *env, size_t body, uint8_t *p)
{
    const Mapflow__V1__GetReply *g = env->get_reply;
    p = field_put(p, 1, env->request_id);
    p = varint_put(p, (uint64_t)MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY << 3 | 2);
    p = varint_put(p, body);
    for (size_t i = 0; i < g->n_rows; i++) {
        const Mapflow__V1__RowRef *r = g->rows[i];
        /* A RowRef is at most 9 × 11 bytes: its length is one byte, filled in after. */
        *p++ = 1 << 3 | 2;
        uint8_t *len = p++, *at = p;
        p = field_put(p, 1, r->status);
        p = field_put(p, 2, r->layer);
        p = field_put(p, 3, r->block);
        p = field_put(p, 4, ENUM_U64(r->tier));
        p = field_put(p, 5, r->length);
        p = field_put(p, 6, r->lease_id);
        p = field_put(p, 7, r->arena_offset);
        p = field_put(p, 8, r->payload_offset);
        p = field_put(p, 9, r->gpu_arena);
        *len = (uint8_t)(p - at);
    }
    field_put(p, 2, g->lease_ttl_ms);
}

static mf_status_t encode(const mf_envelope_t *env, const void *payload, size_t payload_len,
                          int copy_payload, uint32_t max_frame, uint8_t **out,
                          size_t *out_len)
{
    size_t body = 0;
    int generic = 1;
    size_t mlen = env->body_case == MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY
                      ? get_reply_env_size(env, &body, &generic) : 0;
    if (generic)
        mlen = mapflow__v1__envelope__get_packed_size(env);
    uint64_t flen = 4ull + mlen + payload_len;
    if (flen > max_frame)
        return MF_RESOURCE_EXHAUSTED;
    size_t total = 4 + 4 + mlen + (copy_payload ? payload_len : 0);
    uint8_t *b = malloc(total ? total : 1);
    if (!b)
        return MF_RESOURCE_EXHAUSTED;
    put_u32le(b, (uint32_t)flen);
    put_u32le(b + 4, (uint32_t)mlen);
    if (generic)
        mapflow__v1__envelope__pack(env, b + 8);
    else
        get_reply_env_pack(env, body, b + 8);
    if (copy_payload && payload_len)
        memcpy(b + 8 + mlen, payload, payload_len);
    *out = b;
    *out_len = total;
    return MF_OK;
}

mf_status_t mf_frame_encode(const mf_envelope_t *env, const void *payload,
                            size_t payload_len, uint32_t max_frame, uint8_t **out,
                            size_t *out_len)
{
    if (!env || !out || !out_len || (payload_len && !payload))
        return MF_INVALID_ARGUMENT;
    return encode(env, payload, payload_len, 1, max_frame, out, out_len);
}

mf_status_t mf_frame_encode_head(const mf_envelope_t *env, size_t payload_len,
                                 uint32_t max_frame, uint8_t **out, size_t *out_len)
{
    if (!env || !out || !out_len)
        return MF_INVALID_ARGUMENT;
    return encode(env, NULL, payload_len, 0, max_frame, out, out_len);
}

const char *mf_envelope_body_name(int body_case)
{
    const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field(
        &mapflow__v1__envelope__descriptor, (unsigned)body_case);
    return (fd && body_case >= 10) ? fd->name : "unknown";
}
