/*
 * mapflow-demo-source — the source worker of `make demo`: prefills a context with the
 * synthetic source model (demo_model.h), extracts map rows for every layer with the C
 * reference kernel and puts them to mapflowd; prints what it stored and what each codec
 * would cost against dense fp16 maps. With --dump-maps it instead writes dense sample maps
 * ([L, H, N, N] .npy per sequence) for mapflow-calibrate, and with --profile it stores a
 * mapping profile in the daemon for the target to fetch.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "demo_model.h"
#include "mapflow.h"
#include "mapflow_kernels.h"
#include "mf_addr.h"
#include "mf_profile.h"
#include "npy.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: mapflow-demo-source --daemon TARGET [--ns NS] [--model M] [--n N] [--heads H]\n"
            "         [--dim D] [--layers L] [--block B] [--top-p P] [--codec C] [--seed S]\n"
            "         [--profile FILE]\n"
            "       mapflow-demo-source --dump-maps DIR [--samples K] [--n N] ... (no daemon)\n");
}

/* Dense maps of every layer for K sample contexts (seeds seed+1..seed+K). */
static int dump_maps(demo_shape_t s, const char *dir, int samples, int target)
{
    uint32_t h = target ? s.tgt_heads : s.src_heads, d = target ? 2 * s.head_dim : s.head_dim;
    size_t n = s.n_tokens, per = (size_t)h * n * n, tensor = n * h * d;
    float *maps = calloc((size_t)s.layers * per, sizeof(float));
    float *q = malloc(sizeof(float) * tensor), *k = malloc(sizeof(float) * tensor),
          *v = malloc(sizeof(float) * tensor);
    double *p = malloc(sizeof(double) * n);
    if (!maps || !q || !k || !v || !p)
        return 1;
    uint64_t base = s.seed;
    for (int smp = 1; smp <= samples; smp++) {
        s.seed = base + (uint64_t)smp;
        for (uint32_t l = 0; l < s.layers; l++) {
            mf_status_t st = target ? demo_target_qkv(&s, l, q, k, v)
                                    : demo_source_qkv(&s, l, q, k, v);
            mf_qkv_t t = { q, k, v, MF_DTYPE_F32, s.n_tokens, h, h, d };
            for (uint32_t hh = 0; hh < h && st == MF_OK; hh++)
                for (uint32_t r = 0; r < n && st == MF_OK; r++) {
                    st = mf_attention_row_ref(&t, hh, r, p, NULL);
                    float *dst = maps + (size_t)l * per + ((size_t)hh * n + r) * n;
                    for (uint32_t c = 0; c <= r; c++)
                        dst[c] = (float)p[c];
                }
            if (st != MF_OK) {
                fprintf(stderr, "dump-maps: %s\n", mf_strerror(st));
                return 1;
            }
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/seq-%03d.npy", dir, smp);
        uint64_t shape[4] = { s.layers, h, n, n };
        if (mf_npy_write(path, MF_NPY_F16, maps, 4, shape) != MF_OK) {
            fprintf(stderr, "dump-maps: cannot write %s\n", path);
            return 1;
        }
    }
    free(maps);
    free(q);
    free(k);
    free(v);
    free(p);
    return 0;
}

int main(int argc, char **argv)
{
    demo_shape_t s = { .n_tokens = 2048, .src_heads = 8, .tgt_heads = 6, .head_dim = 64,
                       .layers = 3, .seed = 7 };
    const char *daemon = NULL, *ns = "demo", *model = "demo-src-8h", *profile = NULL,
               *dump = NULL, *codec_name = "u8log";
    uint32_t block = 64;
    float top_p = 0.95f;
    int samples = 2, target_maps = 0;
    static const struct option opts[] = {
        { "daemon", 1, 0, 'a' }, { "ns", 1, 0, 'N' }, { "model", 1, 0, 'm' },
        { "n", 1, 0, 'n' }, { "heads", 1, 0, 'h' }, { "dim", 1, 0, 'd' },
        { "layers", 1, 0, 'l' }, { "block", 1, 0, 'b' }, { "top-p", 1, 0, 'p' },
        { "codec", 1, 0, 'c' }, { "seed", 1, 0, 's' }, { "profile", 1, 0, 'P' },
        { "dump-maps", 1, 0, 'D' }, { "samples", 1, 0, 'K' }, { "target-maps", 0, 0, 'T' },
        { "help", 0, 0, '?' }, { 0, 0, 0, 0 } };
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        switch (c) {
        case 'a': daemon = optarg; break;
        case 'N': ns = optarg; break;
        case 'm': model = optarg; break;
        case 'n': s.n_tokens = (uint32_t)atoi(optarg); break;
        case 'h': s.src_heads = (uint32_t)atoi(optarg); break;
        case 'd': s.head_dim = (uint32_t)atoi(optarg); break;
        case 'l': s.layers = (uint32_t)atoi(optarg); break;
        case 'b': block = (uint32_t)atoi(optarg); break;
        case 'p': top_p = (float)atof(optarg); break;
        case 'c': codec_name = optarg; break;
        case 's': s.seed = (uint64_t)atoll(optarg); break;
        case 'P': profile = optarg; break;
        case 'D': dump = optarg; break;
        case 'K': samples = atoi(optarg); break;
        case 'T': target_maps = 1; break;
        default: usage(); return 2;
        }
    }
    if (dump)
        return dump_maps(s, dump, samples, target_maps);
    mf_codec_t codec;
    if (!daemon || mf_codec_parse(codec_name, &codec) != MF_OK || s.n_tokens < block) {
        usage();
        return 2;
    }

    mf_channel_t *ch = demo_connect(daemon, ns, "demo-source");
    if (!ch)
        return 3;
    mf_status_t st = MF_OK;
    if (profile) {
        FILE *f = fopen(profile, "rb");
        static char pb[1 << 20];
        size_t len = f ? fread(pb, 1, sizeof pb, f) : 0;
        if (f)
            fclose(f);
        /* A profile of a few layers is a few KiB; refuse rather than truncate a huge one. */
        /* ProfilePut is an admin request: a unix-socket daemon's admin socket sits beside
         * its socket (mf_addr.h); other targets need the channel itself to be admin. */
        char apath[4096], atarget[4200];
        mf_channel_t *adm = NULL;
        if (!strncmp(daemon, "unix:", 5)) {
            mf_admin_socket_path(daemon + 5, apath, sizeof apath);
            snprintf(atarget, sizeof atarget, "unix:%s", apath);
            adm = demo_connect(atarget, ns, "demo-source-admin");
        }
        mf_channel_t *pc = adm ? adm : ch;
        st = len == 0 ? MF_NOT_FOUND
             : len == sizeof pb ? MF_OUT_OF_RANGE
                                : mf_profile_put(pc, pb, len, MF_TIMEOUT_DEFAULT);
        if (st != MF_OK) {
            fprintf(stderr, "source: profile put failed: %s %s\n", mf_status_name(st),
                    mf_channel_last_error(pc));
            mf_channel_close(adm);
            mf_channel_close(ch);
            return 1;
        }
        mf_channel_close(adm);
    }

    uint32_t n = s.n_tokens, h = s.src_heads, d = s.head_dim, nb = n / block;
    size_t tensor = (size_t)n * h * d;
    uint32_t *tokens = malloc(sizeof(uint32_t) * n);
    float *q = malloc(sizeof(float) * tensor), *k = malloc(sizeof(float) * tensor),
          *v = malloc(sizeof(float) * tensor);
    void **rows = calloc(nb, sizeof(void *));
    size_t *caps = calloc(nb, sizeof(size_t)), *sizes = calloc(nb, sizeof(size_t));
    if (!tokens || !q || !k || !v || !rows || !caps || !sizes)
        return 1;
    demo_tokens(&s, tokens);
    for (uint32_t i = 0; i < nb; i++) {
        caps[i] = mf_extract_row_bound(codec, block, h, i, strlen(model));
        rows[i] = aligned_alloc(16, (caps[i] + 15) & ~(size_t)15);
        if (!rows[i])
            return 1;
    }
    /* Bytes each codec would take for the same kept sets (the layout is codec-independent
     * apart from the value sections). */
    double codec_bytes[MF_CODEC_COUNT] = { 0 }, dense = 0, t_extract = 0, t_put = 0;
    uint64_t entries = 0, candidates = 0;
    int rows_put = 0;
    for (uint32_t l = 0; l < s.layers; l++) {
        if ((st = demo_source_qkv(&s, l, q, k, v)) != MF_OK)
            break;
        mf_extract_args_t ea = { .src = { q, k, NULL, MF_DTYPE_F32, n, h, h, d },
                                 .block_size = block, .top_p = top_p, .codec = codec,
                                 .i0 = 0, .i1 = nb, .model = model, .ns = ns, .layer = l,
                                 .tokens = tokens };
        const char *why = "";
        uint32_t failed;
        double t0 = now_s();
        st = mf_extract_ref(&ea, rows, caps, sizes, &failed, &why);
        t_extract += now_s() - t0;
        if (st != MF_OK) {
            fprintf(stderr, "source: extract layer %u: %s (%s)\n", l, mf_status_name(st), why);
            break;
        }
        for (uint32_t i = 0; i < nb; i++) {
            mf_row_view_t rv;
            mf_row_decode(rows[i], sizes[i], MF_ROW_NO_CHECKSUM, &rv, NULL);
            entries += rv.n_entries;
            candidates += (uint64_t)h * (i + 1);
            for (int c = 0; c < MF_CODEC_COUNT; c++) {
                mf_row_layout_t lay;
                mf_row_layout((mf_codec_t)c, block, h, rv.n_cols, rv.n_entries, rv.model_len, &lay);
                codec_bytes[c] += (double)lay.total;
            }
            mf_put_result_t pr;
            t0 = now_s();
            st = mf_put(ch, rows[i], sizes[i], 0, &pr, MF_TIMEOUT_DEFAULT);
            t_put += now_s() - t0;
            if (st != MF_OK) {
                fprintf(stderr, "source: put layer %u block %u: %s (%s)\n", l, i,
                        mf_status_name(st), mf_channel_last_error(ch));
                break;
            }
            rows_put++;
        }
        if (st != MF_OK)
            break;
        /* Dense causal fp16 maps of this layer's full blocks: H × (nb·B)(nb·B+1)/2 × 2 bytes. */
        double m = (double)nb * block;
        dense += (double)h * m * (m + 1) / 2 * 2;
    }
    if (st == MF_OK) {
        printf("source  model %s: %u layers x %u heads x d=%u, N=%u tokens (%u blocks of %u)\n",
               model, s.layers, h, d, n, nb, block);
        printf("source  extracted in %.2f s (C reference), put %d rows in %.3f s (%s, zero-copy arena: %s)\n",
               t_extract, rows_put, t_put, mf_codec_name(codec), mf_channel_has_arena(ch) ? "yes" : "no");
        printf("source  kept %.1f%% of (head, key block) pairs at top-p %.2f\n",
               100.0 * (double)entries / (double)candidates, top_p);
        printf("source  bytes vs dense causal fp16 maps (%.1f MiB):\n", dense / 1048576.0);
        for (int c = 0; c < MF_CODEC_COUNT; c++)
            printf("source    %-6s %9.2f MiB  %7.1fx smaller%s\n", mf_codec_name((mf_codec_t)c),
                   codec_bytes[c] / 1048576.0, dense / codec_bytes[c],
                   (mf_codec_t)c == codec ? "   <- stored" : "");
    }
    for (uint32_t i = 0; i < nb; i++)
        free(rows[i]);
    free(rows);
    free(caps);
    free(sizes);
    free(tokens);
    free(q);
    free(k);
    free(v);
    mf_channel_close(ch);
    return st == MF_OK ? 0 : 1;
}
