/* mf_frame — incremental frame reader and frame encoder (see mf_frame.h). */
#include "mf_frame.h"

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

/* protobuf-c hands strings over as C strings, so one carrying a NUL would be read cut
 * short ("ab\0cd" as "ab", "token\0junk" as "token"). The message decoded already; walk
 * its wire bytes with the descriptors and refuse a NUL in any string field. */
static int strings_have_nul(const ProtobufCMessageDescriptor *d, const uint8_t *p,
                            size_t len, int depth)
{
    const uint8_t *end = p + len;
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
                protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3));
            if (fd && fd->type == PROTOBUF_C_TYPE_STRING && memchr(p, 0, (size_t)n))
                return 1;
            if (fd && fd->type == PROTOBUF_C_TYPE_MESSAGE && depth < 16 &&
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

mf_status_t mf_envelope_decode(const mf_frame_t *f, mf_envelope_t **env, const char **why)
{
    const char *dummy;
    if (!why)
        why = &dummy;
    *env = mapflow__v1__envelope__unpack(NULL, f->msg_len, f->msg);
    if (!*env) {
        *why = "malformed message";
        return MF_INVALID_ARGUMENT;
    }
    if ((*env)->body_case == MAPFLOW__V1__ENVELOPE__BODY__NOT_SET) {
        mapflow__v1__envelope__free_unpacked(*env, NULL);
        *env = NULL;
        *why = "unknown message type";
        return MF_UNIMPLEMENTED;
    }
    if (strings_have_nul(&mapflow__v1__envelope__descriptor, f->msg, f->msg_len, 0)) {
        mapflow__v1__envelope__free_unpacked(*env, NULL);
        *env = NULL;
        *why = "a string field contains a NUL byte";
        return MF_INVALID_ARGUMENT;
    }
    return MF_OK;
}

void mf_envelope_free(mf_envelope_t *env)
{
    if (env)
        mapflow__v1__envelope__free_unpacked(env, NULL);
}

static mf_status_t encode(const mf_envelope_t *env, const void *payload, size_t payload_len,
                          int copy_payload, uint32_t max_frame, uint8_t **out,
                          size_t *out_len)
{
    size_t mlen = mapflow__v1__envelope__get_packed_size(env);
    uint64_t flen = 4ull + mlen + payload_len;
    if (flen > max_frame)
        return MF_RESOURCE_EXHAUSTED;
    size_t total = 4 + 4 + mlen + (copy_payload ? payload_len : 0);
    uint8_t *b = malloc(total ? total : 1);
    if (!b)
        return MF_RESOURCE_EXHAUSTED;
    put_u32le(b, (uint32_t)flen);
    put_u32le(b + 4, (uint32_t)mlen);
    mapflow__v1__envelope__pack(env, b + 8);
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
