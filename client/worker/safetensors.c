/* safetensors — see safetensors.h. The JSON reader knows only the header's shape: one
 * object of tensor entries {dtype, shape, data_offsets} and an optional __metadata__
 * object of strings; anything else is an error. */
#include "safetensors.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_codec.h"

typedef enum { ST_F32, ST_F16, ST_BF16 } st_dtype_t;

typedef struct st_tensor {
    char *name;
    st_dtype_t dtype;
    uint32_t ndim;
    uint64_t shape[MFW_ST_MAX_DIMS];
    uint64_t begin, end;     /* byte range inside the data section */
} st_tensor_t;

struct mfw_st {
    uint8_t *file;
    const uint8_t *data;
    uint64_t data_len;
    st_tensor_t *t;
    uint32_t n;
    char **meta;             /* key, value, key, value ... */
    uint32_t n_meta;
};

typedef struct parser {
    const char *p, *end, *name;
    char *err;
    size_t errlen;
} parser_t;

static mf_status_t fail(parser_t *ps, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (ps->err && ps->errlen)
        snprintf(ps->err, ps->errlen, "%s: %s", ps->name, msg);
    return MF_INVALID_ARGUMENT;
}

static void skip_ws(parser_t *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\n' || *ps->p == '\t' || *ps->p == '\r'))
        ps->p++;
}

static int eat(parser_t *ps, char c)
{
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == c) {
        ps->p++;
        return 1;
    }
    return 0;
}

/* A JSON string into a new buffer; \uXXXX outside ASCII becomes '?' (names are ASCII). */
static mf_status_t parse_string(parser_t *ps, char **out)
{
    if (!eat(ps, '"'))
        return fail(ps, "header: string expected");
    const char *s = ps->p;
    size_t cap = 0;
    while (s < ps->end && *s != '"') {
        s += *s == '\\' ? 2 : 1;
        cap++;
    }
    if (s >= ps->end)
        return fail(ps, "header: unterminated string");
    char *buf = malloc(cap + 1), *w = buf;
    if (!buf)
        return MF_RESOURCE_EXHAUSTED;
    while (*ps->p != '"') {
        char c = *ps->p++;
        if (c == '\\') {
            c = *ps->p++;
            switch (c) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': {
                unsigned v = 0;
                for (int k = 0; k < 4; k++, ps->p++) {
                    char h = ps->p < ps->end ? *ps->p : 0;
                    int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                          : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                    if (d < 0) {
                        free(buf);
                        return fail(ps, "header: bad \\u escape");
                    }
                    v = v * 16 + (unsigned)d;
                }
                c = v < 128 && v > 0 ? (char)v : '?';
                break;
            }
            default: break; /* \" \\ \/ */
            }
        }
        *w++ = c;
    }
    ps->p++;
    *w = 0;
    *out = buf;
    return MF_OK;
}

static mf_status_t parse_u64(parser_t *ps, uint64_t *out)
{
    skip_ws(ps);
    uint64_t v = 0;
    const char *s = ps->p;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        if (v > (UINT64_MAX - 9) / 10)
            return fail(ps, "header: number too large");
        v = v * 10 + (uint64_t)(*ps->p++ - '0');
    }
    if (ps->p == s)
        return fail(ps, "header: unsigned integer expected");
    *out = v;
    return MF_OK;
}

/* [u64, ...] with at most max entries. */
static mf_status_t parse_u64_array(parser_t *ps, uint64_t *v, uint32_t max, uint32_t *n)
{
    *n = 0;
    if (!eat(ps, '['))
        return fail(ps, "header: array expected");
    if (eat(ps, ']'))
        return MF_OK;
    do {
        if (*n == max)
            return fail(ps, "header: array longer than %u", max);
        mf_status_t st = parse_u64(ps, &v[(*n)++]);
        if (st != MF_OK)
            return st;
    } while (eat(ps, ','));
    return eat(ps, ']') ? MF_OK : fail(ps, "header: ']' expected");
}

static mf_status_t parse_tensor(parser_t *ps, st_tensor_t *t)
{
    int have = 0;
    if (!eat(ps, '{'))
        return fail(ps, "tensor '%s': object expected", t->name);
    do {
        char *key = NULL;
        mf_status_t st = parse_string(ps, &key);
        if (st != MF_OK)
            return st;
        if (!eat(ps, ':')) {
            free(key);
            return fail(ps, "header: ':' expected");
        }
        if (!strcmp(key, "dtype")) {
            char *dt = NULL;
            st = parse_string(ps, &dt);
            if (st == MF_OK) {
                if (!strcmp(dt, "F32"))
                    t->dtype = ST_F32;
                else if (!strcmp(dt, "F16"))
                    t->dtype = ST_F16;
                else if (!strcmp(dt, "BF16"))
                    t->dtype = ST_BF16;
                else
                    st = fail(ps, "tensor '%s': dtype %s not supported (F32, F16, BF16)",
                              t->name, dt);
                free(dt);
            }
            have |= 1;
        } else if (!strcmp(key, "shape")) {
            st = parse_u64_array(ps, t->shape, MFW_ST_MAX_DIMS, &t->ndim);
            have |= 2;
        } else if (!strcmp(key, "data_offsets")) {
            uint64_t off[2];
            uint32_t n = 0;
            st = parse_u64_array(ps, off, 2, &n);
            if (st == MF_OK && (n != 2 || off[1] < off[0]))
                st = fail(ps, "tensor '%s': bad data_offsets", t->name);
            t->begin = off[0];
            t->end = off[1];
            have |= 4;
        } else {
            st = fail(ps, "tensor '%s': unknown field '%s'", t->name, key);
        }
        free(key);
        if (st != MF_OK)
            return st;
    } while (eat(ps, ','));
    if (!eat(ps, '}'))
        return fail(ps, "tensor '%s': '}' expected", t->name);
    return have == 7 ? MF_OK : fail(ps, "tensor '%s': dtype, shape or data_offsets missing", t->name);
}

static mf_status_t parse_meta(parser_t *ps, mfw_st_t *st)
{
    if (!eat(ps, '{'))
        return fail(ps, "__metadata__: object expected");
    if (eat(ps, '}'))
        return MF_OK;
    do {
        if (st->n_meta == 256)
            return fail(ps, "__metadata__: more than 256 keys");
        char **kv = realloc(st->meta, sizeof(char *) * 2 * (st->n_meta + 1));
        if (!kv)
            return MF_RESOURCE_EXHAUSTED;
        st->meta = kv;
        kv[2 * st->n_meta] = kv[2 * st->n_meta + 1] = NULL;
        st->n_meta++;
        mf_status_t s = parse_string(ps, &kv[2 * st->n_meta - 2]);
        if (s != MF_OK)
            return s;
        if (!eat(ps, ':'))
            return fail(ps, "__metadata__: ':' expected");
        if ((s = parse_string(ps, &kv[2 * st->n_meta - 1])) != MF_OK)
            return s;
    } while (eat(ps, ','));
    return eat(ps, '}') ? MF_OK : fail(ps, "__metadata__: '}' expected");
}

static size_t dtype_size(st_dtype_t d)
{
    return d == ST_F32 ? 4 : 2;
}

static mf_status_t parse_header(parser_t *ps, mfw_st_t *st)
{
    if (!eat(ps, '{'))
        return fail(ps, "header: object expected");
    if (eat(ps, '}'))
        return MF_OK;
    do {
        char *key = NULL;
        mf_status_t s = parse_string(ps, &key);
        if (s != MF_OK)
            return s;
        if (!eat(ps, ':')) {
            free(key);
            return fail(ps, "header: ':' expected");
        }
        if (!strcmp(key, "__metadata__")) {
            free(key);
            if ((s = parse_meta(ps, st)) != MF_OK)
                return s;
            continue;
        }
        if (st->n == MFW_ST_MAX_TENSORS) {
            free(key);
            return fail(ps, "more than %u tensors", MFW_ST_MAX_TENSORS);
        }
        st_tensor_t *t = &st->t[st->n++];
        t->name = key;
        if ((s = parse_tensor(ps, t)) != MF_OK)
            return s;
        uint64_t elems = 1;
        for (uint32_t d = 0; d < t->ndim; d++) {
            if (t->shape[d] != 0 && elems > MFW_ST_MAX_FILE / t->shape[d])
                return fail(ps, "tensor '%s': shape too large", t->name);
            elems *= t->shape[d];
        }
        if (t->end > st->data_len || t->end - t->begin != elems * dtype_size(t->dtype))
            return fail(ps, "tensor '%s': bytes [%llu, %llu) do not fit its shape or the %llu data bytes",
                        t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
                        (unsigned long long)st->data_len);
    } while (eat(ps, ','));
    if (!eat(ps, '}'))
        return fail(ps, "header: '}' expected");
    skip_ws(ps);
    return ps->p == ps->end ? MF_OK : fail(ps, "header: bytes after the object");
}

mf_status_t mfw_st_parse(const void *buf, size_t len, const char *name, mfw_st_t **out,
                         char *err, size_t errlen)
{
    parser_t ps = { .name = name, .err = err, .errlen = errlen };
    *out = NULL;
    if (len < 8 || len > MFW_ST_MAX_FILE)
        return fail(&ps, "%zu bytes: not a safetensors file (8 B .. 1 GiB)", len);
    uint64_t hlen = 0;
    for (int k = 7; k >= 0; k--)
        hlen = hlen << 8 | ((const uint8_t *)buf)[k];
    if (hlen > MFW_ST_MAX_HEADER || hlen > len - 8)
        return fail(&ps, "header length %llu does not fit (file %zu bytes, max %u)",
                    (unsigned long long)hlen, len, MFW_ST_MAX_HEADER);
    mfw_st_t *st = calloc(1, sizeof *st);
    if (!st)
        return MF_RESOURCE_EXHAUSTED;
    st->file = malloc(len);
    st->t = calloc(MFW_ST_MAX_TENSORS, sizeof(st_tensor_t));
    if (!st->file || !st->t) {
        mfw_st_close(st);
        return MF_RESOURCE_EXHAUSTED;
    }
    memcpy(st->file, buf, len);
    st->data = st->file + 8 + hlen;
    st->data_len = len - 8 - hlen;
    ps.p = (const char *)st->file + 8;
    ps.end = ps.p + hlen;
    mf_status_t s = parse_header(&ps, st);
    if (s != MF_OK) {
        mfw_st_close(st);
        return s;
    }
    *out = st;
    return MF_OK;
}

mf_status_t mfw_st_open(const char *path, mfw_st_t **out, char *err, size_t errlen)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return MF_NOT_FOUND;
    }
    mf_status_t st = MF_OK;
    long len = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    void *buf = NULL;
    if (len < 0 || (unsigned long long)len > MFW_ST_MAX_FILE) {
        snprintf(err, errlen, "%s: size %ld not in [0, 1 GiB]", path, len);
        st = MF_INVALID_ARGUMENT;
    } else if (!(buf = malloc((size_t)len + 1))) {
        st = MF_RESOURCE_EXHAUSTED;
    } else if (fseek(f, 0, SEEK_SET) != 0 || fread(buf, 1, (size_t)len, f) != (size_t)len) {
        snprintf(err, errlen, "%s: short read", path);
        st = MF_DATA_LOSS;
    } else {
        st = mfw_st_parse(buf, (size_t)len, path, out, err, errlen);
    }
    free(buf);
    fclose(f);
    return st;
}

void mfw_st_close(mfw_st_t *st)
{
    if (!st)
        return;
    for (uint32_t i = 0; i < st->n; i++)
        free(st->t[i].name);
    for (uint32_t i = 0; i < 2 * st->n_meta; i++)
        free(st->meta[i]);
    free(st->meta);
    free(st->t);
    free(st->file);
    free(st);
}

const char *mfw_st_meta(const mfw_st_t *st, const char *key)
{
    for (uint32_t i = 0; i < st->n_meta; i++)
        if (st->meta[2 * i] && !strcmp(st->meta[2 * i], key))
            return st->meta[2 * i + 1];
    return NULL;
}

mf_status_t mfw_st_tensor(const mfw_st_t *st, const char *name, uint32_t ndim,
                          const uint64_t *shape, float **out, char *err, size_t errlen)
{
    *out = NULL;
    const st_tensor_t *t = NULL;
    for (uint32_t i = 0; i < st->n && !t; i++)
        if (!strcmp(st->t[i].name, name))
            t = &st->t[i];
    if (!t) {
        snprintf(err, errlen, "tensor '%s' missing", name);
        return MF_NOT_FOUND;
    }
    int same = t->ndim == ndim;
    for (uint32_t d = 0; same && d < ndim; d++)
        same = t->shape[d] == shape[d];
    if (!same) {
        snprintf(err, errlen, "tensor '%s': shape differs from the model config (%u dims, first %llu)",
                 name, t->ndim, (unsigned long long)(t->ndim ? t->shape[0] : 0));
        return MF_INVALID_ARGUMENT;
    }
    size_t n = (size_t)((t->end - t->begin) / dtype_size(t->dtype));
    float *f = malloc(sizeof(float) * (n ? n : 1));
    if (!f)
        return MF_RESOURCE_EXHAUSTED;
    const uint8_t *src = st->data + t->begin;
    for (size_t i = 0; i < n; i++) {
        if (t->dtype == ST_F32) {
            memcpy(&f[i], src + 4 * i, 4);
        } else {
            uint16_t h = (uint16_t)(src[2 * i] | src[2 * i + 1] << 8);
            f[i] = t->dtype == ST_F16 ? mf_f16_to_f32(h) : mf_bf16_to_f32(h);
        }
    }
    *out = f;
    return MF_OK;
}
