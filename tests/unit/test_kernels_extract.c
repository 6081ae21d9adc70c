/* Reference extract: masses, Top-P selection, tiles, GQA, hashes, dtypes, errors, and the
 * strided query sample (MF_EXTRACT_SAMPLE); the put path's row copy (mf_rows_copy_ref). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "mf_codec.h"
#include "test_kernels_util.h"

enum { N = 256, B = 16, D = 32, NB = N / B };

typedef struct fixture {
    float *q, *k;
    uint32_t tokens[N];
    mf_extract_args_t a;
} fixture_t;

/* Structured (window + sink) Q/K so Top-P < 1 really drops blocks. */
static void fixture_init(fixture_t *f, uint32_t hq, uint32_t hkv, uint64_t seed)
{
    mf_synth_opts_t o = { .seed = seed, .n_tokens = N, .n_q_heads = hq, .n_kv_heads = hkv,
                          .head_dim = D, .window = 24 };
    f->q = malloc((size_t)N * hq * D * sizeof(float));
    f->k = malloc((size_t)N * hkv * D * sizeof(float));
    assert_int_equal(mf_synth_qkv(&o, f->q, f->k, NULL), MF_OK);
    mf_rng_t r;
    mf_rng_seed(&r, seed + 1);
    for (int t = 0; t < N; t++)
        f->tokens[t] = (uint32_t)(mf_rng_u64(&r) % 50000);
    f->a = (mf_extract_args_t){
        .src = { .q = f->q, .k = f->k, .dtype = MF_DTYPE_F32, .n_tokens = N, .n_q_heads = hq,
                 .n_kv_heads = hkv, .head_dim = D },
        .block_size = B, .top_p = 1.0f, .codec = MF_CODEC_MASK, .i0 = 0, .i1 = NB,
        .model = "src-model", .ns = "tenant-a", .layer = 3, .tokens = f->tokens,
    };
}

static void fixture_free(fixture_t *f)
{
    free(f->q);
    free(f->k);
}

static int entry_of(const mf_row_view_t *v, uint32_t j, uint32_t h)
{
    for (uint32_t c = 0; c < v->n_cols; c++)
        if (v->cols[c] == j)
            return (int)mf_row_entry(v, c, h);
    return -1;
}

/* Top-P = 1: every head keeps every block; decoded masses match float64 within the
 * mass-byte bound of proto/mf_codec.h. */
static void test_masses_topp1(void **state)
{
    (void)state;
    fixture_t f;
    tk_rows_t rows;
    fixture_init(&f, 4, 2, 11);
    assert_int_equal(tk_extract(&f.a, &rows), MF_OK);
    double mass[NB];
    for (uint32_t i = 0; i < NB; i++) {
        const mf_row_view_t *v = &rows.view[i];
        assert_int_equal(v->n_cols, i + 1);
        assert_int_equal(v->n_entries, (i + 1) * 4);
        for (uint32_t h = 0; h < 4; h++) {
            tk_block_mass(&f.a.src, h, i, B, mass);
            double sum = 0;
            for (uint32_t j = 0; j <= i; j++) {
                int e = entry_of(v, j, h);
                assert_true(e >= 0);
                double got = mf_row_mass(v, (uint32_t)e);
                double bound = sqrt(mass[j]) / 255.0 + 1.0 / (255.0 * 255.0) + 1e-9;
                assert_true(fabs(got - mass[j]) <= bound);
                sum += mass[j];
            }
            assert_true(fabs(sum - 1.0) < 1e-9);
        }
    }
    tk_rows_free(&rows);
    fixture_free(&f);
}

/* Top-P < 1: kept set contains 0 and i, reaches Top-P, and is minimal (dropping its
 * smallest optional block falls below Top-P; no dropped block outweighs a kept one). */
static void test_topp_minimal(void **state)
{
    (void)state;
    const float tps[] = { 0.5f, 0.8f, 0.95f };
    fixture_t f;
    fixture_init(&f, 4, 4, 12);
    uint64_t kept_total = 0, cand_total = 0;
    for (size_t x = 0; x < sizeof tps / sizeof tps[0]; x++) {
        tk_rows_t rows;
        f.a.top_p = tps[x];
        assert_int_equal(tk_extract(&f.a, &rows), MF_OK);
        for (uint32_t i = 0; i < NB; i++) {
            const mf_row_view_t *v = &rows.view[i];
            assert_true(fabs(v->top_p - tps[x]) < 1e-7);
            for (uint32_t h = 0; h < 4; h++) {
                double mass[NB], total = 0, acc = 0, min_opt = INFINITY, max_drop = 0;
                tk_block_mass(&f.a.src, h, i, B, mass);
                assert_true(entry_of(v, 0, h) >= 0);
                assert_true(entry_of(v, i, h) >= 0);
                for (uint32_t j = 0; j <= i; j++) {
                    total += mass[j];
                    int kept = entry_of(v, j, h) >= 0;
                    if (kept)
                        acc += mass[j];
                    if (kept && j != 0 && j != i && mass[j] < min_opt)
                        min_opt = mass[j];
                    if (!kept && mass[j] > max_drop)
                        max_drop = mass[j];
                    kept_total += (uint64_t)kept;
                }
                cand_total += i + 1;
                assert_true(acc >= tps[x] * total);
                if (min_opt < INFINITY) {
                    assert_true(acc - min_opt < tps[x] * total);
                    assert_true(max_drop <= min_opt);
                }
            }
        }
        tk_rows_free(&rows);
    }
    /* The structured inputs must make Top-P prune something, or the test shows nothing. */
    assert_true(kept_total < cand_total * 3 / 4);
    fixture_free(&f);
}

/* FP16 tiles hold P[r][k] (0 above the diagonal) within the FP16 bound; a given LSE
 * gives the same tiles as a computed one. */
static void test_tiles_and_lse(void **state)
{
    (void)state;
    fixture_t f;
    tk_rows_t rows, rows2;
    fixture_init(&f, 2, 1, 13);
    f.a.codec = MF_CODEC_FP16;
    f.a.top_p = 0.9f;
    f.a.i0 = 3;
    f.a.i1 = 9;
    assert_int_equal(tk_extract(&f.a, &rows), MF_OK);
    double *p = malloc(N * sizeof(double));
    for (uint32_t k = 0; k < rows.n; k++) {
        const mf_row_view_t *v = &rows.view[k];
        uint32_t i = v->block_index;
        assert_int_equal(i, f.a.i0 + k);
        for (uint32_t c = 0; c < v->n_cols; c++)
            for (uint32_t h = 0; h < 2; h++) {
                int64_t e = mf_row_entry(v, c, h);
                if (e < 0)
                    continue;
                for (uint32_t q = 0; q < B; q++) {
                    mf_attention_row_ref(&f.a.src, h, i * B + q, p, NULL);
                    for (uint32_t kk = 0; kk < B; kk++) {
                        uint32_t key = v->cols[c] * B + kk;
                        double want = key <= i * B + q ? p[key] : 0.0;
                        double got = mf_row_tile_value(v, (uint32_t)e, q, kk);
                        assert_true(fabs(got - want) <= want * 0x1p-11 + 0x1p-25);
                    }
                }
            }
    }
    /* Same with the LSE given. */
    float *lse = malloc((size_t)2 * N * sizeof(float));
    for (uint32_t h = 0; h < 2; h++)
        for (uint32_t r = 0; r < N; r++) {
            double l;
            mf_attention_row_ref(&f.a.src, h, r, p, &l);
            lse[(size_t)h * N + r] = (float)l;
        }
    f.a.lse = lse;
    assert_int_equal(tk_extract(&f.a, &rows2), MF_OK);
    for (uint32_t k = 0; k < rows.n; k++) {
        assert_int_equal(rows.view[k].n_cols, rows2.view[k].n_cols);
        assert_int_equal(rows.view[k].n_entries, rows2.view[k].n_entries);
        for (uint32_t e = 0; e < rows.view[k].n_entries; e++)
            for (uint32_t q = 0; q < B; q++)
                for (uint32_t kk = 0; kk < B; kk++) {
                    double a = mf_row_tile_value(&rows.view[k], e, q, kk);
                    double b = mf_row_tile_value(&rows2.view[k], e, q, kk);
                    /* the float LSE may move P across one fp16 rounding step */
                    assert_true(fabs(a - b) <= 0x1p-10 * a + 0x1p-24);
                }
    }
    free(lse);
    free(p);
    tk_rows_free(&rows);
    tk_rows_free(&rows2);
    fixture_free(&f);
}

/* GQA (Hq = 4·Hkv): head h's masses follow KV head h / 4; check against scores built
 * here by hand, not through the library's GQA indexing. */
static void test_gqa(void **state)
{
    (void)state;
    fixture_t f;
    tk_rows_t rows;
    fixture_init(&f, 8, 2, 14);
    f.a.codec = MF_CODEC_BF16;
    f.a.i0 = NB - 2;
    assert_int_equal(tk_extract(&f.a, &rows), MF_OK);
    const mf_row_view_t *v = &rows.view[1];
    uint32_t i = NB - 1;
    for (uint32_t h = 0; h < 8; h++) {
        uint32_t kv = h / 4;
        double s[N];
        for (uint32_t q = 0; q < B; q += 5) {
            uint32_t r = i * B + q;
            double mx = -INFINITY, sum = 0;
            for (uint32_t key = 0; key <= r; key++) {
                double dot = 0;
                for (uint32_t x = 0; x < D; x++)
                    dot += (double)f.q[((size_t)r * 8 + h) * D + x] *
                           f.k[((size_t)key * 2 + kv) * D + x];
                s[key] = dot / sqrt((double)D);
                mx = s[key] > mx ? s[key] : mx;
            }
            for (uint32_t key = 0; key <= r; key++)
                sum += exp(s[key] - mx);
            for (uint32_t key = 0; key <= r; key += 7) {
                double want = exp(s[key] - mx) / sum;
                int e = entry_of(v, key / B, h);
                assert_true(e >= 0);
                double got = mf_row_tile_value(v, (uint32_t)e, q, key % B);
                assert_true(fabs(got - want) <= want * 0x1p-8 + 1e-30);
            }
        }
    }
    tk_rows_free(&rows);
    fixture_free(&f);
}

/* Row headers: hash/parent are the DESIGN §4 prefix hashes; tokens, model, layer. */
static void test_row_headers(void **state)
{
    (void)state;
    fixture_t f;
    tk_rows_t rows;
    fixture_init(&f, 2, 2, 15);
    f.a.codec = MF_CODEC_U8_LOG;
    f.a.top_p = 0.7f;
    assert_int_equal(tk_extract(&f.a, &rows), MF_OK);
    mf_hash128_t h[NB];
    size_t nh;
    assert_int_equal(mf_hash_prefix("tenant-a", "src-model", B, f.tokens, N, h, NB, &nh), MF_OK);
    assert_int_equal(nh, NB);
    mf_hash128_t root = mf_hash_root(B, "tenant-a", 8, "src-model", 9);
    for (uint32_t i = 0; i < NB; i++) {
        const mf_row_view_t *v = &rows.view[i];
        assert_true(mf_hash_eq(v->hash, h[i]));
        assert_true(mf_hash_eq(v->parent, i ? h[i - 1] : root));
        assert_memory_equal(v->tokens, f.tokens + i * B, B * sizeof(uint32_t));
        assert_int_equal(v->layer, 3);
        assert_int_equal(v->model_len, 9);
        assert_memory_equal(v->model, "src-model", 9);
        assert_int_equal(v->codec, MF_CODEC_U8_LOG);
        assert_non_null(v->scales);
    }
    tk_rows_free(&rows);
    fixture_free(&f);
}

/* f16 and bf16 inputs give the same rows as f32 inputs holding the same values. */
static void test_dtypes(void **state)
{
    (void)state;
    fixture_t f;
    fixture_init(&f, 2, 1, 16);
    f.a.codec = MF_CODEC_FP8_E4M3;
    f.a.top_p = 0.9f;
    f.a.i0 = 5;
    f.a.i1 = 8;
    size_t nq = (size_t)N * 2 * D, nk = (size_t)N * D;
    uint16_t *q16 = malloc(nq * 2), *k16 = malloc(nk * 2);
    for (int dt = MF_DTYPE_F16; dt <= MF_DTYPE_BF16; dt++) {
        for (size_t x = 0; x < nq; x++) {
            q16[x] = dt == MF_DTYPE_F16 ? mf_f32_to_f16(f.q[x]) : mf_f32_to_bf16(f.q[x]);
            f.q[x] = dt == MF_DTYPE_F16 ? mf_f16_to_f32(q16[x]) : mf_bf16_to_f32(q16[x]);
        }
        for (size_t x = 0; x < nk; x++) {
            k16[x] = dt == MF_DTYPE_F16 ? mf_f32_to_f16(f.k[x]) : mf_f32_to_bf16(f.k[x]);
            f.k[x] = dt == MF_DTYPE_F16 ? mf_f16_to_f32(k16[x]) : mf_bf16_to_f32(k16[x]);
        }
        tk_rows_t r32, r16;
        assert_int_equal(tk_extract(&f.a, &r32), MF_OK);
        mf_extract_args_t a16 = f.a;
        a16.src.q = q16;
        a16.src.k = k16;
        a16.src.dtype = (mf_dtype_t)dt;
        assert_int_equal(tk_extract(&a16, &r16), MF_OK);
        for (uint32_t k = 0; k < r32.n; k++) {
            assert_int_equal(r32.size[k], r16.size[k]);
            assert_memory_equal(r32.buf[k], r16.buf[k], r32.size[k]);
        }
        tk_rows_free(&r32);
        tk_rows_free(&r16);
    }
    free(q16);
    free(k16);
    fixture_free(&f);
}

/* Bad arguments fail with a status and a message; a short buffer says how much. */
static void test_errors(void **state)
{
    (void)state;
    fixture_t f;
    fixture_init(&f, 2, 2, 17);
    const char *why;
    uint32_t failed = 99;
    size_t cap = 64, size = 0;
    void *buf = aligned_alloc(16, 1 << 20);
    void *bufs[1] = { buf };
    mf_extract_args_t a = f.a;
    a.i0 = 4;
    a.i1 = 5;
    a.block_size = 24;
    assert_int_equal(mf_extract_ref(&a, bufs, &cap, &size, &failed, &why), MF_INVALID_ARGUMENT);
    assert_non_null(strstr(why, "power of two"));
    a = f.a;
    a.i0 = 4;
    a.i1 = NB + 1;
    assert_int_equal(mf_extract_ref(&a, bufs, &cap, &size, &failed, &why), MF_INVALID_ARGUMENT);
    a.i1 = 5;
    a.top_p = 0.0f;
    assert_int_equal(mf_extract_ref(&a, bufs, &cap, &size, &failed, &why), MF_INVALID_ARGUMENT);
    a.top_p = 1.0f;
    a.src.n_kv_heads = 3;
    assert_int_equal(mf_extract_ref(&a, bufs, &cap, &size, &failed, &why), MF_INVALID_ARGUMENT);
    a.src.n_kv_heads = 2;
    assert_int_equal(mf_extract_ref(&a, bufs, &cap, &size, &failed, &why),
                     MF_RESOURCE_EXHAUSTED);
    assert_int_equal(failed, 4);
    assert_true(size > cap);
    assert_true(size <= mf_extract_row_bound(a.codec, B, 2, 4, strlen(a.model)));
    cap = size;
    assert_int_equal(mf_extract_ref(&a, bufs, &cap, &size, &failed, &why), MF_OK);
    assert_int_equal(size, cap);
    mf_row_view_t v;
    assert_int_equal(mf_row_decode(buf, size, 0, &v, &why), MF_OK);
    assert_int_equal(mf_extract_row_bound(MF_CODEC_FP16, 12, 2, 4, 3), 0);
    free(buf);
    fixture_free(&f);
}

/* Float LSE [hq, N] of the fixture's source, as an engine would return it. */
static float *fixture_lse(const fixture_t *f, uint32_t hq)
{
    float *lse = malloc((size_t)hq * N * sizeof(float));
    double *p = malloc(N * sizeof(double));
    for (uint32_t h = 0; h < hq; h++)
        for (uint32_t r = 0; r < N; r++) {
            double l;
            assert_int_equal(mf_attention_row_ref(&f->a.src, h, r, p, &l), MF_OK);
            lse[(size_t)h * N + r] = (float)l;
        }
    free(p);
    return lse;
}

/* The sampled definition in float64, written out here from the dot products (not through
 * the library): mass[j] = mean over rows r = iB + off + m·stride of Σ_{k ∈ j, k ≤ r}
 * exp(s[r][k] − LSE[r]). */
static void sampled_mass(const fixture_t *f, const float *lse, uint32_t hq, uint32_t hkv,
                         uint32_t h, uint32_t i, uint32_t stride, uint32_t off, double *mass)
{
    memset(mass, 0, (i + 1) * sizeof(double));
    uint32_t kv = h / (hq / hkv);
    for (uint32_t q = off; q < B; q += stride) {
        uint32_t r = i * B + q;
        for (uint32_t key = 0; key <= r; key++) {
            double dot = 0;
            for (uint32_t x = 0; x < D; x++)
                dot += (double)f->q[((size_t)r * hq + h) * D + x] *
                       f->k[((size_t)key * hkv + kv) * D + x];
            mass[key / B] += exp(dot / sqrt((double)D) - lse[(size_t)h * N + r]);
        }
    }
    for (uint32_t j = 0; j <= i; j++)
        mass[j] /= B / stride;
}

/* Sample stride 1 (offset 0) is today's extract, byte for byte. */
static void test_sample_stride1(void **state)
{
    (void)state;
    fixture_t f;
    tk_rows_t r0, r1;
    fixture_init(&f, 4, 2, 18);
    f.a.codec = MF_CODEC_U8_LOG;
    f.a.top_p = 0.8f;
    assert_int_equal(tk_extract(&f.a, &r0), MF_OK);
    f.a.fields = MF_EXTRACT_SAMPLE;
    f.a.sample_stride = 1;
    f.a.sample_offset = 0;
    assert_int_equal(tk_extract(&f.a, &r1), MF_OK);
    for (uint32_t k = 0; k < r0.n; k++) {
        assert_int_equal(r0.size[k], r1.size[k]);
        assert_memory_equal(r0.buf[k], r1.buf[k], r0.size[k]);
    }
    tk_rows_free(&r0);
    tk_rows_free(&r1);
    fixture_free(&f);
}

/* Strides 2, 4, B with random offsets and the engine's LSE: at Top-P 1 the mass bytes
 * decode to the float64 sampled masses; at Top-P < 1 each kept set is the one
 * mf_topp_select picks from those masses; the tiles of a prob codec are the exact
 * extract's (every row's P, not only the sampled ones). */
static void test_sample_masses(void **state)
{
    (void)state;
    const uint32_t strides[] = { 2, 4, B };
    fixture_t f;
    fixture_init(&f, 4, 2, 19);
    float *lse = fixture_lse(&f, 4);
    mf_rng_t rng;
    mf_rng_seed(&rng, 190);
    double mass[NB];
    uint8_t keep[NB];
    int differs = 0;
    for (size_t x = 0; x < sizeof strides / sizeof strides[0]; x++) {
        uint32_t st = strides[x], off = (uint32_t)(mf_rng_u64(&rng) % st);
        tk_rows_t rows;
        f.a.lse = lse;
        f.a.fields = MF_EXTRACT_SAMPLE;
        f.a.sample_stride = st;
        f.a.sample_offset = off;
        f.a.top_p = 1.0f;
        f.a.codec = MF_CODEC_MASK;
        assert_int_equal(tk_extract(&f.a, &rows), MF_OK);
        for (uint32_t i = 0; i < NB; i++)
            for (uint32_t h = 0; h < 4; h++) {
                double exact[NB];
                sampled_mass(&f, lse, 4, 2, h, i, st, off, mass);
                tk_block_mass(&f.a.src, h, i, B, exact);
                for (uint32_t j = 0; j <= i; j++) {
                    int e = entry_of(&rows.view[i], j, h);
                    assert_true(e >= 0);
                    double got = mf_row_mass(&rows.view[i], (uint32_t)e);
                    double bound = sqrt(mass[j]) / 255.0 + 1.0 / (255.0 * 255.0) + 1e-9;
                    assert_true(fabs(got - mass[j]) <= bound);
                    differs |= fabs(mass[j] - exact[j]) > 1e-3;
                }
            }
        tk_rows_free(&rows);
        f.a.top_p = 0.85f;
        assert_int_equal(tk_extract(&f.a, &rows), MF_OK);
        for (uint32_t i = 0; i < NB; i++)
            for (uint32_t h = 0; h < 4; h++) {
                uint32_t n_kept;
                sampled_mass(&f, lse, 4, 2, h, i, st, off, mass);
                assert_int_equal(mf_topp_select(mass, NULL, i + 1, 0.85f, keep, &n_kept), MF_OK);
                for (uint32_t j = 0; j <= i; j++)
                    assert_int_equal(entry_of(&rows.view[i], j, h) >= 0, keep[j]);
            }
        tk_rows_free(&rows);
        /* Prob tiles: same as the unsampled extract's for the same (i, j, h), with the LSE
         * given and computed (the unsampled rows' LSE still comes from somewhere). */
        for (int given = 0; given < 2; given++) {
            tk_rows_t rs, re;
            f.a.lse = given ? lse : NULL;
            f.a.codec = MF_CODEC_FP16;
            f.a.top_p = 1.0f;
            f.a.i0 = NB - 3;
            assert_int_equal(tk_extract(&f.a, &rs), MF_OK);
            f.a.fields = 0;
            assert_int_equal(tk_extract(&f.a, &re), MF_OK);
            f.a.fields = MF_EXTRACT_SAMPLE;
            for (uint32_t k = 0; k < rs.n; k++) {
                const mf_row_view_t *a = &rs.view[k], *b = &re.view[k];
                assert_int_equal(a->n_entries, b->n_entries);
                size_t tb = (size_t)B * B * 2;
                assert_memory_equal(a->tiles, b->tiles, tb * a->n_entries);
            }
            tk_rows_free(&rs);
            tk_rows_free(&re);
            f.a.i0 = 0;
        }
    }
    /* a sample is an approximation: if it equalled the exact masses the test shows nothing */
    assert_true(differs);
    free(lse);
    fixture_free(&f);
}

/* Bad sampling options fail with MF_INVALID_ARGUMENT and say why; without the field bit
 * the stride is not read. */
static void test_sample_errors(void **state)
{
    (void)state;
    fixture_t f;
    fixture_init(&f, 2, 2, 20);
    const struct {
        uint32_t fields, stride, offset;
        const char *msg;
    } bad[] = {
        { MF_EXTRACT_SAMPLE, 0, 0, "sample_stride" },
        { MF_EXTRACT_SAMPLE, 3, 0, "sample_stride" },
        { MF_EXTRACT_SAMPLE, 2 * B, 0, "sample_stride" },
        { MF_EXTRACT_SAMPLE, UINT32_MAX, 0, "sample_stride" },
        { MF_EXTRACT_SAMPLE, 4, 4, "sample_offset" },
        { 0x80u, 1, 0, "option bits" },
    };
    const char *why;
    uint32_t failed;
    size_t cap = 1 << 20, size;
    void *buf = aligned_alloc(16, cap);
    void *bufs[1] = { buf };
    f.a.i0 = 3;
    f.a.i1 = 4;
    for (size_t x = 0; x < sizeof bad / sizeof bad[0]; x++) {
        mf_extract_args_t a = f.a;
        a.fields = bad[x].fields;
        a.sample_stride = bad[x].stride;
        a.sample_offset = bad[x].offset;
        why = NULL;
        assert_int_equal(mf_extract_ref(&a, bufs, &cap, &size, &failed, &why),
                         MF_INVALID_ARGUMENT);
        assert_non_null(why);
        assert_non_null(strstr(why, bad[x].msg));
    }
    f.a.fields = 0;
    f.a.sample_stride = 3; /* ignored: not named in fields */
    assert_int_equal(mf_extract_ref(&f.a, bufs, &cap, &size, &failed, &why), MF_OK);
    uint32_t st, off;
    assert_int_equal(mf_extract_options(MF_EXTRACT_SAMPLE, 8, 5, B, &st, &off, &why), MF_OK);
    assert_int_equal(st, 8);
    assert_int_equal(off, 5);
    assert_int_equal(mf_extract_options(0, 8, 5, B, &st, &off, &why), MF_OK);
    assert_int_equal(st, 1);
    assert_int_equal(off, 0);
    free(buf);
    fixture_free(&f);
}

/* mf_topp_select on hand-made masses: ties go to the lower block, candidates only. */
static void test_topp_select_unit(void **state)
{
    (void)state;
    const double m[6] = { 0.05, 0.2, 0.3, 0.2, 0.05, 0.2 };
    uint8_t keep[6], cand[6] = { 1, 1, 0, 1, 1, 1 };
    uint32_t n;
    assert_int_equal(mf_topp_select(m, NULL, 6, 0.6, keep, &n), MF_OK);
    /* forced 0 (0.05) + 5 (0.2) = 0.25; + 2 (0.3) = 0.55; + 1 (0.2, lower j than 3) */
    const uint8_t want[6] = { 1, 1, 1, 0, 0, 1 };
    assert_memory_equal(keep, want, 6);
    assert_int_equal(n, 4);
    assert_int_equal(mf_topp_select(m, cand, 6, 0.6, keep, &n), MF_OK);
    /* total over candidates 0.7 → target 0.42: 0.25 + 0.2 (j=1) = 0.45 */
    const uint8_t want2[6] = { 1, 1, 0, 0, 0, 1 };
    assert_memory_equal(keep, want2, 6);
    assert_int_equal(mf_topp_select(m, cand, 6, 1.0, keep, &n), MF_OK);
    const uint8_t want3[6] = { 1, 1, 0, 1, 1, 1 };
    assert_memory_equal(keep, want3, 6);
    assert_int_equal(n, 5);
    assert_int_equal(mf_topp_select(m, NULL, 1, 0.5, keep, &n), MF_OK);
    assert_int_equal(n, 1);
    assert_int_equal(mf_topp_select(m, NULL, 0, 0.5, keep, &n), MF_INVALID_ARGUMENT);
    assert_int_equal(mf_topp_select(m, NULL, 6, 0.0, keep, &n), MF_INVALID_ARGUMENT);
}

/* The put path's row copy (mf_rows_copy_ref, the spec of mf_rows_copy_cuda): random sizes
 * and gaps, destinations in reverse order; each row lands, nothing else changes; bad tables
 * are refused with nothing copied. */
static void test_rows_copy(void **state)
{
    (void)state;
    enum { R = 37 };
    mf_rng_t rng;
    mf_rng_seed(&rng, 0x5eed ^ (uint64_t)R);
    size_t sizes[R], so[R], dof[R], st = 0, dt = 0;
    for (int x = 0; x < R; x++) {
        sizes[x] = x % 9 == 0 ? 0 : 1 + mf_rng_u64(&rng) % 900;
        st += mf_rng_u64(&rng) % 17;
        so[x] = st;
        st += sizes[x];
    }
    for (int x = R - 1; x >= 0; x--) {
        dt += mf_rng_u64(&rng) % 17;
        dof[x] = dt;
        dt += sizes[x];
    }
    uint8_t *src = malloc(st + 1), *dst = malloc(dt + 1), *want = malloc(dt + 1);
    assert_non_null(src);
    assert_non_null(dst);
    assert_non_null(want);
    for (size_t x = 0; x <= st; x++)
        src[x] = (uint8_t)mf_rng_u64(&rng);
    memset(dst, 0x5a, dt + 1);
    memset(want, 0x5a, dt + 1);
    void *dp[R];
    const void *sp[R];
    for (int x = 0; x < R; x++) {
        dp[x] = dst + dof[x];
        sp[x] = src + so[x];
        for (size_t y = 0; y < sizes[x]; y++)
            want[dof[x] + y] = src[so[x] + y];
    }
    const char *why = "";
    assert_int_equal(mf_rows_copy_ref(dp, sp, sizes, R, &why), MF_OK);
    assert_memory_equal(dst, want, dt + 1);
    size_t mx = 0;
    assert_int_equal(mf_rows_copy_check(dp, sp, sizes, R, &mx, &why), MF_OK);
    size_t big = 0;
    for (int x = 0; x < R; x++)
        big = sizes[x] > big ? sizes[x] : big;
    assert_int_equal(mx, big);
    memset(dst, 0x5a, dt + 1);
    void *d1[1] = { dst };
    const void *s1[1] = { dst + 8 }, *s0[1] = { NULL }, *s2[1] = { src };
    size_t z1[1] = { 16 }, zbig[1] = { (size_t)MF_ROW_MAX_BYTES + 1 };
    why = "";
    assert_int_equal(mf_rows_copy_ref(d1, s1, z1, 1, &why), MF_INVALID_ARGUMENT); /* overlap */
    assert_true(*why);
    assert_int_equal(mf_rows_copy_ref(d1, s0, z1, 1, &why), MF_INVALID_ARGUMENT);
    assert_int_equal(mf_rows_copy_ref(d1, s2, zbig, 1, &why), MF_INVALID_ARGUMENT);
    assert_int_equal(mf_rows_copy_ref(NULL, s2, z1, 1, &why), MF_INVALID_ARGUMENT);
    assert_int_equal(mf_rows_copy_ref(d1, s2, z1, MF_ROWS_COPY_MAX + 1, &why),
                     MF_INVALID_ARGUMENT);
    for (size_t x = 0; x <= dt; x++)
        assert_int_equal(dst[x], 0x5a);
    assert_int_equal(mf_rows_copy_ref(NULL, NULL, NULL, 0, &why), MF_OK);
    free(src);
    free(dst);
    free(want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_masses_topp1),   cmocka_unit_test(test_topp_minimal),
        cmocka_unit_test(test_tiles_and_lse),  cmocka_unit_test(test_gqa),
        cmocka_unit_test(test_row_headers),    cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_errors),         cmocka_unit_test(test_topp_select_unit),
        cmocka_unit_test(test_sample_stride1), cmocka_unit_test(test_sample_masses),
        cmocka_unit_test(test_sample_errors),  cmocka_unit_test(test_rows_copy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
