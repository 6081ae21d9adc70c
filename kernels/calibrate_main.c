/*
 * mapflow-calibrate — fits a mapping profile from sample attention maps (calibrate.h).
 *
 *   mapflow-calibrate --source DIR --target DIR --out PROFILE [--baseline-out PROFILE]
 *       [--max-error E] [--prob-max-error E] [--mask-max-error E] [--json]
 *       [--mask-min-recall R] [--per-head-top-p]
 *       [--mask-top-p P] [--min-l0 N] [--block B] [--recompute-last R]
 *       [--recompute-first F] [--source-model ID] [--target-model ID] [--max-elems N]
 *       [--values DIR [--objective maps|outputs]]
 *
 * Each DIR holds one .npy per sequence, [L, H, N, N] float32 or float16, the same file
 * names in both. --values DIR: the target's values V per sequence (same names), [Lt,
 * Hkv, N, d] with Hkv dividing Ht, fed with the maps (mf_calib_add_v: the products A·V are
 * computed on the CPU, N²·d each); --objective outputs then fits W to the head outputs
 * (calibrate.h, MF_CALIB_OUTPUTS) instead of the maps (the default). PROFILE is a
 * serialized Mapflow__V1__MappingProfile. The summary goes to
 * stdout, or to stderr with --json (then stdout carries only the JSON).
 * Exit: 0 ok, 1 error (bad data, cannot write), 2 usage.
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calibrate.h"
#include "mf_profile.h"
#include "npy.h"

#define MAX_FILES 100000

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mapflow-calibrate --source DIR --target DIR --out PROFILE\n"
            "         [--baseline-out PROFILE] [--max-error E] [--prob-max-error E]\n"
            "         [--mask-max-error E] [--mask-min-recall R] [--per-head-top-p]\n"
            "         [--json] [--mask-top-p P] [--min-l0 N]\n"
            "         [--block B] [--recompute-last R] [--recompute-first F]\n"
            "         [--source-model ID] [--target-model ID] [--max-elems N]\n"
            "         [--values DIR [--objective maps|outputs]]\n"
            "  DIRs hold one .npy [L, H, N, N] (f4 or f2) per sequence, same names in both.\n"
            "  modes: prob if head error < --prob-max-error (layer error <= --max-error);\n"
            "  else mask if the mask recall (share of the target head's attention mass in\n"
            "  the blocks mask mode attends) >= --mask-min-recall (and error <\n"
            "  --mask-max-error if given); else compute. --per-head-top-p: each mask head\n"
            "  gets the smallest target Top-P (grid 0.5..1) reaching the recall.\n"
            "  --values DIR: the target's V per sequence, .npy [Lt, Hkv, N, d] (same names);\n"
            "  --objective outputs (needs --values) fits W to the head outputs A.V and\n"
            "  gates prob mode by their centred error; default maps: W fits the maps.\n"
            "  defaults: --max-error 0.9 --prob-max-error 0.2 --mask-min-recall 0.9\n"
            "            --mask-top-p 0.95 --min-l0 1 --block 64 --recompute-last 1\n");
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_names(char **names, size_t n)
{
    for (size_t k = 0; k < n; k++)
        free(names[k]);
    free(names);
}

/* Sorted *.npy names of dir; NULL (and a message) on error. */
static char **list_npy(const char *dir, size_t *n)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "mapflow-calibrate: %s: %s\n", dir, strerror(errno));
        return NULL;
    }
    size_t cap = 16;
    char **names = malloc(cap * sizeof(char *));
    struct dirent *e;
    *n = 0;
    while (names && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".npy") != 0)
            continue;
        if (*n == MAX_FILES) {
            fprintf(stderr, "mapflow-calibrate: %s: more than %d .npy files\n", dir, MAX_FILES);
            free_names(names, *n);
            closedir(d);
            return NULL;
        }
        if (*n == cap) {
            char **nn = realloc(names, (cap *= 2) * sizeof(char *));
            if (!nn) {
                free_names(names, *n);
                names = NULL;
                break;
            }
            names = nn;
        }
        names[(*n)++] = strdup(e->d_name);
    }
    closedir(d);
    if (!names) {
        fprintf(stderr, "mapflow-calibrate: out of memory\n");
        return NULL;
    }
    qsort(names, *n, sizeof(char *), cmp_str);
    return names;
}

/* dir/name read into a (path: the file's path, for messages); 0 with a message on error. */
static int open_npy(const char *dir, const char *name, uint64_t max_elems, mf_npy_t *a,
                    char (*path)[4096])
{
    char err[512];
    snprintf(*path, sizeof *path, "%s/%s", dir, name);
    if (mf_npy_read(*path, max_elems, a, err, sizeof err) != MF_OK) {
        fprintf(stderr, "mapflow-calibrate: %s\n", err);
        return 0;
    }
    return 1;
}

static int read_map(const char *dir, const char *name, uint64_t max_elems, mf_npy_t *a)
{
    char path[4096];
    if (!open_npy(dir, name, max_elems, a, &path))
        return 0;
    const uint64_t *s = a->hdr.shape;
    if (a->hdr.ndim != 4 || s[2] != s[3] || s[0] < 1 || s[0] > 1024 || s[1] < 1 ||
        s[1] > 64 || s[2] < 1 || s[2] > 65536) {
        fprintf(stderr, "mapflow-calibrate: %s: need shape [L, H, N, N] with L <= 1024, "
                        "H <= 64, N <= 65536\n", path);
        mf_npy_free(a);
        return 0;
    }
    return 1;
}

/* The target's values of one sequence: [Lt, Hkv, N, d] matching the maps' Lt, Ht, N. */
static int read_values(const char *dir, const char *name, uint64_t max_elems,
                       const uint32_t *dims, mf_npy_t *a)
{
    char path[4096];
    if (!open_npy(dir, name, max_elems, a, &path))
        return 0;
    const uint64_t *s = a->hdr.shape;
    if (a->hdr.ndim != 4 || s[0] != dims[2] || s[1] < 1 || s[1] > dims[3] ||
        dims[3] % s[1] || s[2] != dims[4] || s[3] < 1 || s[3] > 1024) {
        fprintf(stderr, "mapflow-calibrate: %s: need values [Lt = %u, Hkv dividing %u, "
                        "N = %u, d <= 1024]\n", path, dims[2], dims[3], dims[4]);
        mf_npy_free(a);
        return 0;
    }
    return 1;
}

static const char *mode_name(uint8_t m)
{
    return m == MF_HEAD_PROB ? "prob" : m == MF_HEAD_MASK ? "mask" : "compute";
}

static void print_json(const mf_calib_t *c, uint32_t lt, uint32_t ht, uint32_t hs)
{
    uint32_t l0 = mf_calib_l0(c);
    printf("{\"L0\": %u, \"layers\": [", l0);
    for (uint32_t t = l0; t < lt; t++) {
        mf_calib_layer_t r;
        mf_calib_layer(c, t, &r);
        printf("%s{\"target_layer\": %u, \"source_layer\": %u, \"error\": %.6g, "
               "\"baseline_error\": %.6g, \"W\": [", t > l0 ? ", " : "", t, r.source_layer,
               r.error, r.base_error);
        for (uint32_t h = 0; h < ht; h++) {
            printf("%s[", h ? ", " : "");
            for (uint32_t s = 0; s < hs; s++)
                printf("%s%.6g", s ? ", " : "", r.w[(size_t)h * hs + s]);
            printf("]");
        }
        printf("], \"heads\": [");
        for (uint32_t h = 0; h < ht; h++)
            printf("%s{\"mode\": \"%s\", \"error\": %.6g, \"recall\": %.6g, "
                   "\"top_p\": %.6g}", h ? ", " : "", mode_name(r.mode[h]), r.head_error[h],
                   r.recall[h], r.top_p[h]);
        printf("]}");
    }
    printf("]}\n");
}

static void print_summary(FILE *f, const mf_calib_t *c, size_t n_seq, uint32_t lt,
                          uint32_t ht)
{
    uint32_t l0 = mf_calib_l0(c), counts[3] = { 0 };
    fprintf(f, "calibrated on %zu sequences; L0 = %u (target layers [0, %u) computed)\n",
            n_seq, l0, l0);
    fprintf(f, "%-6s %-6s %-9s %-9s %-7s %s\n", "target", "source", "error", "iam-err",
            "modes", "per head: mask recall @ target Top-P (p = prob, m = mask, c = compute)");
    for (uint32_t t = 0; t < lt; t++) {
        mf_calib_layer_t r;
        mf_calib_layer(c, t, &r);
        fprintf(f, "%-6u %-6u %-9.4f %-9.4f ", t, r.source_layer, r.error, r.base_error);
        if (t < l0) {
            fprintf(f, "(below L0: computed)\n");
            continue;
        }
        for (uint32_t h = 0; h < ht; h++) {
            fputc("cpm"[r.mode[h]], f);
            counts[r.mode[h]]++;
        }
        fprintf(f, "%*s", ht < 8 ? 8 - (int)ht : 1, "");
        for (uint32_t h = 0; h < ht; h++)
            fprintf(f, "%s%.3f@%.3g", h ? " " : "", r.recall[h], r.top_p[h]);
        fputc('\n', f);
    }
    fprintf(f, "heads in mapped layers: %u prob, %u mask, %u compute\n", counts[1], counts[2],
            counts[0]);
}

static int parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi))
        return 0;
    *out = v;
    return 1;
}

int main(int argc, char **argv)
{
    enum { O_SOURCE = 1, O_TARGET, O_OUT, O_BASE, O_MAXE, O_PROBE, O_MASKE, O_JSON, O_TOPP,
           O_MINL0, O_BLOCK, O_RLAST, O_RFIRST, O_SMODEL, O_TMODEL, O_MAXELEMS, O_RECALL,
           O_PERHEAD, O_VALUES, O_OBJ, O_HELP };
    static const struct option opts[] = {
        { "source", 1, 0, O_SOURCE }, { "target", 1, 0, O_TARGET }, { "out", 1, 0, O_OUT },
        { "baseline-out", 1, 0, O_BASE }, { "max-error", 1, 0, O_MAXE },
        { "prob-max-error", 1, 0, O_PROBE }, { "mask-max-error", 1, 0, O_MASKE },
        { "json", 0, 0, O_JSON }, { "mask-top-p", 1, 0, O_TOPP }, { "min-l0", 1, 0, O_MINL0 },
        { "block", 1, 0, O_BLOCK }, { "recompute-last", 1, 0, O_RLAST },
        { "recompute-first", 1, 0, O_RFIRST }, { "source-model", 1, 0, O_SMODEL },
        { "target-model", 1, 0, O_TMODEL }, { "max-elems", 1, 0, O_MAXELEMS },
        { "mask-min-recall", 1, 0, O_RECALL }, { "per-head-top-p", 0, 0, O_PERHEAD },
        { "values", 1, 0, O_VALUES }, { "objective", 1, 0, O_OBJ },
        { "help", 0, 0, O_HELP }, { 0, 0, 0, 0 },
    };
    const char *src_dir = NULL, *tgt_dir = NULL, *out = NULL, *base_out = NULL,
               *val_dir = NULL;
    mf_calib_opts_t o = { .min_l0 = 1, .recompute_last = 1 };
    int json = 0, c;
    double x, max_elems = (double)(1ull << 28);
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int ok = 1;
        switch (c) {
        case O_SOURCE: src_dir = optarg; break;
        case O_TARGET: tgt_dir = optarg; break;
        case O_OUT: out = optarg; break;
        case O_BASE: base_out = optarg; break;
        case O_MAXE: ok = parse_double(optarg, 1e-9, 1e9, &o.max_error); break;
        case O_PROBE: ok = parse_double(optarg, 1e-9, 1e9, &o.prob_max_error); break;
        case O_MASKE: ok = parse_double(optarg, 1e-9, 1e9, &o.mask_max_error); break;
        case O_JSON: json = 1; break;
        case O_TOPP: ok = parse_double(optarg, 1e-6, 1.0, &o.mask_top_p); break;
        case O_MINL0: ok = parse_double(optarg, 0, 1024, &x) && x == (uint32_t)x;
                      o.min_l0 = (uint32_t)x; break;
        case O_BLOCK: ok = parse_double(optarg, 8, 256, &x) && x == (uint32_t)x &&
                           !((uint32_t)x & ((uint32_t)x - 1));
                      o.block_size = (uint32_t)x; break;
        case O_RLAST: ok = parse_double(optarg, 0, 1e6, &x) && x == (uint32_t)x;
                      o.recompute_last = (uint32_t)x; break;
        case O_RFIRST: ok = parse_double(optarg, 0, 1e6, &x) && x == (uint32_t)x;
                       o.recompute_first = (uint32_t)x; break;
        case O_SMODEL: o.source_model = optarg; break;
        case O_TMODEL: o.target_model = optarg; break;
        case O_MAXELEMS: ok = parse_double(optarg, 1, 1e12, &max_elems); break;
        case O_RECALL: ok = parse_double(optarg, 1e-9, 1.0, &o.mask_min_recall); break;
        case O_PERHEAD: o.per_head_top_p = 1; break;
        case O_VALUES: val_dir = optarg; break;
        case O_OBJ: ok = !strcmp(optarg, "maps") || !strcmp(optarg, "outputs");
                    o.objective = strcmp(optarg, "outputs") ? MF_CALIB_MAPS : MF_CALIB_OUTPUTS;
                    break;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (!ok) {
            fprintf(stderr, "mapflow-calibrate: bad value for --%s: '%s'\n", opts[c - 1].name,
                    optarg);
            return 2;
        }
    }
    if (!src_dir || !tgt_dir || !out || optind != argc) {
        usage(stderr);
        return 2;
    }
    if (o.objective == MF_CALIB_OUTPUTS && !val_dir) {
        fprintf(stderr, "mapflow-calibrate: --objective outputs needs --values DIR\n");
        return 2;
    }
    if (!o.source_model)
        o.source_model = src_dir;
    if (!o.target_model)
        o.target_model = tgt_dir;

    int rc = 1;
    size_t ns = 0, nt = 0;
    char **sn = list_npy(src_dir, &ns), **tn = sn ? list_npy(tgt_dir, &nt) : NULL;
    mf_calib_t *cal = NULL;
    Mapflow__V1__MappingProfile *prof = NULL, *base = NULL;
    uint32_t dims[5] = { 0 }; /* Ls, Hs, Lt, Ht, N of the first sequence */
    if (!sn || !tn)
        goto out_names;
    if (ns == 0) {
        fprintf(stderr, "mapflow-calibrate: %s: no .npy files\n", src_dir);
        goto out_names;
    }
    for (size_t k = 0; k < ns || k < nt; k++)
        if (k >= ns || k >= nt || strcmp(sn[k], tn[k]) != 0) {
            fprintf(stderr, "mapflow-calibrate: %s and %s must hold the same file names "
                            "(first difference: %s)\n", src_dir, tgt_dir,
                    k < ns ? sn[k] : tn[k]);
            goto out_names;
        }
    for (size_t k = 0; k < ns; k++) {
        mf_npy_t sa, ta;
        if (!read_map(src_dir, sn[k], (uint64_t)max_elems, &sa))
            goto out_calib;
        if (!read_map(tgt_dir, tn[k], (uint64_t)max_elems, &ta)) {
            mf_npy_free(&sa);
            goto out_calib;
        }
        uint32_t d[5] = { (uint32_t)sa.hdr.shape[0], (uint32_t)sa.hdr.shape[1],
                          (uint32_t)ta.hdr.shape[0], (uint32_t)ta.hdr.shape[1],
                          (uint32_t)sa.hdr.shape[2] };
        int ok = sa.hdr.shape[2] == ta.hdr.shape[2];
        if (ok && k == 0) {
            memcpy(dims, d, sizeof dims);
            ok = mf_calib_create(d[0], d[1], d[2], d[3], &cal) == MF_OK;
        }
        ok = ok && memcmp(d, dims, 4 * sizeof(uint32_t)) == 0;
        if (!ok)
            fprintf(stderr, "mapflow-calibrate: %s: source [%u, %u, N, N] / target [%u, %u, "
                            "N, N] disagree with each other or with the first sequence\n",
                    sn[k], d[0], d[1], d[2], d[3]);
        mf_npy_t va = { 0 };
        if (ok && val_dir) /* against this sequence's Lt, Ht and N */
            ok = read_values(val_dir, sn[k], (uint64_t)max_elems, d, &va);
        mf_status_t st = !ok ? MF_INVALID_ARGUMENT
                         : val_dir ? mf_calib_add_v(cal, sa.data, ta.data, va.data, d[4],
                                                    (uint32_t)va.hdr.shape[1],
                                                    (uint32_t)va.hdr.shape[3])
                                   : mf_calib_add(cal, sa.data, ta.data, d[4]);
        if (ok && st != MF_OK) {
            fprintf(stderr, "mapflow-calibrate: %s: cannot add (%s%s)\n", sn[k],
                    mf_status_name(st),
                    val_dir ? "; the values' Hkv and d must be the same in every sequence"
                            : "");
            ok = 0;
        }
        if (val_dir)
            mf_npy_free(&va);
        mf_npy_free(&sa);
        mf_npy_free(&ta);
        if (!ok)
            goto out_calib;
    }
    if (mf_calib_fit(cal, &o) != MF_OK || mf_calib_profile(cal, &o, 0, &prof) != MF_OK ||
        mf_calib_profile(cal, &o, 1, &base) != MF_OK) {
        fprintf(stderr, "mapflow-calibrate: fitting failed\n");
        goto out_calib;
    }
    if (mf_profile_save(out, prof) != MF_OK) {
        fprintf(stderr, "mapflow-calibrate: %s: cannot write the profile\n", out);
        goto out_calib;
    }
    if (base_out && mf_profile_save(base_out, base) != MF_OK) {
        fprintf(stderr, "mapflow-calibrate: %s: cannot write the baseline\n", base_out);
        goto out_calib;
    }
    if (json)
        print_json(cal, dims[2], dims[3], dims[1]);
    print_summary(json ? stderr : stdout, cal, ns, dims[2], dims[3]);
    rc = 0;
out_calib:
    mf_profile_free(prof);
    mf_profile_free(base);
    mf_calib_destroy(cal);
out_names:
    if (sn)
        free_names(sn, ns);
    if (tn)
        free_names(tn, nt);
    return rc;
}
