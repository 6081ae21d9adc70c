/* Frames: encode/decode round trip fed in random pieces, several frames per read, and a
 * clear status for oversize lengths, truncation, garbage and unknown message types. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "mf_frame.h"

static uint64_t rng = 0x13198a2e03707344ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static uint8_t *make_lookup(uint64_t id, uint32_t n_layers, size_t payload_len, uint8_t **payload,
                            size_t *len)
{
    Mapflow__V1__Envelope env = MAPFLOW__V1__ENVELOPE__INIT;
    Mapflow__V1__Lookup lk = MAPFLOW__V1__LOOKUP__INIT;
    uint32_t layers[64];
    for (uint32_t k = 0; k < n_layers; k++)
        layers[k] = rnd() % 100;
    lk.model = "model-x";
    lk.block_size = 64;
    lk.n_layers = n_layers;
    lk.layers = layers;
    env.request_id = id;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_LOOKUP;
    env.lookup = &lk;
    *payload = malloc(payload_len + 1);
    for (size_t k = 0; k < payload_len; k++)
        (*payload)[k] = (uint8_t)(rnd() | 1);
    uint8_t *out;
    assert_int_equal(mf_frame_encode(&env, *payload, payload_len, MF_FRAME_DEFAULT_MAX, &out, len),
                     MF_OK);
    return out;
}

static void test_roundtrip_in_pieces(void **s)
{
    (void)s;
    enum { NF = 50 };
    uint8_t *frames[NF], *payloads[NF];
    size_t lens[NF], plens[NF], total = 0;
    for (int f = 0; f < NF; f++) {
        plens[f] = rnd() % 3000;
        frames[f] = make_lookup(1000 + (uint64_t)f, 1 + rnd() % 40, plens[f], &payloads[f], &lens[f]);
        total += lens[f];
    }
    uint8_t *stream = malloc(total);
    size_t off = 0;
    for (int f = 0; f < NF; f++) {
        memcpy(stream + off, frames[f], lens[f]);
        off += lens[f];
    }
    mf_frame_reader_t r;
    assert_int_equal(mf_frame_reader_init(&r, MF_FRAME_DEFAULT_MAX), MF_OK);
    int got = 0;
    for (off = 0; off < total;) {
        size_t chunk = 1 + rnd() % (rnd() % 2 ? 7 : 9000); /* tiny and multi-frame reads */
        if (chunk > total - off)
            chunk = total - off;
        assert_int_equal(mf_frame_reader_feed(&r, stream + off, chunk), MF_OK);
        off += chunk;
        for (;;) {
            mf_frame_t fr;
            int have;
            assert_int_equal(mf_frame_reader_next(&r, &fr, &have, NULL), MF_OK);
            if (!have)
                break;
            mf_envelope_t *env;
            assert_int_equal(mf_envelope_decode(&fr, &env, NULL), MF_OK);
            assert_int_equal(env->request_id, 1000 + (uint64_t)got);
            assert_int_equal(env->body_case, MAPFLOW__V1__ENVELOPE__BODY_LOOKUP);
            assert_string_equal(env->lookup->model, "model-x");
            assert_int_equal(fr.payload_len, plens[got]);
            assert_memory_equal(fr.payload, payloads[got], plens[got]);
            assert_string_equal(mf_envelope_body_name((int)env->body_case), "lookup");
            mf_envelope_free(env);
            got++;
        }
    }
    assert_int_equal(got, NF);
    assert_int_equal(mf_frame_reader_pending(&r), 0);
    mf_frame_reader_deinit(&r);
    for (int f = 0; f < NF; f++) {
        free(frames[f]);
        free(payloads[f]);
    }
    free(stream);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int k = 0; k < 4; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

static void test_oversize_refused_before_body(void **s)
{
    (void)s;
    mf_frame_reader_t r;
    uint8_t hdr[4];
    assert_int_equal(mf_frame_reader_init(&r, 1 << 20), MF_OK);
    put_u32(hdr, (1 << 20) + 1);
    assert_int_equal(mf_frame_reader_feed(&r, hdr, 4), MF_OK);
    mf_frame_t fr;
    int have;
    const char *why;
    assert_int_equal(mf_frame_reader_next(&r, &fr, &have, &why), MF_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(why, "max_frame"));
    /* The error is sticky: the stream cannot be resynchronised. */
    assert_int_equal(mf_frame_reader_feed(&r, hdr, 4), MF_OK);
    assert_int_equal(mf_frame_reader_next(&r, &fr, &have, &why), MF_RESOURCE_EXHAUSTED);
    mf_frame_reader_deinit(&r);
    /* The encoder refuses too. */
    uint8_t *payload, *out;
    size_t len;
    uint8_t *f = make_lookup(1, 1, 10, &payload, &len);
    Mapflow__V1__Envelope env = MAPFLOW__V1__ENVELOPE__INIT;
    assert_int_equal(mf_frame_encode(&env, payload, 8192, 4096, &out, &len), MF_RESOURCE_EXHAUSTED);
    assert_int_equal(mf_frame_reader_init(&r, 100), MF_INVALID_ARGUMENT);
    free(f);
    free(payload);
}

static void test_bad_lengths_and_truncation(void **s)
{
    (void)s;
    uint8_t b[16] = { 0 };
    mf_frame_t fr;
    size_t used;
    const char *why;
    put_u32(b, 2);
    assert_int_equal(mf_frame_parse(b, 8, 4096, &fr, &used, &why), MF_INVALID_ARGUMENT);
    assert_non_null(strstr(why, "shorter"));
    put_u32(b, 8);
    put_u32(b + 4, 5);
    assert_int_equal(mf_frame_parse(b, 12, 4096, &fr, &used, &why), MF_INVALID_ARGUMENT);
    assert_non_null(strstr(why, "message length exceeds"));
    put_u32(b + 4, 4);
    assert_int_equal(mf_frame_parse(b, 11, 4096, &fr, &used, &why), MF_INVALID_ARGUMENT);
    assert_non_null(strstr(why, "truncated"));
    assert_int_equal(mf_frame_parse(b, 5, 4096, &fr, &used, &why), MF_INVALID_ARGUMENT);
    assert_int_equal(mf_frame_parse(b, 12, 4096, &fr, &used, &why), MF_OK);
    assert_int_equal(used, 12);
    assert_int_equal(fr.msg_len, 4);
    assert_int_equal(fr.payload_len, 0);
    /* A partial frame in the reader just waits for more bytes. */
    mf_frame_reader_t r;
    int have;
    mf_frame_reader_init(&r, 4096);
    mf_frame_reader_feed(&r, b, 7);
    assert_int_equal(mf_frame_reader_next(&r, &fr, &have, &why), MF_OK);
    assert_int_equal(have, 0);
    mf_frame_reader_deinit(&r);
}

/* A NUL inside any string field (top level or nested) is refused; NULs in bytes fields
 * (hashes) are data. The strings are random, the NUL lands at a random place. */
static void test_nul_in_strings(void **s)
{
    (void)s;
    for (int t = 0; t < 200; t++) {
        char model[24], tok[16];
        for (size_t i = 0; i + 1 < sizeof model; i++)
            model[i] = (char)('a' + rnd() % 26);
        model[sizeof model - 1] = 0;
        for (size_t i = 0; i + 1 < sizeof tok; i++)
            tok[i] = (char)('A' + rnd() % 26);
        tok[sizeof tok - 1] = 0;
        uint8_t hash[16] = {0};
        hash[rnd() % 16] = (uint8_t)(1 + rnd() % 255); /* mostly zero bytes: legal */
        Mapflow__V1__Key k = MAPFLOW__V1__KEY__INIT;
        k.model = model;
        k.hash.data = hash;
        k.hash.len = 16;
        Mapflow__V1__PutBegin pb = MAPFLOW__V1__PUT_BEGIN__INIT;
        pb.key = &k;
        pb.size = 100 + rnd() % 1000;
        mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
        env.body_case = MAPFLOW__V1__ENVELOPE__BODY_PUT_BEGIN;
        env.put_begin = &pb;
        int nested = t % 2;
        Mapflow__V1__Hello h = MAPFLOW__V1__HELLO__INIT;
        if (!nested) {
            h.protocol_version = 1;
            h.namespace_ = "ns";
            h.token = tok;
            env.body_case = MAPFLOW__V1__ENVELOPE__BODY_HELLO;
            env.hello = &h;
        }
        uint8_t buf[256];
        size_t n = mapflow__v1__envelope__pack(&env, buf);
        mf_frame_t fr = { buf, n, NULL, 0 };
        mf_envelope_t *out;
        const char *why;
        assert_int_equal(mf_envelope_decode(&fr, &out, &why), MF_OK);
        mf_envelope_free(out);
        /* Put a NUL into the string's bytes inside the packed message. */
        const char *str = nested ? model : tok;
        size_t sl = strlen(str), at = 0;
        for (size_t i = 0; i + sl <= n; i++)
            if (memcmp(buf + i, str, sl) == 0)
                at = i;
        assert_true(at > 0);
        buf[at + 1 + rnd() % (sl - 1)] = 0;
        assert_int_equal(mf_envelope_decode(&fr, &out, &why), MF_INVALID_ARGUMENT);
        assert_non_null(strstr(why, "NUL"));
        assert_null(out);
    }
}

/* A GetReply of many RowRefs decodes field for field, through the decoder's arena: empty
 * rows (2 wire bytes, an 80-byte struct) among random ones make it outgrow its first
 * chunk, so later chunks are exercised; a truncated copy is refused with nothing leaked. */
static void test_get_reply_many_rows(void **s)
{
    (void)s;
    for (int t = 0; t < 3; t++) {
        size_t n = 5000 + rnd() % 20000;
        Mapflow__V1__RowRef *rr = calloc(n, sizeof(*rr));
        Mapflow__V1__RowRef **rp = malloc(n * sizeof(*rp));
        assert_non_null(rr);
        assert_non_null(rp);
        for (size_t i = 0; i < n; i++) {
            mapflow__v1__row_ref__init(&rr[i]);
            rp[i] = &rr[i];
            if (rnd() % 4 != 0)
                continue; /* every field default: the smallest wire form (3 in 4) */
            rr[i].status = rnd() % MF_STATUS_COUNT;
            rr[i].layer = rnd() % 64;
            rr[i].block = rnd();
            rr[i].tier = (Mapflow__V1__Tier)(rnd() % 3);
            rr[i].length = ((uint64_t)rnd() << 20) ^ rnd();
            rr[i].lease_id = ((uint64_t)rnd() << 32) | rnd();
            rr[i].arena_offset = ((uint64_t)rnd() << 4) & ~(uint64_t)15;
            rr[i].gpu_arena = rnd() % 8;
        }
        Mapflow__V1__GetReply gr = MAPFLOW__V1__GET_REPLY__INIT;
        gr.n_rows = n;
        gr.rows = rp;
        gr.lease_ttl_ms = 1 + rnd();
        mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
        env.request_id = rnd();
        env.body_case = MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY;
        env.get_reply = &gr;
        size_t len = mapflow__v1__envelope__get_packed_size(&env);
        uint8_t *buf = malloc(len);
        assert_int_equal(mapflow__v1__envelope__pack(&env, buf), len);
        mf_frame_t fr = {buf, (uint32_t)len, NULL, 0};
        mf_envelope_t *out = NULL;
        const char *why = NULL;
        assert_int_equal(mf_envelope_decode(&fr, &out, &why), MF_OK);
        assert_int_equal(out->request_id, env.request_id);
        assert_int_equal(out->body_case, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY);
        const Mapflow__V1__GetReply *g = out->get_reply;
        assert_int_equal(g->n_rows, n);
        assert_int_equal(g->lease_ttl_ms, gr.lease_ttl_ms);
        for (size_t i = 0; i < n; i++) {
            const Mapflow__V1__RowRef *a = g->rows[i], *b = &rr[i];
            assert_int_equal(a->status, b->status);
            assert_int_equal(a->layer, b->layer);
            assert_int_equal(a->block, b->block);
            assert_int_equal(a->tier, b->tier);
            assert_int_equal(a->length, b->length);
            assert_int_equal(a->lease_id, b->lease_id);
            assert_int_equal(a->arena_offset, b->arena_offset);
            assert_int_equal(a->gpu_arena, b->gpu_arena);
        }
        mf_envelope_free(out);
        fr.msg_len = (uint32_t)(len - 1 - rnd() % 8); /* cut inside the last row */
        assert_int_equal(mf_envelope_decode(&fr, &out, &why), MF_INVALID_ARGUMENT);
        assert_null(out);
        free(buf);
        free(rp);
        free(rr);
    }
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* A random 0..64-bit value, 0 one time in three (proto3 leaves zeros out). */
static uint64_t rnd_field(void)
{
    if (rnd() % 3 == 0)
        return 0;
    uint64_t v = ((uint64_t)rnd() << 32) ^ ((uint64_t)rnd() << 11) ^ rnd();
    return v >> (rnd() % 64);
}

/* mf_frame_encode's own GetReply packer writes exactly protobuf-c's bytes: random rows,
 * every field zero or not, values of every varint length, empty replies too. */
static void test_get_reply_encode_matches_protobuf(void **s)
{
    (void)s;
    for (int t = 0; t < 60; t++) {
        size_t n = t % 10 == 0 ? 0 : 1 + rnd() % 3000;
        Mapflow__V1__RowRef *rr = calloc(n ? n : 1, sizeof(*rr));
        Mapflow__V1__RowRef **rp = malloc((n ? n : 1) * sizeof(*rp));
        assert_non_null(rr);
        assert_non_null(rp);
        for (size_t i = 0; i < n; i++) {
            mapflow__v1__row_ref__init(&rr[i]);
            rp[i] = &rr[i];
            rr[i].status = (uint32_t)rnd_field();
            rr[i].layer = (uint32_t)rnd_field();
            rr[i].block = (uint32_t)rnd_field();
            rr[i].tier = (Mapflow__V1__Tier)(rnd_field() % 4);
            rr[i].length = rnd_field();
            rr[i].lease_id = rnd_field();
            rr[i].arena_offset = rnd_field();
            rr[i].payload_offset = rnd_field();
            rr[i].gpu_arena = (uint32_t)rnd_field();
        }
        Mapflow__V1__GetReply gr = MAPFLOW__V1__GET_REPLY__INIT;
        gr.n_rows = n;
        gr.rows = rp;
        gr.lease_ttl_ms = rnd_field();
        mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
        env.request_id = rnd_field();
        env.body_case = MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY;
        env.get_reply = &gr;
        size_t want_len = mapflow__v1__envelope__get_packed_size(&env);
        uint8_t *want = malloc(want_len ? want_len : 1);
        assert_int_equal(mapflow__v1__envelope__pack(&env, want), want_len);
        uint8_t *f = NULL;
        size_t flen = 0, plen = rnd() % 64;
        assert_int_equal(mf_frame_encode_head(&env, plen, MF_FRAME_DEFAULT_MAX, &f, &flen),
                         MF_OK);
        assert_int_equal(flen, 8 + want_len);
        assert_int_equal(get_u32(f), 4 + want_len + plen);
        assert_int_equal(get_u32(f + 4), want_len);
        assert_memory_equal(f + 8, want, want_len);
        /* and a frame too small for it is refused, as with the generic packer */
        uint8_t *g = NULL;
        size_t glen = 0;
        if (want_len + 4 > MF_FRAME_MIN_MAX)
            assert_int_equal(mf_frame_encode_head(&env, 0, MF_FRAME_MIN_MAX, &g, &glen),
                             MF_RESOURCE_EXHAUSTED);
        free(f);
        free(want);
        free(rp);
        free(rr);
    }
}

static uint8_t *wv(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/* One RowRef's body written by hand; odd = 1: also a form the hand decoder leaves to
 * protobuf-c (an unknown field, a two-byte tag, a uint32 field above 2^32, an unknown
 * length-delimited field) or one both take (a 10-byte varint, a field twice: last wins). Returns the end. */
static uint8_t *row_wire(uint8_t *p, int odd)
{
    for (unsigned n = 1; n <= 9; n++) {
        uint64_t v = rnd_field();
        if (n == 4)
            v %= 4;
        else if (n <= 3 || n == 9)
            v &= 0xffffffffu;
        if (!v && rnd() % 2)
            continue;
        p = wv(p, n << 3);
        p = wv(p, v);
    }
    switch (odd ? rnd() % 6 : 6) {
    case 0: p = wv(p, 15 << 3); p = wv(p, rnd()); break;          /* unknown varint */
    case 1: *p++ = 0x90; *p++ = 0x00; p = wv(p, rnd()); break;     /* field 2, 2-byte tag */
    case 2: p = wv(p, 3 << 3); p = wv(p, (1ull << 32) + rnd()); break;
    case 3: p = wv(p, 6 << 3); p = wv(p, ~0ull - rnd()); break;     /* 10 bytes: both */
    case 4: p = wv(p, 2 << 3); p = wv(p, rnd()); break;             /* layer again: both */
    case 5: p = wv(p, 12 << 3 | 2); p = wv(p, 3); *p++ = 1; *p++ = 2; *p++ = 3; break;
    default: break;
    }
    return p;
}

/* The hand-decoded GetReply (plain replies) and protobuf-c's decode of the same bytes
 * agree field for field; a reply with any form the hand decoder does not take (one odd
 * row among many) still decodes, through protobuf-c, to the same as protobuf-c alone. */
static void test_get_reply_decode_matches_protobuf(void **s)
{
    (void)s;
    enum { MAXR = 2000 };
    uint8_t *buf = malloc(MAXR * 100 + 64), *row = malloc(128);
    assert_non_null(buf);
    assert_non_null(row);
    for (int t = 0; t < 80; t++) {
        size_t n = t % 9 == 0 ? 0 : 1 + rnd() % MAXR, odd_at = t % 2 ? rnd() % (n + 1) : n;
        uint8_t *body = buf + 16, *p = body;
        for (size_t i = 0; i < n; i++) {
            size_t rl = (size_t)(row_wire(row, i == odd_at) - row);
            p = wv(p, 1 << 3 | 2);
            p = wv(p, rl);
            memcpy(p, row, rl);
            p += rl;
            if (rnd() % 500 == 0) { /* lease_ttl_ms among the rows, maybe twice */
                p = wv(p, 2 << 3);
                p = wv(p, rnd_field());
            }
        }
        size_t blen = (size_t)(p - body);
        uint8_t head[24], *h = head;
        if (rnd() % 3) {
            h = wv(h, 1 << 3);
            h = wv(h, rnd_field());
        }
        h = wv(h, 22 << 3 | 2);
        h = wv(h, blen);
        size_t hl = (size_t)(h - head);
        memcpy(body - hl, head, hl);
        mf_frame_t fr = {body - hl, (uint32_t)(hl + blen), NULL, 0};
        Mapflow__V1__Envelope *want = mapflow__v1__envelope__unpack(NULL, fr.msg_len, fr.msg);
        assert_non_null(want);
        mf_envelope_t *got = NULL;
        const char *why = NULL;
        assert_int_equal(mf_envelope_decode(&fr, &got, &why), MF_OK);
        assert_int_equal(got->request_id, want->request_id);
        assert_int_equal(got->body_case, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY);
        const Mapflow__V1__GetReply *a = got->get_reply, *b = want->get_reply;
        assert_int_equal(a->n_rows, n);
        assert_int_equal(b->n_rows, n);
        assert_int_equal(a->lease_ttl_ms, b->lease_ttl_ms);
        for (size_t i = 0; i < n; i++) {
            const Mapflow__V1__RowRef *x = a->rows[i], *y = b->rows[i];
            assert_int_equal(x->status, y->status);
            assert_int_equal(x->layer, y->layer);
            assert_int_equal(x->block, y->block);
            assert_int_equal(x->tier, y->tier);
            assert_int_equal(x->length, y->length);
            assert_int_equal(x->lease_id, y->lease_id);
            assert_int_equal(x->arena_offset, y->arena_offset);
            assert_int_equal(x->payload_offset, y->payload_offset);
            assert_int_equal(x->gpu_arena, y->gpu_arena);
        }
        mf_envelope_free(got);
        mapflow__v1__envelope__free_unpacked(want, NULL);
        /* cut short anywhere inside the rows: refused (or, cut at a row's end, fewer rows) */
        if (blen > 2) {
            fr.msg_len = (uint32_t)(hl + 1 + rnd() % (blen - 1));
            want = mapflow__v1__envelope__unpack(NULL, fr.msg_len, fr.msg);
            mf_status_t st = mf_envelope_decode(&fr, &got, &why);
            assert_int_equal(st, MF_INVALID_ARGUMENT); /* GetReply's length now overruns */
            assert_null(got);
            assert_null(want);
        }
    }
    free(row);
    free(buf);
}

/* A NUL in the string of a later element of a repeated submessage (Get.keys[i].model) is
 * found too: the walk reuses what it learnt of the field from the first element. */
static void test_nul_in_later_key(void **s)
{
    (void)s;
    for (int t = 0; t < 50; t++) {
        size_t n = 2 + rnd() % 30, bad = 1 + rnd() % (n - 1);
        char models[32][12];
        uint8_t hash[16];
        Mapflow__V1__Key k[32], *kp[32];
        for (size_t j = 0; j < 16; j++)
            hash[j] = (uint8_t)rnd();
        for (size_t i = 0; i < n; i++) {
            for (size_t j = 0; j + 1 < sizeof models[i]; j++)
                models[i][j] = (char)('a' + rnd() % 26);
            models[i][sizeof models[i] - 1] = 0;
            mapflow__v1__key__init(&k[i]);
            k[i].model = models[i];
            k[i].layer = rnd() % 80;
            k[i].hash.data = hash;
            k[i].hash.len = 16;
            kp[i] = &k[i];
        }
        Mapflow__V1__Get g = MAPFLOW__V1__GET__INIT;
        g.n_keys = n;
        g.keys = kp;
        mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
        env.body_case = MAPFLOW__V1__ENVELOPE__BODY_GET;
        env.get = &g;
        uint8_t buf[2048];
        size_t len = mapflow__v1__envelope__pack(&env, buf);
        mf_frame_t fr = {buf, (uint32_t)len, NULL, 0};
        mf_envelope_t *out;
        const char *why;
        assert_int_equal(mf_envelope_decode(&fr, &out, &why), MF_OK);
        assert_int_equal(out->get->n_keys, n);
        assert_string_equal(out->get->keys[bad]->model, models[bad]);
        mf_envelope_free(out);
        uint8_t *at = NULL;
        for (size_t i = 0; !at && i + sizeof models[bad] - 1 <= len; i++)
            if (memcmp(buf + i, models[bad], sizeof models[bad] - 1) == 0)
                at = buf + i;
        assert_non_null(at);
        at[1 + rnd() % (strlen(models[bad]) - 1)] = 0;
        assert_int_equal(mf_envelope_decode(&fr, &out, &why), MF_INVALID_ARGUMENT);
        assert_non_null(strstr(why, "NUL"));
        assert_null(out);
    }
}

static void test_unknown_type_and_garbage(void **s)
{
    (void)s;
    /* request_id = 7, then field 99 (unknown to this version) = 1. */
    uint8_t msg[] = { 0x08, 0x07, 0x98, 0x06, 0x01 };
    mf_frame_t fr = { msg, sizeof msg, NULL, 0 };
    mf_envelope_t *env;
    const char *why;
    assert_int_equal(mf_envelope_decode(&fr, &env, &why), MF_UNIMPLEMENTED);
    assert_non_null(strstr(why, "unknown message type"));
    uint8_t bad[] = { 0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f };
    fr.msg = bad;
    fr.msg_len = sizeof bad;
    assert_int_equal(mf_envelope_decode(&fr, &env, &why), MF_INVALID_ARGUMENT);
    assert_non_null(strstr(why, "malformed"));
    /* Random garbage streams: every outcome is a status, never a crash. */
    int errors = 0;
    for (int t = 0; t < 2000; t++) {
        uint8_t g[256];
        size_t n = 1 + rnd() % sizeof g;
        for (size_t k = 0; k < n; k++)
            g[k] = (uint8_t)rnd();
        if (rnd() % 2) { /* plausible lengths to reach the envelope decoder */
            put_u32(g, (uint32_t)(n - 4));
            if (n >= 8)
                put_u32(g + 4, rnd() % (uint32_t)(n - 7));
        }
        mf_frame_reader_t r;
        mf_frame_reader_init(&r, 4096);
        mf_frame_reader_feed(&r, g, n);
        mf_frame_t f2;
        int have;
        mf_status_t st = mf_frame_reader_next(&r, &f2, &have, &why);
        if (st != MF_OK)
            errors++;
        else if (have) {
            if (mf_envelope_decode(&f2, &env, &why) == MF_OK)
                mf_envelope_free(env);
            else
                errors++;
        }
        mf_frame_reader_deinit(&r);
    }
    assert_true(errors > 100);
}

static void test_status_table(void **s)
{
    (void)s;
    assert_string_equal(mf_status_name(MF_NOT_FOUND), "NOT_FOUND");
    assert_string_equal(mf_status_name(MF_UNAUTHENTICATED), "UNAUTHENTICATED");
    assert_int_equal(MF_UNAVAILABLE, 14);
    assert_string_equal(mf_status_name(99), "UNKNOWN_STATUS");
    assert_string_equal(mf_strerror(MF_DEADLINE_EXCEEDED), "deadline exceeded");
    for (int c = 0; c < MF_STATUS_COUNT; c++)
        assert_true(mf_status_valid(c) && strcmp(mf_status_name(c), "UNKNOWN_STATUS") != 0);
    assert_false(mf_status_valid(-1) || mf_status_valid(MF_STATUS_COUNT));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_in_pieces),
        cmocka_unit_test(test_oversize_refused_before_body),
        cmocka_unit_test(test_bad_lengths_and_truncation),
        cmocka_unit_test(test_unknown_type_and_garbage),
        cmocka_unit_test(test_nul_in_strings),
        cmocka_unit_test(test_nul_in_later_key),
        cmocka_unit_test(test_get_reply_many_rows),
        cmocka_unit_test(test_get_reply_encode_matches_protobuf),
        cmocka_unit_test(test_get_reply_decode_matches_protobuf),
        cmocka_unit_test(test_status_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
