/* Writes the seed corpora of the proto fuzz targets (valid rows of every codec, valid
 * frames of several message types). Run once by hand; its output is committed:
 *   make build/bin/tests/make_seeds && build/bin/tests/make_seeds tests/fuzz/corpus */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mf_frame.h"
#include "mf_row.h"

static void write_file(const char *dir, const char *name, const void *p, size_t n)
{
    char path[512];
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) {
        perror(path);
        exit(1);
    }
    fclose(f);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_seeds CORPUS_DIR\n");
        return 2;
    }
    char rowdir[400], framedir[400];
    snprintf(rowdir, sizeof rowdir, "%s/fuzz_row", argv[1]);
    snprintf(framedir, sizeof framedir, "%s/fuzz_frame", argv[1]);
    uint32_t toks[16];
    for (int k = 0; k < 16; k++)
        toks[k] = 1000u + 37u * (uint32_t)k;
    for (int c = 0; c < MF_CODEC_COUNT; c++) {
        mf_row_spec_t sp = { .model = "seed-model", .layer = (uint32_t)c, .block_index = 5,
                             .block_size = 8, .n_heads = 3, .codec = (mf_codec_t)c,
                             .top_p = 0.9f, .tokens = toks };
        sp.hash.lo = 0x1234u + (uint64_t)c;
        uint32_t cols[3] = { 0, 2, 5 };
        uint64_t mask[3] = { 7, 5, 7 };
        float mass[8], tiles[8 * 64];
        for (int e = 0; e < 8; e++)
            mass[e] = 0.05f + 0.1f * (float)e;
        for (int k = 0; k < 8 * 64; k++)
            tiles[k] = (float)((k * 7919) % 1000) / 1000.0f;
        static _Alignas(16) uint8_t buf[8192];
        size_t n;
        if (mf_row_build(buf, sizeof buf, &sp, 3, cols, mask, mass, tiles, &n, NULL) != MF_OK)
            return 1;
        char name[64];
        snprintf(name, sizeof name, "row-%s.bin", mf_codec_name((mf_codec_t)c));
        write_file(rowdir, name, buf, n);
    }
    /* Frames: a Hello and a Lookup back to back (first byte = chunk size for the target). */
    Mapflow__V1__Envelope e1 = MAPFLOW__V1__ENVELOPE__INIT, e2 = MAPFLOW__V1__ENVELOPE__INIT;
    Mapflow__V1__Hello h = MAPFLOW__V1__HELLO__INIT;
    Mapflow__V1__Lookup lk = MAPFLOW__V1__LOOKUP__INIT;
    uint32_t layers[3] = { 0, 5, 9 };
    h.protocol_version = 1;
    h.namespace_ = "default";
    e1.request_id = 1;
    e1.body_case = MAPFLOW__V1__ENVELOPE__BODY_HELLO;
    e1.hello = &h;
    lk.model = "m";
    lk.block_size = 8;
    lk.n_layers = 3;
    lk.layers = layers;
    e2.request_id = 2;
    e2.body_case = MAPFLOW__V1__ENVELOPE__BODY_LOOKUP;
    e2.lookup = &lk;
    uint8_t *a, *b;
    size_t na, nb;
    mf_frame_encode(&e1, NULL, 0, 1 << 16, &a, &na);
    mf_frame_encode(&e2, toks, sizeof toks, 1 << 16, &b, &nb);
    uint8_t *s = malloc(1 + na + nb);
    s[0] = 5;
    memcpy(s + 1, a, na);
    memcpy(s + 1 + na, b, nb);
    write_file(framedir, "hello-lookup.bin", s, 1 + na + nb);
    s[0] = 63;
    write_file(framedir, "hello-lookup-big-chunks.bin", s, 1 + na + nb);
    free(a);
    free(b);
    free(s);
    return 0;
}
