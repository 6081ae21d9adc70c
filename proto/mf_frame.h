/*
 * mf_frame — framing of the control protocol (see mapflow.proto):
 *
 *     u32 LE frame_len | u32 LE msg_len | Envelope (msg_len bytes) | payload
 *
 * frame_len counts the bytes after itself (so ≥ 4); the payload is the remaining
 * frame_len − 4 − msg_len bytes. A frame longer than max_frame is refused as soon as its
 * 4-byte length arrives, before any allocation.
 *
 * mf_frame_reader turns a byte stream into frames incrementally: partial frames wait
 * for more bytes, several frames in one read come out one by one. After an error the
 * stream cannot be resynchronised; the reader stays failed and the connection must be
 * closed (after an ErrorReply).
 *
 * Ownership: the reader owns its buffer; a frame it returns points into that buffer
 * and is valid until the next call that feeds or advances the reader.
 * Thread safety: a reader belongs to one thread; the encode functions are pure.
 */
#ifndef MF_FRAME_H
#define MF_FRAME_H

#include <stddef.h>
#include <stdint.h>
#include "mapflow.pb-c.h"
#include "mf_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MF_FRAME_HEADER      8u
#define MF_FRAME_MIN_MAX     4096u
#define MF_FRAME_DEFAULT_MAX (64u << 20)
#define MF_PROTOCOL_VERSION  1u

typedef Mapflow__V1__Envelope mf_envelope_t;

typedef struct mf_frame {
    const uint8_t *msg;
    uint32_t msg_len;
    const uint8_t *payload;
    uint32_t payload_len;
} mf_frame_t;

typedef struct mf_frame_reader {
    uint8_t *buf;
    size_t cap, start, end;    /* unread bytes are buf[start, end) */
    uint32_t max_frame;
    mf_status_t failed;        /* sticky error */
    const char *why;
} mf_frame_reader_t;

mf_status_t mf_frame_reader_init(mf_frame_reader_t *r, uint32_t max_frame);
void mf_frame_reader_deinit(mf_frame_reader_t *r);

/* Appends bytes. MF_RESOURCE_EXHAUSTED only if memory runs out. */
mf_status_t mf_frame_reader_feed(mf_frame_reader_t *r, const void *data, size_t len);

/* Room for at least `want` bytes to read(2) into directly; then mf_frame_reader_commit. */
mf_status_t mf_frame_reader_space(mf_frame_reader_t *r, size_t want, uint8_t **ptr,
                                  size_t *avail);
void mf_frame_reader_commit(mf_frame_reader_t *r, size_t n);

/*
 * Next complete frame. Returns MF_OK with *have = 1 and *out filled, MF_OK with
 * *have = 0 when more bytes are needed, or an error with *why:
 * MF_RESOURCE_EXHAUSTED (frame over max_frame), MF_INVALID_ARGUMENT (bad lengths).
 */
mf_status_t mf_frame_reader_next(mf_frame_reader_t *r, mf_frame_t *out, int *have,
                                 const char **why);

/* Bytes buffered but not yet returned as frames. */
size_t mf_frame_reader_pending(const mf_frame_reader_t *r);

/* Checks one whole frame in a buffer (header included); for datagram-like use and fuzzing. */
mf_status_t mf_frame_parse(const void *data, size_t len, uint32_t max_frame,
                           mf_frame_t *out, size_t *consumed, const char **why);

/*
 * Unpacks the Envelope of a frame. MF_INVALID_ARGUMENT "malformed message" when
 * protobuf-c rejects it or a string field holds a NUL byte (it would be read cut short),
 * MF_UNIMPLEMENTED "unknown message type" when no known body is set. Free with mf_envelope_free
 * (only envelopes from here: the whole message lives in one arena that goes with it; its
 * parts are never freed or kept on their own). A plain GetReply is decoded by hand into
 * the same structs (thousands of RowRefs), anything else by protobuf-c.
 */
mf_status_t mf_envelope_decode(const mf_frame_t *f, mf_envelope_t **env, const char **why);
void mf_envelope_free(mf_envelope_t *env);

/*
 * Encodes env (+ payload) as one frame into a malloc'd buffer (*out, *out_len); a GetReply
 * without unknown fields is packed by hand, byte for byte what protobuf-c writes.
 * MF_RESOURCE_EXHAUSTED if it would exceed max_frame (or memory runs out).
 */
mf_status_t mf_frame_encode(const mf_envelope_t *env, const void *payload,
                            size_t payload_len, uint32_t max_frame, uint8_t **out,
                            size_t *out_len);

/* Writes only the 8-byte header and envelope into a malloc'd buffer; the caller sends
 * the payload after it (for large payloads that already sit in memory). */
mf_status_t mf_frame_encode_head(const mf_envelope_t *env, size_t payload_len,
                                 uint32_t max_frame, uint8_t **out, size_t *out_len);

/* Name of an envelope body ("put_begin", ...); "unknown" otherwise. */
const char *mf_envelope_body_name(int body_case);

#ifdef __cplusplus
}
#endif
#endif /* MF_FRAME_H */
