/*
 * mf_status — the one status table of MapFlow (DESIGN §8).
 *
 * Every function that can fail in proto/, kernels/, daemon/ and client/ returns an
 * mf_status_t. The codes and their numbers are gRPC's, so a status crosses the wire
 * as its number and reads the same in C, Python and logs. The table is an X-macro:
 * the enum, mf_status_name() and mf_strerror() are all generated from it.
 *
 * Thread safety: every function here is pure and may be called from any thread.
 */
#ifndef MF_STATUS_H
#define MF_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* XX(NAME, number, message) */
#define MF_STATUS_MAP(XX)                                                           \
    XX(OK,                  0,  "ok")                                               \
    XX(CANCELLED,           1,  "operation cancelled")                              \
    XX(UNKNOWN,             2,  "unknown error")                                    \
    XX(INVALID_ARGUMENT,    3,  "invalid argument")                                 \
    XX(DEADLINE_EXCEEDED,   4,  "deadline exceeded")                                \
    XX(NOT_FOUND,           5,  "not found")                                        \
    XX(ALREADY_EXISTS,      6,  "already exists")                                   \
    XX(PERMISSION_DENIED,   7,  "permission denied")                                \
    XX(RESOURCE_EXHAUSTED,  8,  "resource exhausted")                               \
    XX(FAILED_PRECONDITION, 9,  "failed precondition")                              \
    XX(ABORTED,             10, "aborted")                                          \
    XX(OUT_OF_RANGE,        11, "out of range")                                     \
    XX(UNIMPLEMENTED,       12, "unimplemented")                                    \
    XX(INTERNAL,            13, "internal error")                                   \
    XX(UNAVAILABLE,         14, "unavailable")                                      \
    XX(DATA_LOSS,           15, "data loss or corruption")                          \
    XX(UNAUTHENTICATED,     16, "unauthenticated")

typedef enum mf_status {
#define MF_STATUS_ENUM_(name, num, msg) MF_##name = num,
    MF_STATUS_MAP(MF_STATUS_ENUM_)
#undef MF_STATUS_ENUM_
} mf_status_t;

#define MF_STATUS_COUNT 17

/* "NOT_FOUND" for MF_NOT_FOUND; "UNKNOWN_STATUS" for a number outside the table. */
const char *mf_status_name(int status);
/* A short human message; never NULL. */
const char *mf_strerror(int status);
/* 1 when `status` is one of the table's numbers. */
int mf_status_valid(int status);

#ifdef __cplusplus
}
#endif
#endif /* MF_STATUS_H */
