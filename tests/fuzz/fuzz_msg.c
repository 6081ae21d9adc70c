/* libFuzzer target: every control message on its own. The first byte picks one of the
 * message types reachable from Envelope (collected from the descriptors, so new messages
 * are fuzzed without editing this file); the rest is unpacked as that type, and what
 * unpacks must pack to exactly get_packed_size bytes (and is unpacked again). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mapflow.pb-c.h"

#define MAX_DESC 128

static const ProtobufCMessageDescriptor *g_desc[MAX_DESC];
static size_t g_n;

static void collect(const ProtobufCMessageDescriptor *d)
{
    for (size_t i = 0; i < g_n; i++)
        if (g_desc[i] == d)
            return;
    if (g_n == MAX_DESC)
        return;
    g_desc[g_n++] = d;
    for (unsigned f = 0; f < d->n_fields; f++)
        if (d->fields[f].type == PROTOBUF_C_TYPE_MESSAGE)
            collect(d->fields[f].descriptor);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_n)
        collect(&mapflow__v1__envelope__descriptor);
    if (size < 1)
        return 0;
    const ProtobufCMessageDescriptor *d = g_desc[data[0] % g_n];
    ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, size - 1, data + 1);
    if (!m)
        return 0;
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf || protobuf_c_message_pack(m, buf) != n)
        abort();
    /* Re-unpacking is not checked for equality: protobuf-c keeps unknown fields it
     * accepted (even a field number 0 inside a nested message) and packs them back in a
     * form it then refuses (found by this target; see tests/RELIABILITY.md). The daemon
     * only re-packs profiles, and ProfileGet answers DATA_LOSS for one it cannot read. */
    ProtobufCMessage *again = protobuf_c_message_unpack(d, NULL, n, buf);
    if (again)
        protobuf_c_message_free_unpacked(again, NULL);
    protobuf_c_message_free_unpacked(m, NULL);
    free(buf);
    return 0;
}
