/* npy — strict .npy reader / writer (see npy.h). The header is a Python dict literal;
 * this parses exactly the subset numpy writes: {'key': value, ...} with string, bool and
 * integer-tuple values, and rejects everything else. */
#include "npy.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mf_codec.h"

static mf_status_t fail(mf_status_t st, char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return st;
}

typedef struct cursor {
    const char *p, *end;
} cursor_t;

static void skip_ws(cursor_t *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t'))
        c->p++;
}

static int eat(cursor_t *c, char ch)
{
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

/* A quoted string (no escapes: numpy never writes any in these keys/values). */
static int parse_str(cursor_t *c, char *out, size_t cap)
{
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
        return 0;
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || n + 1 >= cap)
            return 0;
        out[n++] = *c->p++;
    }
    if (c->p >= c->end)
        return 0;
    c->p++;
    out[n] = 0;
    return 1;
}

static int parse_u64(cursor_t *c, uint64_t *v)
{
    skip_ws(c);
    if (c->p >= c->end || !isdigit((unsigned char)*c->p))
        return 0;
    uint64_t x = 0;
    while (c->p < c->end && isdigit((unsigned char)*c->p)) {
        if (x > (UINT64_MAX - 9) / 10)
            return 0;
        x = x * 10 + (uint64_t)(*c->p++ - '0');
    }
    if (c->p < c->end && *c->p == 'L') /* Python 2 longs */
        c->p++;
    *v = x;
    return 1;
}

static int parse_word(cursor_t *c, const char *w)
{
    size_t n = strlen(w);
    skip_ws(c);
    if ((size_t)(c->end - c->p) >= n && memcmp(c->p, w, n) == 0) {
        c->p += n;
        return 1;
    }
    return 0;
}

static mf_status_t parse_dict(cursor_t *c, uint64_t max_elems, mf_npy_header_t *h, char *err,
                              size_t errlen)
{
    int have_descr = 0, have_order = 0, have_shape = 0;
    char key[32], val[32];
    if (!eat(c, '{'))
        return fail(MF_INVALID_ARGUMENT, err, errlen, "header is not a dict");
    while (!eat(c, '}')) {
        if (!parse_str(c, key, sizeof key) || !eat(c, ':'))
            return fail(MF_INVALID_ARGUMENT, err, errlen, "header: malformed key");
        if (strcmp(key, "descr") == 0) {
            if (!parse_str(c, val, sizeof val))
                return fail(MF_INVALID_ARGUMENT, err, errlen, "header: descr is not a string");
            if (strcmp(val, "<f4") == 0)
                h->dtype = MF_NPY_F32;
            else if (strcmp(val, "<f2") == 0)
                h->dtype = MF_NPY_F16;
            else
                return fail(MF_INVALID_ARGUMENT, err, errlen,
                            "dtype '%s' not supported (need <f4 or <f2)", val);
            have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (parse_word(c, "True"))
                return fail(MF_INVALID_ARGUMENT, err, errlen,
                            "fortran_order arrays not supported (save in C order)");
            if (!parse_word(c, "False"))
                return fail(MF_INVALID_ARGUMENT, err, errlen, "header: bad fortran_order");
            have_order = 1;
        } else if (strcmp(key, "shape") == 0) {
            if (!eat(c, '('))
                return fail(MF_INVALID_ARGUMENT, err, errlen, "header: shape is not a tuple");
            h->ndim = 0;
            h->n_elems = 1;
            while (!eat(c, ')')) {
                uint64_t dim;
                if (h->ndim >= MF_NPY_MAX_DIMS)
                    return fail(MF_INVALID_ARGUMENT, err, errlen, "more than %d dimensions",
                                MF_NPY_MAX_DIMS);
                if (!parse_u64(c, &dim))
                    return fail(MF_INVALID_ARGUMENT, err, errlen, "header: bad shape entry");
                if (dim && h->n_elems > max_elems / dim)
                    return fail(MF_OUT_OF_RANGE, err, errlen,
                                "array larger than the limit of %llu elements",
                                (unsigned long long)max_elems);
                h->n_elems *= dim;
                h->shape[h->ndim++] = dim;
                if (!eat(c, ',')) {
                    if (!eat(c, ')'))
                        return fail(MF_INVALID_ARGUMENT, err, errlen, "header: bad shape");
                    break;
                }
            }
            have_shape = 1;
        } else {
            return fail(MF_INVALID_ARGUMENT, err, errlen, "header: unknown key '%s'", key);
        }
        if (!eat(c, ',')) {
            if (!eat(c, '}'))
                return fail(MF_INVALID_ARGUMENT, err, errlen, "header: expected ',' or '}'");
            break;
        }
    }
    if (!have_descr || !have_order || !have_shape)
        return fail(MF_INVALID_ARGUMENT, err, errlen,
                    "header lacks descr, fortran_order or shape");
    if (h->n_elems > max_elems)
        return fail(MF_OUT_OF_RANGE, err, errlen, "array larger than the limit");
    return MF_OK;
}

mf_status_t mf_npy_parse_header(const void *buf, size_t len, uint64_t max_elems,
                                mf_npy_header_t *h, char *err, size_t errlen)
{
    const uint8_t *b = buf;
    if (!buf || !h)
        return fail(MF_INVALID_ARGUMENT, err, errlen, "null argument");
    memset(h, 0, sizeof(*h));
    if (len < 10 || memcmp(b, "\x93NUMPY", 6) != 0)
        return fail(MF_INVALID_ARGUMENT, err, errlen, "not a .npy file (bad magic)");
    size_t hlen, pre;
    if (b[6] == 1) {
        hlen = (size_t)b[8] | (size_t)b[9] << 8;
        pre = 10;
    } else if (b[6] == 2 || b[6] == 3) {
        if (len < 12)
            return fail(MF_INVALID_ARGUMENT, err, errlen, "truncated header");
        hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
        pre = 12;
    } else {
        return fail(MF_INVALID_ARGUMENT, err, errlen, "unsupported .npy version %u", b[6]);
    }
    if (hlen > MF_NPY_MAX_HEADER)
        return fail(MF_INVALID_ARGUMENT, err, errlen, "header longer than 64 KiB");
    if (len < pre + hlen)
        return fail(MF_INVALID_ARGUMENT, err, errlen, "truncated header");
    cursor_t c = { (const char *)b + pre, (const char *)b + pre + hlen };
    mf_status_t st = parse_dict(&c, max_elems, h, err, errlen);
    if (st != MF_OK)
        return st;
    while (c.p < c.end && (*c.p == ' ' || *c.p == '\n'))
        c.p++;
    if (c.p != c.end)
        return fail(MF_INVALID_ARGUMENT, err, errlen, "header: trailing bytes after the dict");
    h->data_offset = pre + hlen;
    return MF_OK;
}

mf_status_t mf_npy_read(const char *path, uint64_t max_elems, mf_npy_t *out, char *err,
                        size_t errlen)
{
    uint8_t head[12 + MF_NPY_MAX_HEADER];
    struct stat sb;
    mf_status_t st;
    if (!path || !out)
        return fail(MF_INVALID_ARGUMENT, err, errlen, "null argument");
    memset(out, 0, sizeof(*out));
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(MF_NOT_FOUND, err, errlen, "%s: %s", path, strerror(errno));
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = fail(MF_INVALID_ARGUMENT, err, errlen, "%s: not a regular file", path);
        goto out_file;
    }
    size_t got = fread(head, 1, sizeof head, f);
    char why[200];
    st = mf_npy_parse_header(head, got, max_elems, &out->hdr, why, sizeof why);
    if (st != MF_OK) {
        fail(st, err, errlen, "%s: %s", path, why);
        goto out_file;
    }
    size_t esz = out->hdr.dtype == MF_NPY_F32 ? 4 : 2;
    uint64_t want = out->hdr.data_offset + out->hdr.n_elems * esz;
    if ((uint64_t)sb.st_size != want) {
        st = fail((uint64_t)sb.st_size < want ? MF_DATA_LOSS : MF_INVALID_ARGUMENT, err,
                  errlen, "%s: file is %llu bytes, header says %llu", path,
                  (unsigned long long)sb.st_size, (unsigned long long)want);
        goto out_file;
    }
    out->data = malloc(out->hdr.n_elems ? out->hdr.n_elems * sizeof(float) : 1);
    if (!out->data) {
        st = fail(MF_RESOURCE_EXHAUSTED, err, errlen, "%s: out of memory", path);
        goto out_file;
    }
    if (fseek(f, (long)out->hdr.data_offset, SEEK_SET) != 0) {
        st = fail(MF_DATA_LOSS, err, errlen, "%s: seek failed", path);
        goto out_data;
    }
    if (out->hdr.dtype == MF_NPY_F32) {
        if (fread(out->data, 4, out->hdr.n_elems, f) != out->hdr.n_elems) {
            st = fail(MF_DATA_LOSS, err, errlen, "%s: short read", path);
            goto out_data;
        }
    } else {
        uint16_t chunk[4096];
        for (uint64_t x = 0; x < out->hdr.n_elems;) {
            size_t n = out->hdr.n_elems - x < 4096 ? (size_t)(out->hdr.n_elems - x) : 4096;
            if (fread(chunk, 2, n, f) != n) {
                st = fail(MF_DATA_LOSS, err, errlen, "%s: short read", path);
                goto out_data;
            }
            for (size_t y = 0; y < n; y++)
                out->data[x + y] = mf_f16_to_f32(chunk[y]);
            x += n;
        }
    }
    fclose(f);
    return MF_OK;
out_data:
    free(out->data);
    out->data = NULL;
out_file:
    fclose(f);
    return st;
}

void mf_npy_free(mf_npy_t *a)
{
    if (a) {
        free(a->data);
        a->data = NULL;
    }
}

mf_status_t mf_npy_write(const char *path, mf_npy_dtype_t dtype, const float *data,
                         uint32_t ndim, const uint64_t *shape)
{
    char dict[512];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                     dtype == MF_NPY_F16 ? "<f2" : "<f4");
    uint64_t count = 1;
    if (!path || (!data && ndim) || ndim > MF_NPY_MAX_DIMS)
        return MF_INVALID_ARGUMENT;
    for (uint32_t k = 0; k < ndim; k++) {
        n += snprintf(dict + n, sizeof dict - (size_t)n, "%llu%s",
                      (unsigned long long)shape[k], ndim == 1 || k + 1 < ndim ? ", " : "");
        count *= shape[k];
    }
    n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
    /* Pad with spaces so the data starts 64-byte aligned; the header ends in '\n'. */
    size_t hlen = (size_t)n + 1;
    hlen += (64 - (10 + hlen) % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f)
        return MF_NOT_FOUND;
    uint8_t pre[10] = { 0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)hlen,
                        (uint8_t)(hlen >> 8) };
    int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(dict, 1, (size_t)n, f) == (size_t)n;
    for (size_t k = (size_t)n; ok && k + 1 < hlen; k++)
        ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF;
    for (uint64_t x = 0; ok && x < count; x++) {
        if (dtype == MF_NPY_F16) {
            uint16_t h = mf_f32_to_f16(data[x]);
            ok = fwrite(&h, 2, 1, f) == 1;
        } else {
            ok = fwrite(&data[x], 4, 1, f) == 1;
        }
    }
    if (fclose(f) != 0)
        ok = 0;
    return ok ? MF_OK : MF_DATA_LOSS;
}
