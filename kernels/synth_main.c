/*
 * mapflow-synth — writes valid map rows for a token file without any model: structured
 * random Q/K (local window + sink, kernels/synth.h) through the reference extract, one
 * row per full block as DIR/row-<i>.bin (the raw encoded row bytes). Used to fill a
 * daemon in tests and benchmarks.
 *
 *   mapflow-synth --model M --layer L --block B --heads H --tokens FILE
 *                 --codec mask|fp16|bf16|fp8|u8log --top-p P --seed S --out DIR
 *                 [--ns NS] [--dim D]
 *
 * Exit: 0 ok, 1 error (bad token file, cannot write), 2 usage.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mapflow_kernels.h"
#include "synth.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mapflow-synth --model M --layer L --block B --heads H --tokens FILE\n"
            "                     --codec mask|fp16|bf16|fp8|u8log --top-p P --seed S\n"
            "                     --out DIR [--ns NS] [--dim D]\n"
            "  Writes DIR/row-<i>.bin for every full block of the token file (raw u32 LE).\n");
}

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v < lo || v > hi)
        return 0;
    *out = (uint32_t)v;
    return 1;
}

/* Reads a token file: a whole number of u32 LE, at most MF_KERNELS_MAX_TOKENS. */
static uint32_t *read_tokens(const char *path, uint32_t *n)
{
    struct stat sb;
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "mapflow-synth: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size % 4 != 0 ||
        sb.st_size / 4 > MF_KERNELS_MAX_TOKENS) {
        fprintf(stderr, "mapflow-synth: %s: need a regular file of at most %u u32 tokens\n",
                path, MF_KERNELS_MAX_TOKENS);
        fclose(f);
        return NULL;
    }
    *n = (uint32_t)(sb.st_size / 4);
    uint32_t *t = malloc(*n ? (size_t)*n * 4 : 4);
    if (!t || fread(t, 4, *n, f) != *n) {
        fprintf(stderr, "mapflow-synth: %s: read failed\n", path);
        free(t);
        t = NULL;
    }
    fclose(f);
    return t; /* little-endian host (asserted by proto/mf_row.c) */
}

int main(int argc, char **argv)
{
    enum { O_MODEL = 1, O_LAYER, O_BLOCK, O_HEADS, O_TOKENS, O_CODEC, O_TOPP, O_SEED, O_OUT,
           O_NS, O_DIM, O_HELP };
    static const struct option opts[] = {
        { "model", 1, 0, O_MODEL }, { "layer", 1, 0, O_LAYER }, { "block", 1, 0, O_BLOCK },
        { "heads", 1, 0, O_HEADS }, { "tokens", 1, 0, O_TOKENS }, { "codec", 1, 0, O_CODEC },
        { "top-p", 1, 0, O_TOPP }, { "seed", 1, 0, O_SEED }, { "out", 1, 0, O_OUT },
        { "ns", 1, 0, O_NS }, { "dim", 1, 0, O_DIM }, { "help", 0, 0, O_HELP }, { 0, 0, 0, 0 },
    };
    const char *model = NULL, *tokens_path = NULL, *out = NULL, *ns = "default";
    uint32_t layer = 0, block = 0, heads = 0, dim = 64, have = 0;
    uint64_t seed = 0;
    float top_p = 0;
    mf_codec_t codec = MF_CODEC_MASK;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end;
        int ok = 1;
        switch (c) {
        case O_MODEL: model = optarg; break;
        case O_LAYER: ok = parse_u32(optarg, 0, UINT32_MAX, &layer); break;
        case O_BLOCK: ok = parse_u32(optarg, MF_ROW_MIN_BLOCK, MF_ROW_MAX_BLOCK, &block); break;
        case O_HEADS: ok = parse_u32(optarg, 1, MF_ROW_MAX_HEADS, &heads); break;
        case O_TOKENS: tokens_path = optarg; break;
        case O_CODEC: ok = mf_codec_parse(optarg, &codec) == MF_OK; break;
        case O_TOPP:
            top_p = strtof(optarg, &end);
            ok = *end == 0 && top_p > 0.0f && top_p <= 1.0f;
            break;
        case O_SEED:
            errno = 0;
            seed = strtoull(optarg, &end, 10);
            ok = !errno && *end == 0 && end != optarg;
            break;
        case O_OUT: out = optarg; break;
        case O_NS: ns = optarg; break;
        case O_DIM: ok = parse_u32(optarg, 8, MF_KERNELS_MAX_DIM, &dim); break;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (!ok) {
            fprintf(stderr, "mapflow-synth: bad value for --%s: '%s'\n", opts[c - 1].name,
                    optarg);
            return 2;
        }
        have |= 1u << c;
    }
    const uint32_t need = 1u << O_MODEL | 1u << O_LAYER | 1u << O_BLOCK | 1u << O_HEADS |
                          1u << O_TOKENS | 1u << O_CODEC | 1u << O_TOPP | 1u << O_SEED |
                          1u << O_OUT;
    if ((have & need) != need || optind != argc) {
        usage(stderr);
        return 2;
    }
    if ((block & (block - 1)) || strlen(model) < 1 || strlen(model) > MF_ROW_MAX_MODEL ||
        strlen(ns) < 1 || strlen(ns) > 128) {
        fprintf(stderr, "mapflow-synth: block must be a power of two, model 1..255 bytes, "
                        "namespace 1..128 bytes\n");
        return 2;
    }
    uint32_t n = 0, rc = 1;
    uint32_t *tokens = read_tokens(tokens_path, &n);
    if (!tokens)
        return 1;
    uint32_t nb = n / block;
    if (nb < 1) {
        fprintf(stderr, "mapflow-synth: %s: %u tokens, fewer than one block of %u\n",
                tokens_path, n, block);
        goto out_tokens;
    }
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "mapflow-synth: %s: %s\n", out, strerror(errno));
        goto out_tokens;
    }
    size_t nqk = (size_t)nb * block * heads * dim;
    float *q = malloc(nqk * sizeof(float)), *k = malloc(nqk * sizeof(float));
    size_t cap = mf_extract_row_bound(codec, block, heads, nb - 1, strlen(model));
    void *row = cap ? aligned_alloc(MF_ROW_ALIGN, (cap + 15) & ~(size_t)15) : NULL;
    mf_synth_opts_t so = { .seed = seed, .n_tokens = nb * block, .n_q_heads = heads,
                           .n_kv_heads = heads, .head_dim = dim };
    if (!q || !k || !row || mf_synth_qkv(&so, q, k, NULL) != MF_OK) {
        fprintf(stderr, "mapflow-synth: out of memory (or row too large)\n");
        goto out_bufs;
    }
    mf_extract_args_t a = {
        .src = { .q = q, .k = k, .dtype = MF_DTYPE_F32, .n_tokens = nb * block,
                 .n_q_heads = heads, .n_kv_heads = heads, .head_dim = dim },
        .block_size = block, .top_p = top_p, .codec = codec, .model = model, .ns = ns,
        .layer = layer, .tokens = tokens,
    };
    size_t total = 0;
    for (uint32_t i = 0; i < nb; i++) {
        char path[4096];
        size_t size = 0;
        const char *why = "";
        a.i0 = i;
        a.i1 = i + 1;
        mf_status_t st = mf_extract_ref(&a, &row, &cap, &size, NULL, &why);
        if (st != MF_OK) {
            fprintf(stderr, "mapflow-synth: block %u: %s: %s\n", i, mf_strerror(st), why);
            goto out_bufs;
        }
        snprintf(path, sizeof path, "%s/row-%u.bin", out, i);
        FILE *f = fopen(path, "wb");
        int ok = f && fwrite(row, 1, size, f) == size;
        if (f && fclose(f) != 0)
            ok = 0;
        if (!ok) {
            fprintf(stderr, "mapflow-synth: %s: write failed\n", path);
            goto out_bufs;
        }
        total += size;
    }
    printf("wrote %u rows (%zu bytes, codec %s, top-p %.3g) to %s\n", nb, total,
           mf_codec_name(codec), top_p, out);
    rc = 0;
out_bufs:
    free(row);
    free(q);
    free(k);
out_tokens:
    free(tokens);
    return (int)rc;
}
