/*
 * mapflow-demo-target — the target worker of `make demo`. It continues the source's
 * context with its own suffix, fetches the mapping profile and the source's rows from
 * mapflowd (lookup, then one batched zero-copy leased get for the whole prefix × every
 * mapped layer), runs each layer's attention with reuse (C reference apply: per-head
 * prob / mask / compute, sensitive blocks exact), and compares it with its own full
 * computation: blocks hit, output error, attention work and time saved.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "demo_model.h"
#include "mapflow.h"
#include "mapflow_kernels.h"
#include "mf_profile.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: mapflow-demo-target --daemon TARGET [--ns NS] [--source-model M] [--model M]\n"
            "         [--n N] [--suffix S] [--heads Hs] [--target-heads Ht] [--dim D] [--layers L]\n"
            "         [--block B] [--seed S] [--max-error E]\n");
}

int main(int argc, char **argv)
{
    demo_shape_t s = { .n_tokens = 2048, .src_heads = 8, .tgt_heads = 6, .head_dim = 64,
                       .layers = 3, .seed = 7 };
    const char *daemon = NULL, *ns = "demo", *src_model = "demo-src-8h", *model = "demo-tgt-6h";
    uint32_t block = 64, suffix = 96;
    double max_error = -1;
    static const struct option opts[] = {
        { "daemon", 1, 0, 'a' }, { "ns", 1, 0, 'N' }, { "source-model", 1, 0, 'S' },
        { "model", 1, 0, 'm' }, { "n", 1, 0, 'n' }, { "suffix", 1, 0, 'x' },
        { "heads", 1, 0, 'h' }, { "target-heads", 1, 0, 't' }, { "dim", 1, 0, 'd' },
        { "layers", 1, 0, 'l' }, { "block", 1, 0, 'b' }, { "seed", 1, 0, 's' },
        { "max-error", 1, 0, 'E' }, { "help", 0, 0, '?' }, { 0, 0, 0, 0 } };
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        switch (c) {
        case 'a': daemon = optarg; break;
        case 'N': ns = optarg; break;
        case 'S': src_model = optarg; break;
        case 'm': model = optarg; break;
        case 'n': s.n_tokens = (uint32_t)atoi(optarg); break;
        case 'x': suffix = (uint32_t)atoi(optarg); break;
        case 'h': s.src_heads = (uint32_t)atoi(optarg); break;
        case 't': s.tgt_heads = (uint32_t)atoi(optarg); break;
        case 'd': s.head_dim = (uint32_t)atoi(optarg); break;
        case 'l': s.layers = (uint32_t)atoi(optarg); break;
        case 'b': block = (uint32_t)atoi(optarg); break;
        case 's': s.seed = (uint64_t)atoll(optarg); break;
        case 'E': max_error = atof(optarg); break;
        default: usage(); return 2;
        }
    }
    if (!daemon || s.n_tokens < block) {
        usage();
        return 2;
    }
    mf_channel_t *ch = demo_connect(daemon, ns, "demo-target");
    if (!ch)
        return 3;
    mf_status_t st = MF_OK;
    int rc = 1;
    void *pb = NULL;
    size_t pb_len = 0;
    Mapflow__V1__MappingProfile *prof = NULL;
    const char *why = "";
    st = mf_profile_get(ch, src_model, model, &pb, &pb_len, MF_TIMEOUT_DEFAULT);
    if (st != MF_OK || (st = mf_profile_decode(pb, pb_len, &prof, &why)) != MF_OK) {
        fprintf(stderr, "target: no usable profile %s -> %s: %s %s%s\n", src_model, model,
                mf_status_name(st), mf_channel_last_error(ch), why);
        goto out_channel;
    }

    /* The target's context: the source's N tokens, then its own continuation. */
    demo_shape_t ts = s;
    ts.n_tokens = s.n_tokens + suffix;
    uint32_t n = ts.n_tokens, ht = s.tgt_heads, dt = 2 * s.head_dim;
    uint32_t *tokens = malloc(sizeof(uint32_t) * n);
    demo_tokens(&s, tokens);
    for (uint32_t i = s.n_tokens; i < n; i++)
        tokens[i] = (tokens[i - s.n_tokens] * 2654435761u + 11u) % 32000u;

    /* Which source layers the profile needs, then one lookup and one batched get. */
    uint32_t src_layers[MF_PROFILE_MAX_LAYERS], n_src = 0, blocks_hit[MF_PROFILE_MAX_LAYERS];
    for (size_t i = 0; i < prof->n_layers && n_src < MF_PROFILE_MAX_LAYERS; i++)
        src_layers[n_src++] = prof->layers[i]->source_layer;
    uint32_t total_blocks = 0;
    double t0 = now_s();
    st = mf_lookup(ch, src_model, block, tokens, n, src_layers, n_src, blocks_hit, &total_blocks,
                   MF_TIMEOUT_DEFAULT);
    if (st != MF_OK) {
        fprintf(stderr, "target: lookup: %s %s\n", mf_status_name(st), mf_channel_last_error(ch));
        goto out_profile;
    }
    uint32_t hit = total_blocks;
    for (uint32_t i = 0; i < n_src; i++)
        hit = blocks_hit[i] < hit ? blocks_hit[i] : hit;
    mf_get_result_t *got = NULL;
    if (hit > 0)
        st = mf_get_prefix(ch, src_model, block, tokens, (size_t)hit * block, src_layers, n_src, 0,
                           hit, MF_GET_LEASE, &got, MF_TIMEOUT_DEFAULT);
    double t_fetch = now_s() - t0;
    if (st != MF_OK) {
        fprintf(stderr, "target: get: %s %s\n", mf_status_name(st), mf_channel_last_error(ch));
        goto out_profile;
    }
    printf("target  model %s: %u layers x %u heads x d=%u, context %u tokens (%u from the source + %u own)\n",
           model, s.layers, ht, dt, n, s.n_tokens, suffix);
    printf("target  profile %s -> %s: L0=%u, %zu mapped layers, recompute last %u block(s)\n",
           src_model, model, prof->l0, prof->n_layers,
           prof->recompute ? prof->recompute->last_blocks : 0);
    printf("target  lookup + leased get: %u of %u blocks hit on each of %u source layers, %.1f ms, zero-copy: %s\n",
           hit, total_blocks, n_src, 1e3 * t_fetch, mf_channel_has_arena(ch) ? "yes" : "no");

    size_t tensor = (size_t)n * ht * dt;
    float *q = malloc(sizeof(float) * tensor), *k = malloc(sizeof(float) * tensor),
          *v = malloc(sizeof(float) * tensor), *o = malloc(sizeof(float) * tensor);
    double *ref = malloc(sizeof(double) * tensor);
    const mf_row_view_t **views = calloc(hit + 1, sizeof(*views));
    double t_full_all = 0, t_reuse_all = 0, worst = 0;
    uint64_t work_full = 0, work_done = 0;
    printf("target  %-5s %-6s %-14s %9s %9s %8s %10s\n", "layer", "source", "heads p/m/c",
           "full ms", "reuse ms", "speedup", "rel.error");
    for (uint32_t l = 0; l < s.layers; l++) {
        if ((st = demo_target_qkv(&ts, l, q, k, v)) != MF_OK)
            break;
        mf_qkv_t t = { q, k, v, MF_DTYPE_F32, n, ht, ht, dt };
        t0 = now_s();
        st = mf_attention_dense_ref(&t, ref, NULL);
        double t_full = now_s() - t0;
        if (st != MF_OK)
            break;
        t_full_all += t_full;
        uint64_t nbq = (n + block - 1) / block, dense_pairs = (uint64_t)ht * nbq * (nbq + 1) / 2;
        work_full += dense_pairs;
        const Mapflow__V1__LayerMap *lm = mf_profile_layer(prof, l);
        if (!lm || hit == 0) {
            t_reuse_all += t_full;
            work_done += dense_pairs;
            printf("target  %-5u %-6s %-14s %9.1f %9.1f %8s %10s\n", l, "-", "computed",
                   1e3 * t_full, 1e3 * t_full, "1.00x", "0 (exact)");
            continue;
        }
        uint32_t li = 0;
        while (src_layers[li] != lm->source_layer)
            li++;
        for (uint32_t b = 0; b < hit; b++) {
            const mf_row_ref_t *rr = &got->rows[(size_t)li * hit + b];
            views[b] = rr->status == MF_OK ? &rr->view : NULL;
        }
        uint8_t modes[64];
        float tops[64];
        mf_layer_map_t map;
        if ((st = mf_layer_map_from_proto(lm, &map, modes, tops)) != MF_OK)
            break;
        mf_apply_args_t aa = { .rows = views, .n_rows = hit, .map = &map, .tgt = t,
                               .block_size = block,
                               .exact_first = prof->recompute ? prof->recompute->first_blocks : 0,
                               .exact_last = prof->recompute ? prof->recompute->last_blocks : 0,
                               .o = o };
        mf_apply_stats_t as = { 0 };
        t0 = now_s();
        st = mf_apply_ref(&aa, &as, &why);
        double t_reuse = now_s() - t0;
        if (st != MF_OK) {
            fprintf(stderr, "target: apply layer %u: %s (%s)\n", l, mf_status_name(st), why);
            break;
        }
        t_reuse_all += t_reuse;
        /* Work in (head, key block) pairs: exact blocks cost their full causal row; prob
         * tiles and mask blocks cost one block each. */
        work_done += as.prob_tiles + as.mask_blocks;
        work_done += as.exact_blocks * (nbq + 1) / 2; /* an exact block: about half a causal row */
        double num = 0, den = 0;
        for (size_t i = 0; i < tensor; i++) {
            double e = (double)o[i] - ref[i];
            num += e * e;
            den += ref[i] * ref[i];
        }
        double rel = sqrt(num / den);
        worst = rel > worst ? rel : worst;
        uint32_t np = 0, nm = 0, nc = 0;
        for (uint32_t h = 0; h < ht; h++)
            np += modes[h] == MF_HEAD_PROB, nm += modes[h] == MF_HEAD_MASK,
                nc += modes[h] == MF_HEAD_COMPUTE;
        char mix[32];
        snprintf(mix, sizeof mix, "%u/%u/%u", np, nm, nc);
        printf("target  %-5u %-6u %-14s %9.1f %9.1f %7.2fx %10.2e\n", l, lm->source_layer, mix,
               1e3 * t_full, 1e3 * t_reuse, t_full / t_reuse, rel);
    }
    if (st == MF_OK) {
        printf("target  attention, all layers: full %.1f ms, with reuse %.1f ms (%.2fx; C reference on the CPU)\n",
               1e3 * t_full_all, 1e3 * t_reuse_all, t_full_all / t_reuse_all);
        printf("target  attention work (head x key-block pairs): %.1f%% of the full prefill's\n",
               100.0 * (double)work_done / (double)work_full);
        printf("target  worst layer output error vs its own full computation: %.2e (relative L2)\n",
               worst);
        rc = 0;
        if (max_error >= 0 && !(worst <= max_error)) {
            fprintf(stderr, "target: error %.3e above --max-error %.3e\n", worst, max_error);
            rc = 1;
        }
    }
    if (got) {
        mf_release_result(ch, got, MF_TIMEOUT_DEFAULT);
        mf_get_result_free(got);
    }
    free(views);
    free(q);
    free(k);
    free(v);
    free(o);
    free(ref);
    free(tokens);
out_profile:
    mf_profile_free(prof);
    free(pb);
out_channel:
    mf_channel_close(ch);
    return rc;
}
