/*
 * mapflow-worker — a small GPT (gpt.h; gpt_cuda.h on a GPU) that hands its attention maps over
 * through mapflowd (DESIGN §1).
 *
 *   --role source: prefill the first N tokens of a text, extract rows for the source layers
 *     of the profile's export plan (mf_profile.h: mask rows, or --prob-codec rows where a
 *     head reads prob tiles; --codec X: X for all), put them (and the profile) to the
 *     daemon, print them;
 *   --role target: the same N tokens plus a continuation (the text's next M tokens, or
 *     --prompt), look up and get the rows (leased, zero-copy on the same node), prefill
 *     with reuse, score the continuation, generate greedily. --no-reuse: only the full
 *     prefill; --compare: both, side by side, with the top-1 agreement between them.
 *
 * --device cpu|cuda|auto (backend.h; auto: cuda when a GPU is usable) picks where the
 * model runs; --dump PREFIX writes the scored logits and generated tokens of each target
 * pass (tests/gpu/worker_check.sh compares the devices with them).
 *
 * Exit: 0 ok, 1 failure (or agreement below --agree-min), 2 usage, 3 no daemon.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "gpt.h"
#include "handoff.h"
#include "mapflow.h"
#include "mf_addr.h"
#include "mf_profile.h"
#include "tokenizer.h"

typedef struct opts {
    const char *role, *model, *tokenizer, *daemon, *ns, *id, *source_id, *target_id;
    const char *profile, *text, *prompt, *codec, *prob_codec, *device, *dump;
    uint32_t tokens, cont, generate;
    float top_p;
    int no_reuse, compare;
    double agree_min;
} opts_t;

static void usage(void)
{
    fprintf(stderr,
            "usage: mapflow-worker --role source|target --model W.safetensors --tokenizer TOK\n"
            "         --text FILE [--tokens N] [--daemon TARGET] [--ns NS] [--profile FILE]\n"
            "         [--source-id ID] [--target-id ID] [--device cpu|cuda|auto]\n"
            "  source: [--codec auto|fp16|bf16|fp8|u8log|mask] [--prob-codec fp16|bf16|fp8|u8log]\n"
            "          [--top-p P]\n"
            "  target: [--continue M | --prompt TEXT] [--generate G] [--no-reuse | --compare]\n"
            "          [--agree-min F] [--dump PREFIX]\n");
}

static char *read_file(const char *path, size_t max, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = malloc(max + 1);
    *len = buf ? fread(buf, 1, max + 1, f) : 0;
    fclose(f);
    if (!buf || *len > max) { /* refuse rather than truncate */
        free(buf);
        return NULL;
    }
    buf[*len] = 0;
    return buf;
}

/* gpu ≥ 0 (the CUDA backend's device): also map the daemon's GPU arenas, so rows can be
 * put from and leased onto the device. */
static mf_channel_t *connect_daemon(const opts_t *o, int gpu)
{
    mf_channel_params_t cp = { .field_mask = MF_CHANNEL_PARAM_NS | MF_CHANNEL_PARAM_CLIENT_NAME |
                                             MF_CHANNEL_PARAM_WANT_ARENA,
                               .ns = o->ns, .client_name = o->role, .want_arena = 1,
                               .gpu_device = gpu };
    if (gpu >= 0)
        cp.field_mask |= MF_CHANNEL_PARAM_GPU;
    const char *atok = getenv("MAPFLOW_ADMIN_TOKEN");
    if (atok && atok[0]) {
        cp.field_mask |= MF_CHANNEL_PARAM_ADMIN_TOKEN;
        cp.admin_token = atok;
    }
    mf_channel_t *ch = NULL;
    mf_status_t st = mf_channel_open(o->daemon, &cp, &ch);
    if (st == MF_OK)
        return ch;
    fprintf(stderr, "%s: cannot reach mapflowd at %s: %s (%s)\n", o->role, o->daemon,
            mf_status_name(st), ch ? mf_channel_last_error(ch) : "");
    mf_channel_close(ch);
    return NULL;
}

/* ProfilePut is an admin request: with MAPFLOW_ADMIN_TOKEN the daemon channel carries
 * it; else a unix-socket daemon's admin socket (beside its socket, mf_addr.h) is used,
 * which only the daemon's user may open. */
static mf_status_t put_profile(const opts_t *o, mf_channel_t *ch, const char *pb, size_t len,
                               char *err, size_t errlen)
{
    const char *atok = getenv("MAPFLOW_ADMIN_TOKEN");
    const char *path = !strncmp(o->daemon, "unix:", 5) ? o->daemon + 5
                       : strchr(o->daemon, ':') ? NULL : o->daemon;
    mf_channel_t *adm = NULL;
    char target[4200], apath[4096];
    if (!(atok && atok[0]) && path) {
        mf_admin_socket_path(path, apath, sizeof(apath));
        snprintf(target, sizeof(target), "unix:%s", apath);
        mf_channel_params_t cp = {.field_mask = MF_CHANNEL_PARAM_NS | MF_CHANNEL_PARAM_CLIENT_NAME,
                                  .ns = o->ns, .client_name = o->role};
        if (mf_channel_open(target, &cp, &adm) != MF_OK) {
            snprintf(err, errlen, "%.256s: %.200s", target, mf_channel_last_error(adm));
            mf_channel_close(adm);
            return MF_UNAVAILABLE;
        }
    }
    mf_channel_t *use = adm ? adm : ch;
    mf_status_t st = mf_profile_put(use, pb, len, MF_TIMEOUT_DEFAULT);
    snprintf(err, errlen, "%s", st == MF_OK ? "" : mf_channel_last_error(use));
    mf_channel_close(adm);
    return st;
}

/* Text to tokens; the first n (all when n = 0) are kept. */
static uint32_t *encode_text(const mfw_tok_t *tok, const char *text, size_t len, size_t *n)
{
    uint32_t *ids = malloc(sizeof(uint32_t) * (len + 1));
    size_t got = 0;
    if (ids && mfw_tok_encode(tok, text, len, ids, len + 1, &got) != MF_OK) {
        free(ids);
        return NULL;
    }
    *n = got;
    return ids;
}

static void print_text(const mfw_tok_t *tok, const uint32_t *ids, size_t n)
{
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *b = mfw_tok_bytes(tok, ids[i], &len);
        for (size_t k = 0; k < len; k++)
            if (b[k] == '\n')
                fputs("\\n", stdout);
            else if (b[k] == '"' || b[k] == '\\')
                printf("\\%c", b[k]);
            else if ((unsigned char)b[k] < 0x20)
                printf("\\x%02x", (unsigned char)b[k]);
            else
                putchar(b[k]);
    }
    putchar('"');
}

/* ---- source ------------------------------------------------------------------------- */

static int run_source(const opts_t *o, mfw_backend_t *be, const mfw_gpt_t *m,
                      const uint32_t *tokens, uint32_t n)
{
    int rc = 1;
    /* auto: the profile's export plan picks each layer's codec (mask rows unless a head
     * reads prob tiles); an explicit codec is used for every planned layer */
    mf_codec_t force, prob_codec;
    int is_auto = !strcmp(o->codec, "auto");
    if ((!is_auto && mf_codec_parse(o->codec, &force) != MF_OK) ||
        mf_codec_parse(o->prob_codec, &prob_codec) != MF_OK || prob_codec == MF_CODEC_MASK ||
        !o->profile || !o->daemon) {
        usage();
        return 2;
    }
    size_t pb_len = 0;
    char *pb = read_file(o->profile, MF_PROFILE_MAX_BYTES, &pb_len);
    Mapflow__V1__MappingProfile *prof = NULL;
    const char *why = "";
    mf_status_t st = pb ? mf_profile_decode(pb, pb_len, &prof, &why) : MF_NOT_FOUND;
    if (st != MF_OK) {
        fprintf(stderr, "source: profile %s: %s %s\n", o->profile, mf_status_name(st), why);
        free(pb);
        return 1;
    }
    mfw_extract_t *e = calloc(1, sizeof *e);
    mf_put_item_t *items = NULL;
    mfw_brun_t *run = NULL;
    mf_channel_t *ch = connect_daemon(o, mfw_backend_gpu(be));
    if (!ch) {
        rc = 3;
        goto out;
    }
    char perr[512] = "";
    if (!e || (st = put_profile(o, ch, pb, pb_len, perr, sizeof(perr))) != MF_OK) {
        fprintf(stderr, "source: profile put: %s %s\n", mf_status_name(st), perr);
        goto out;
    }
    mf_export_layer_t plan[MFW_MAX_LAYERS];
    uint32_t layers[MFW_MAX_LAYERS], nl = 0;
    if ((st = mfw_extract_plan(e, prof, prob_codec, is_auto ? NULL : &force,
                               mfw_gpt_cfg(m)->n_layer, plan, &nl, &why)) != MF_OK) {
        fprintf(stderr, "source: export plan of %s: %s %s\n", o->profile, mf_status_name(st), why);
        goto out;
    }
    printf("source  export plan (--codec %s):", o->codec);
    uint32_t np = nl;
    nl = 0;
    for (uint32_t i = 0; i < np; i++) {
        uint32_t l = plan[i].source_layer;
        printf("%s layer %u %s%s", i ? "," : "", l, mf_codec_name(plan[i].codec),
               l < MFW_MAX_LAYERS && e->want[l] ? "" : " (beyond the model: skipped)");
        if (l < MFW_MAX_LAYERS && e->want[l])
            layers[nl++] = l;
    }
    printf("%s\n", np ? "" : " nothing (every mapped head computes)");
    e->block_size = prof->block_size;
    e->top_p = o->top_p;
    e->model = o->source_id;
    e->ns = o->ns;
    e->tokens = tokens;
    /* With a mapped GPU arena the CUDA extract writes each layer's rows straight into a
     * put region reserved by capacity (one begin, one commit per layer, no copy). */
    mf_gpu_info_t gi = { 0 };
    if (mfw_backend_is_cuda(be)) {
        mf_channel_gpu_info(ch, &gi);
        if (gi.driver && gi.n_mapped)
            e->region_ch = ch;
    }
    if ((st = mfw_brun_create(be, n, &run)) != MF_OK)
        goto out;
    double t0 = mf_now_s();
    st = mfw_brun_forward(run, tokens, n, MFW_HOOK_EXTRACT, e, n, NULL);
    double t_prefill = mf_now_s() - t0;
    if (st != MF_OK) {
        fprintf(stderr, "source: prefill: %s %s\n", mf_status_name(st),
                e->why && *e->why ? e->why : mfw_brun_error(run));
        goto out;
    }
    /* Rows extracted on the device are put from there, unless the channel has no GPU or
     * that put fails for a reason a host put would not share. */
    int from_dev = mfw_backend_is_cuda(be);
    if (from_dev) {
        if (!gi.driver) {
            fprintf(stderr, "source: the channel has no GPU (%s): rows go through host memory\n", gi.why);
            if ((st = mfw_backend_extract_to_host(be, e)) != MF_OK) {
                fprintf(stderr, "source: rows to the host: %s %s\n", mf_status_name(st), e->why ? e->why : "");
                goto out;
            }
            from_dev = 0;
        }
    }
    size_t n_items = 0, bytes = 0, cand = 0, in_place = 0, regions = 0;
    uint8_t region_layer[MFW_MAX_LAYERS] = { 0 }; /* its rows went through a put region */
    items = calloc((size_t)nl * e->n_blocks + 1, sizeof *items);
    if (!items)
        goto out;
    for (uint32_t i = 0; i < nl; i++)
        for (uint32_t b = 0, l = layers[i]; e->sizes[l] && b < e->n_blocks; b++) {
            cand += (size_t)mfw_gpt_cfg(m)->n_head * (b + 1);
            bytes += e->sizes[l][b];
            if (from_dev && e->region[l]) {
                region_layer[l] = 1;
                continue; /* written in place: committed below */
            }
            items[n_items].row = from_dev ? e->dev_rows[l][b] : e->rows[l][b];
            items[n_items++].len = e->sizes[l][b];
        }
    t0 = mf_now_s();
    for (uint32_t i = 0; from_dev && i < nl; i++) {
        uint32_t l = layers[i];
        if (!e->region[l])
            continue;
        mf_put_region_result_t rr;
        if ((st = mf_put_region_commit(e->region[l], NULL, &rr, MF_TIMEOUT_DEFAULT)) != MF_OK) {
            fprintf(stderr, "source: put region of layer %u: %s %s\n", l, mf_status_name(st),
                    mf_channel_last_error(ch));
            goto out;
        }
        in_place += rr.committed;
        regions++;
    }
    if (e->region_ch && e->region_why[0])
        fprintf(stderr, "source: put regions refused (%s): rows put from device buffers\n",
                e->region_why);
    st = !n_items ? MF_OK
         : from_dev ? mf_put_device_batch(ch, items, n_items, 0, MF_TIMEOUT_DEFAULT)
                    : mf_put_batch(ch, items, n_items, 0, MF_TIMEOUT_DEFAULT);
    if (st != MF_OK && from_dev && st != MF_UNAVAILABLE && st != MF_DEADLINE_EXCEEDED) {
        fprintf(stderr, "source: put from device memory: %s %s; again through host memory\n",
                mf_status_name(st), mf_channel_last_error(ch));
        st = mfw_backend_extract_to_host(be, e);
        for (size_t i = 0, k = 0; st == MF_OK && i < nl; i++) /* the same order as above */
            for (uint32_t b = 0, l = layers[i]; e->sizes[l] && !region_layer[l] &&
                                                 b < e->n_blocks; b++)
                items[k++].row = e->rows[l][b];
        from_dev = 0;
        if (st == MF_OK)
            st = mf_put_batch(ch, items, n_items, 0, MF_TIMEOUT_DEFAULT);
    }
    double t_put = mf_now_s() - t0;
    if (st != MF_OK) {
        fprintf(stderr, "source: put: %s %s\n", mf_status_name(st), mf_channel_last_error(ch));
        goto out;
    }
    const mfw_gpt_cfg_t *c = mfw_gpt_cfg(m);
    printf("source  model %s: %u layers x %u heads x d=%u; prefill of %u tokens %.4f s (extract %.4f s); device %s\n",
           o->source_id, c->n_layer, c->n_head, c->head_dim, n, t_prefill, e->seconds,
           mfw_backend_desc(be));
    printf("source  stored %zu rows: layers", n_items + in_place);
    for (uint32_t i = 0; i < nl; i++)
        printf(" %u", layers[i]);
    printf(" x %u blocks of %u, codec %s, top-p %.2f, %.1f KiB, kept %.1f%% of (head, block) pairs\n",
           e->n_blocks, e->block_size, is_auto ? "by plan" : o->codec, o->top_p, bytes / 1024.0,
           cand ? 100.0 * (double)e->entries / (double)cand : 0.0);
    printf("source  put in %.1f ms to %s (tier %s, zero-copy arena: %s, from %s); profile %s -> %s stored\n",
           1e3 * t_put, o->daemon,
           regions ? "gpu" : n_items ? mf_tier_name(items[0].result.tier) : "-",
           mf_channel_has_arena(ch) ? "yes" : "no", from_dev ? "device memory" : "host memory",
           prof->source_model, prof->target_model);
    if (regions)
        printf("source  written in place: %zu rows in %zu put regions (one per layer, reserved "
               "by capacity)\n", in_place, regions);
    rc = 0;
out:
    free(items);
    if (e)
        mfw_backend_extract_release(be, e);
    free(e);
    mfw_brun_free(run);
    mf_channel_close(ch);
    mf_profile_free(prof);
    free(pb);
    return rc;
}

/* ---- target ------------------------------------------------------------------------- */

typedef struct result {
    double prefill_s, nll;
    uint32_t *pred;          /* [M] argmax at the positions that predict the continuation */
    uint32_t *gen;           /* [G] */
    uint32_t n_gen;
} result_t;

static uint32_t argmax(const float *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        best = x[i] > x[best] ? i : best;
    return best;
}

/* --dump: PREFIX.KIND.f32 (logits [rows, V] float32, host order) and PREFIX.KIND.gen (the
 * generated token ids, one line). */
static int dump_write(const char *prefix, const char *kind, const char *ext, const void *data,
                      size_t bytes, const uint32_t *ids, uint32_t n_ids)
{
    char path[4096];
    snprintf(path, sizeof path, "%s.%s.%s", prefix, kind, ext);
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    if (data)
        fwrite(data, 1, bytes, f);
    for (uint32_t i = 0; ids && i < n_ids; i++)
        fprintf(f, "%u%c", ids[i], i + 1 < n_ids ? ' ' : '\n');
    int bad = ferror(f);
    return fclose(f) || bad ? -1 : 0;
}

/* Prefill tokens[0..total) (context n + continuation), score, then generate; dump (may be
 * NULL) receives the logits and tokens as PREFIX.kind.{f32,gen}. */
static mf_status_t target_pass(mfw_backend_t *be, const mfw_gpt_t *m, const uint32_t *tokens,
                               uint32_t n, uint32_t total, uint32_t gen, mfw_hook_t hook,
                               void *ctx, const char *dump, const char *kind, result_t *res)
{
    uint32_t V = mfw_gpt_cfg(m)->vocab, M = total - n;
    mfw_brun_t *run = NULL;
    float *logits = malloc(sizeof(float) * (size_t)V * (M + 1));
    res->pred = calloc(M + 1, sizeof(uint32_t));
    res->gen = calloc(gen + 1, sizeof(uint32_t));
    mf_status_t st = !logits || !res->pred || !res->gen ? MF_RESOURCE_EXHAUSTED
                                                         : mfw_brun_create(be, total + gen, &run);
    if (st != MF_OK)
        goto out;
    double t0 = mf_now_s();
    st = mfw_brun_forward(run, tokens, total, hook, ctx, n - 1, logits);
    res->prefill_s = mf_now_s() - t0;
    if (st != MF_OK && *mfw_brun_error(run))
        fprintf(stderr, "target: %s\n", mfw_brun_error(run));
    if (st == MF_OK && dump &&
        dump_write(dump, kind, "f32", logits, sizeof(float) * (size_t)V * (M + 1), NULL, 0)) {
        fprintf(stderr, "target: cannot write %s.%s.f32\n", dump, kind);
        st = MF_INTERNAL;
    }
    res->nll = 0;
    for (uint32_t i = 0; st == MF_OK && i <= M; i++) {
        const float *l = logits + (size_t)i * V;
        res->pred[i] = argmax(l, V);
        if (i == M)
            break;
        double mx = l[res->pred[i]], sum = 0;
        for (uint32_t v = 0; v < V; v++)
            sum += exp((double)l[v] - mx);
        res->nll += mx + log(sum) - (double)l[tokens[n + i]];
    }
    uint32_t next = res->pred[M];
    for (res->n_gen = 0; st == MF_OK && res->n_gen < gen; res->n_gen++) {
        res->gen[res->n_gen] = next;
        if (res->n_gen + 1 < gen &&
            (st = mfw_brun_forward(run, &next, 1, MFW_HOOK_NONE, NULL, 0, logits)) == MF_OK)
            next = argmax(logits, V);
    }
    if (st == MF_OK && dump && dump_write(dump, kind, "gen", NULL, 0, res->gen, res->n_gen)) {
        fprintf(stderr, "target: cannot write %s.%s.gen\n", dump, kind);
        st = MF_INTERNAL;
    }
out:
    mfw_brun_free(run);
    free(logits);
    return st;
}

static int run_target(const opts_t *o, mfw_backend_t *be, const mfw_gpt_t *m,
                      const mfw_tok_t *tok, uint32_t *tokens, uint32_t n, uint32_t total)
{
    int rc = 1, reuse = !o->no_reuse, full = o->no_reuse || o->compare;
    mf_channel_t *ch = NULL;
    Mapflow__V1__MappingProfile *prof = NULL;
    mf_get_result_t *got = NULL;
    const mf_row_view_t **views = NULL;
    const void **devs = NULL;  /* rows leased on the device (GPU arena) */
    mfw_reuse_t *ru = calloc(1, sizeof *ru);
    result_t rr = { 0 }, rf = { 0 };
    mf_status_t st = MF_OK;
    const char *why = "";
    uint32_t hit = 0, total_blocks = 0, layers[MFW_MAX_LAYERS], nl = 0;
    double t_fetch = 0, t_upload = 0;
    if (!ru)
        return 1;
    if (reuse) {
        if (!o->daemon) {
            usage();
            rc = 2;
            goto out;
        }
        if (!(ch = connect_daemon(o, mfw_backend_gpu(be)))) {
            rc = 3;
            goto out;
        }
        void *pb = NULL;
        size_t pb_len = 0;
        double t0 = mf_now_s();
        st = mf_profile_get(ch, o->source_id, o->target_id, &pb, &pb_len, MF_TIMEOUT_DEFAULT);
        if (st != MF_OK || (st = mf_profile_decode(pb, pb_len, &prof, &why)) != MF_OK) {
            fprintf(stderr, "target: no usable profile %s -> %s: %s\n", o->source_id,
                    o->target_id, *why ? why : mf_channel_last_error(ch));
            free(pb);
            goto out;
        }
        free(pb);
        /* the layers a source exports for this profile (whatever their codec: apply reads
         * it from each row's header); layers of compute heads only have no rows */
        mf_export_layer_t plan[MFW_MAX_LAYERS];
        if ((st = mf_profile_export_plan(prof, MF_CODEC_FP16, plan, MFW_MAX_LAYERS, &nl,
                                         &why)) != MF_OK) {
            fprintf(stderr, "target: export plan: %s %s\n", mf_status_name(st), why);
            goto out;
        }
        for (uint32_t i = 0; i < nl; i++)
            layers[i] = plan[i].source_layer;
        uint32_t blocks[MFW_MAX_LAYERS];
        if (nl) /* else no rows to look for: every mapped head computes */
            st = mf_lookup(ch, o->source_id, prof->block_size, tokens, total, layers, nl,
                           blocks, &total_blocks, MF_TIMEOUT_DEFAULT);
        hit = total_blocks;
        for (uint32_t i = 0; st == MF_OK && i < nl; i++)
            hit = blocks[i] < hit ? blocks[i] : hit;
        if (st == MF_OK && hit)
            st = mf_get_prefix(ch, o->source_id, prof->block_size, tokens,
                               (size_t)hit * prof->block_size, layers, nl, 0, hit, MF_GET_LEASE,
                               &got, MF_TIMEOUT_DEFAULT);
        t_fetch = mf_now_s() - t0;
        if (st != MF_OK) {
            fprintf(stderr, "target: lookup/get: %s %s\n", mf_status_name(st), mf_channel_last_error(ch));
            goto out;
        }
        views = calloc((size_t)nl * hit + 1, sizeof *views);
        devs = calloc((size_t)nl * hit + 1, sizeof *devs);
        if (!views || !devs)
            goto out;
        ru->profile = prof;
        ru->n_rows = hit;
        for (uint32_t i = 0; i < nl && hit; i++) {
            for (uint32_t b = 0; b < hit; b++) {
                const mf_row_ref_t *r = &got->rows[(size_t)i * hit + b];
                views[(size_t)i * hit + b] = r->status == MF_OK && !r->on_device ? &r->view : NULL;
                devs[(size_t)i * hit + b] = r->status == MF_OK && r->on_device ? r->data : NULL;
            }
            if (layers[i] < MFW_MAX_LAYERS) {
                ru->rows[layers[i]] = views + (size_t)i * hit;
                ru->dev_in[layers[i]] = devs + (size_t)i * hit;
            }
        }
        t0 = mf_now_s();
        if ((st = mfw_backend_reuse_prepare(be, ru)) != MF_OK) {
            fprintf(stderr, "target: rows to the device: %s %s\n", mf_status_name(st), ru->why ? ru->why : "");
            goto out;
        }
        t_upload = mf_now_s() - t0;
        if ((st = target_pass(be, m, tokens, n, total, o->generate, MFW_HOOK_REUSE, ru, o->dump,
                              "reuse", &rr)) != MF_OK) {
            fprintf(stderr, "target: reuse prefill: %s %s\n", mf_status_name(st), ru->why ? ru->why : "");
            goto out;
        }
    }
    if (full && (st = target_pass(be, m, tokens, n, total, o->generate, MFW_HOOK_NONE, NULL,
                                  o->dump, "full", &rf)) != MF_OK) {
        fprintf(stderr, "target: prefill: %s\n", mf_status_name(st));
        goto out;
    }
    const mfw_gpt_cfg_t *c = mfw_gpt_cfg(m);
    uint32_t M = total - n;
    printf("target  model %s: %u layers x %u heads x d=%u; context %u tokens (%u from the source + %u continuation); device %s\n",
           o->target_id, c->n_layer, c->n_head, c->head_dim, total, n, M, mfw_backend_desc(be));
    if (reuse) {
        printf("target  profile %s -> %s: L0=%u, %zu mapped layers, block %u, recompute last %u\n",
               prof->source_model, prof->target_model, prof->l0, prof->n_layers, prof->block_size,
               prof->recompute ? prof->recompute->last_blocks : 0);
        printf("target  lookup + leased get: %u of %u blocks hit on %u source layers, %.1f ms, zero-copy: %s\n",
               hit, total_blocks, nl, 1e3 * t_fetch, mf_channel_has_arena(ch) ? "yes" : "no");
        uint64_t cand = ru->stats.mask_candidates;
        if (mfw_backend_is_cuda(be))
            printf("target  reuse: %u layers through mf_apply_cuda (%.2f ms); rows on the device: %u leased in place (GPU arena), %u copied from host memory (%.2f ms)\n",
                   ru->layers_mapped, 1e3 * ru->seconds, ru->rows_on_device, ru->rows_copied,
                   1e3 * t_upload);
        else
            printf("target  reuse: %u layers through mf_apply_ref (%.2f s), exact blocks %llu, prob tiles %llu, mask blocks %llu of %llu\n",
                   ru->layers_mapped, ru->seconds, (unsigned long long)ru->stats.exact_blocks,
                   (unsigned long long)ru->stats.prob_tiles, (unsigned long long)ru->stats.mask_blocks,
                   (unsigned long long)cand);
    }
    printf("target  %-28s %12s %12s\n", "", reuse ? "reuse" : "", full ? "full prefill" : "");
    char a[32] = "", b[32] = "";
    if (reuse)
        snprintf(a, sizeof a, "%.4f", rr.prefill_s);
    if (full)
        snprintf(b, sizeof b, "%.4f", rf.prefill_s);
    printf("target  %-28s %12s %12s\n", "prefill seconds", a, b);
    if (M) {
        if (reuse)
            snprintf(a, sizeof a, "%.2f", exp(rr.nll / M));
        if (full)
            snprintf(b, sizeof b, "%.2f", exp(rf.nll / M));
        printf("target  %-28s %12s %12s\n", "perplexity (continuation)", a, b);
    }
    if (reuse) {
        printf("target  generated (reuse): ");
        print_text(tok, rr.gen, rr.n_gen);
        putchar('\n');
    }
    if (full) {
        printf("target  generated (full):  ");
        print_text(tok, rf.gen, rf.n_gen);
        putchar('\n');
    }
    rc = 0;
    if (reuse && full && M) {
        uint32_t same = 0, gsame = 0;
        for (uint32_t i = 0; i < M; i++)
            same += rr.pred[i] == rf.pred[i];
        while (gsame < rr.n_gen && gsame < rf.n_gen && rr.gen[gsame] == rf.gen[gsame])
            gsame++;
        double agree = (double)same / M;
        printf("target  top-1 agreement over the continuation: %.1f%% (%u of %u tokens); generation identical for %u of %u tokens\n",
               100 * agree, same, M, gsame, rr.n_gen);
        if (o->agree_min >= 0 && agree < o->agree_min) {
            fprintf(stderr, "target: agreement %.3f below --agree-min %.3f\n", agree, o->agree_min);
            rc = 1;
        }
    }
out:
    if (got) {
        mf_release_result(ch, got, MF_TIMEOUT_DEFAULT);
        mf_get_result_free(got);
    }
    mfw_backend_reuse_release(be, ru);
    free(views);
    free(devs);
    free(rr.pred);
    free(rr.gen);
    free(rf.pred);
    free(rf.gen);
    free(ru);
    mf_profile_free(prof);
    mf_channel_close(ch);
    return rc;
}

int main(int argc, char **argv)
{
    opts_t o = { .device = "auto", .ns = "mapflow", .source_id = "mapflow-small-src",
                 .target_id = "mapflow-small-tgt",
                 .codec = "auto", .prob_codec = "fp16", .tokens = 448, .cont = 64,
                 .generate = 24, .top_p = 0.95f,
                 .agree_min = -1 };
    static const struct option lo[] = {
        { "role", 1, 0, 'r' }, { "model", 1, 0, 'm' }, { "tokenizer", 1, 0, 'k' },
        { "daemon", 1, 0, 'a' }, { "ns", 1, 0, 'N' }, { "source-id", 1, 0, 'S' },
        { "target-id", 1, 0, 'T' }, { "profile", 1, 0, 'P' }, { "text", 1, 0, 'x' },
        { "prompt", 1, 0, 'p' }, { "codec", 1, 0, 'c' }, { "prob-codec", 1, 0, 'B' },
        { "tokens", 1, 0, 'n' },
        { "continue", 1, 0, 'C' }, { "generate", 1, 0, 'g' }, { "top-p", 1, 0, 't' },
        { "no-reuse", 0, 0, 'R' }, { "compare", 0, 0, 'Q' }, { "agree-min", 1, 0, 'A' },
        { "device", 1, 0, 'D' }, { "dump", 1, 0, 'U' }, { "help", 0, 0, 'h' }, { 0, 0, 0, 0 } };
    for (int c; (c = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        switch (c) {
        case 'r': o.role = optarg; break;
        case 'm': o.model = optarg; break;
        case 'k': o.tokenizer = optarg; break;
        case 'a': o.daemon = optarg; break;
        case 'N': o.ns = optarg; break;
        case 'S': o.source_id = optarg; break;
        case 'T': o.target_id = optarg; break;
        case 'P': o.profile = optarg; break;
        case 'x': o.text = optarg; break;
        case 'p': o.prompt = optarg; break;
        case 'c': o.codec = optarg; break;
        case 'B': o.prob_codec = optarg; break;
        case 'n': o.tokens = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'C': o.cont = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'g': o.generate = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 't': o.top_p = strtof(optarg, NULL); break;
        case 'R': o.no_reuse = 1; break;
        case 'Q': o.compare = 1; break;
        case 'A': o.agree_min = strtod(optarg, NULL); break;
        case 'D': o.device = optarg; break;
        case 'U': o.dump = optarg; break;
        default: usage(); return 2;
        }
    }
    int source = o.role && !strcmp(o.role, "source"), target = o.role && !strcmp(o.role, "target");
    if ((!source && !target) || !o.model || !o.tokenizer || !o.text || o.tokens < 2 ||
        o.tokens > (1u << 20) || o.cont > (1u << 20) || o.generate > 4096 ||
        !(o.top_p > 0 && o.top_p <= 1)) {
        usage();
        return 2;
    }
    char err[512] = "";
    mfw_tok_t *tok = NULL;
    mfw_gpt_t *m = NULL;
    mfw_backend_t *be = NULL;
    uint32_t *ids = NULL, *extra = NULL;
    int rc = 1;
    size_t text_len = 0, n_ids = 0, n_extra = 0;
    char *text = read_file(o.text, 64u << 20, &text_len);
    if (!text) {
        fprintf(stderr, "%s: cannot read %s (or over 64 MiB)\n", o.role, o.text);
        return 1;
    }
    if (mfw_tok_load(o.tokenizer, &tok, err, sizeof err) != MF_OK ||
        mfw_gpt_load(o.model, &m, err, sizeof err) != MF_OK) {
        fprintf(stderr, "%s: %s\n", o.role, err);
        goto out;
    }
    if (mfw_tok_vocab(tok) != mfw_gpt_cfg(m)->vocab) {
        fprintf(stderr, "%s: tokenizer has %u tokens, the model %u\n", o.role, mfw_tok_vocab(tok),
                mfw_gpt_cfg(m)->vocab);
        goto out;
    }
    if (!(ids = encode_text(tok, text, text_len, &n_ids)) ||
        (o.prompt && !(extra = encode_text(tok, o.prompt, strlen(o.prompt), &n_extra))))
        goto out;
    uint32_t n = o.tokens, cont = source ? 0 : o.prompt ? (uint32_t)n_extra : o.cont;
    if (n_ids < (size_t)n + (o.prompt ? 0 : cont)) {
        fprintf(stderr, "%s: %s has %zu tokens, %u needed\n", o.role, o.text, n_ids,
                n + (o.prompt ? 0 : cont));
        goto out;
    }
    if (o.prompt) {
        uint32_t *all = realloc(ids, sizeof(uint32_t) * ((size_t)n + cont + 1));
        if (!all)
            goto out;
        ids = all;
        memcpy(ids + n, extra, sizeof(uint32_t) * cont);
    }
    mf_status_t st = mfw_backend_open(m, o.device, &be, err, sizeof err);
    if (st != MF_OK) {
        fprintf(stderr, "%s: %s\n", o.role, err);
        rc = st == MF_INVALID_ARGUMENT ? 2 : 1;
        goto out;
    }
    rc = source ? run_source(&o, be, m, ids, n) : run_target(&o, be, m, tok, ids, n, n + cont);
out:
    mfw_backend_free(be);
    free(extra);
    free(ids);
    free(text);
    mfw_gpt_free(m);
    mfw_tok_free(tok);
    return rc;
}
