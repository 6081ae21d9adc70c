/* tokenizer — see tokenizer.h. */
#include "tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NO_RANK UINT32_MAX

struct mfw_tok {
    uint32_t n_merges;
    uint64_t *keys;          /* open addressing: (a << 32 | b) + 1, 0 = empty */
    uint32_t *ranks;
    uint32_t mask;
    char *bytes;             /* every token's bytes, back to back */
    size_t *off;             /* [vocab + 1] */
};

static uint64_t pair_key(uint32_t a, uint32_t b)
{
    return ((uint64_t)a << 32 | b) + 1;
}

static uint32_t slot_of(uint64_t key, uint32_t mask)
{
    return (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 32) & mask;
}

static uint32_t rank_of(const mfw_tok_t *t, uint32_t a, uint32_t b)
{
    uint64_t key = pair_key(a, b);
    for (uint32_t s = slot_of(key, t->mask);; s = (s + 1) & t->mask) {
        if (t->keys[s] == key)
            return t->ranks[s];
        if (t->keys[s] == 0)
            return NO_RANK;
    }
}

uint32_t mfw_tok_vocab(const mfw_tok_t *t)
{
    return 256 + t->n_merges;
}

void mfw_tok_free(mfw_tok_t *t)
{
    if (!t)
        return;
    free(t->keys);
    free(t->ranks);
    free(t->bytes);
    free(t->off);
    free(t);
}

mf_status_t mfw_tok_load(const char *path, mfw_tok_t **out, char *err, size_t errlen)
{
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return MF_NOT_FOUND;
    }
    mf_status_t st = MF_INVALID_ARGUMENT;
    unsigned version = 0, m = 0;
    mfw_tok_t *t = NULL;
    uint32_t *pairs = NULL;
    if (fscanf(f, "mapflow-bpe %u %u", &version, &m) != 2 || version != 1 ||
        m > MFW_TOK_MAX_MERGES) {
        snprintf(err, errlen, "%s: not a 'mapflow-bpe 1' file with at most %u merges", path,
                 MFW_TOK_MAX_MERGES);
        goto out_file;
    }
    st = MF_RESOURCE_EXHAUSTED;
    uint32_t cap = 1;
    while (cap < 2 * m + 2)
        cap <<= 1;
    t = calloc(1, sizeof *t);
    pairs = malloc(sizeof(uint32_t) * 2 * (m + 1));
    if (!t || !pairs || !(t->keys = calloc(cap, sizeof(uint64_t))) ||
        !(t->ranks = malloc(sizeof(uint32_t) * cap)) ||
        !(t->off = malloc(sizeof(size_t) * (256 + m + 1))))
        goto out_file;
    t->n_merges = m;
    t->mask = cap - 1;
    size_t total = 256;
    for (uint32_t r = 0; r < m; r++) {
        unsigned a, b;
        if (fscanf(f, "%u %u", &a, &b) != 2 || a >= 256 + r || b >= 256 + r) {
            snprintf(err, errlen, "%s: merge %u: two ids below %u expected", path, r, 256 + r);
            st = MF_INVALID_ARGUMENT;
            goto out_file;
        }
        pairs[2 * r] = a;
        pairs[2 * r + 1] = b;
        uint64_t key = pair_key(a, b);
        uint32_t s = slot_of(key, t->mask);
        while (t->keys[s] && t->keys[s] != key)
            s = (s + 1) & t->mask;
        if (!t->keys[s]) { /* a repeated pair keeps its first (lowest) rank */
            t->keys[s] = key;
            t->ranks[s] = r;
        }
    }
    /* Token lengths first (bounded: none over 64 KiB), then offsets, then the bytes. */
    size_t *len = t->off;
    for (uint32_t i = 0; i < 256; i++)
        len[i] = 1;
    for (uint32_t r = 0; r < m; r++) {
        len[256 + r] = len[pairs[2 * r]] + len[pairs[2 * r + 1]];
        if (len[256 + r] > (1u << 16)) {
            snprintf(err, errlen, "%s: merge %u makes a token over 64 KiB", path, r);
            st = MF_INVALID_ARGUMENT;
            goto out_file;
        }
        total += len[256 + r];
    }
    if (!(t->bytes = malloc(total)))
        goto out_file;
    size_t at = 0; /* lengths become offsets in place, in id order */
    for (uint32_t i = 0; i < 256 + m; i++) {
        size_t l = len[i];
        t->off[i] = at;
        if (i < 256) {
            t->bytes[at] = (char)i;
        } else {
            uint32_t a = pairs[2 * (i - 256)], b = pairs[2 * (i - 256) + 1];
            /* a, b < i: their entries, and off[i] = at, are offsets already */
            size_t la = t->off[a + 1] - t->off[a], lb = t->off[b + 1] - t->off[b];
            memcpy(t->bytes + at, t->bytes + t->off[a], la);
            memcpy(t->bytes + at + la, t->bytes + t->off[b], lb);
        }
        at += l;
    }
    t->off[256 + m] = at;
    st = MF_OK;
out_file:
    fclose(f);
    free(pairs);
    if (st != MF_OK) {
        mfw_tok_free(t);
        return st;
    }
    *out = t;
    return MF_OK;
}

const char *mfw_tok_bytes(const mfw_tok_t *t, uint32_t id, size_t *len)
{
    if (id >= 256 + t->n_merges) {
        *len = 0;
        return NULL;
    }
    *len = t->off[id + 1] - t->off[id];
    return t->bytes + t->off[id];
}

enum { C_L, C_D, C_S, C_P };

static int byte_class(unsigned char c)
{
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c >= 0x80)
        return C_L;
    if (c >= '0' && c <= '9')
        return C_D;
    if (c == ' ' || (c >= '\t' && c <= '\r'))
        return C_S;
    return C_P;
}

/* End of the chunk starting at i (the rule of tokenizer.h). */
static size_t chunk_end(const unsigned char *s, size_t n, size_t i)
{
    size_t j = i;
    if (s[i] == ' ' && i + 1 < n && byte_class(s[i + 1]) != C_S) {
        int c = byte_class(s[i + 1]);
        for (j = i + 1; j < n && byte_class(s[j]) == c; j++)
            ;
        return j;
    }
    int c = byte_class(s[i]);
    for (j = i; j < n && byte_class(s[j]) == c; j++)
        ;
    if (c == C_S && j < n && j - i >= 2)
        j--; /* the run's last byte goes with the word after it */
    return j;
}

mf_status_t mfw_tok_encode(const mfw_tok_t *t, const char *text, size_t len, uint32_t *ids,
                           size_t cap, size_t *n)
{
    const unsigned char *s = (const unsigned char *)text;
    uint32_t *w = NULL;
    size_t wcap = 0, out = 0;
    for (size_t i = 0; i < len;) {
        size_t j = chunk_end(s, len, i), m = j - i;
        if (m > wcap) {
            uint32_t *nw = realloc(w, sizeof(uint32_t) * m);
            if (!nw) {
                free(w);
                *n = out;
                return MF_RESOURCE_EXHAUSTED;
            }
            w = nw;
            wcap = m;
        }
        for (size_t k = 0; k < m; k++)
            w[k] = s[i + k];
        for (;;) {
            uint32_t best = NO_RANK;
            for (size_t k = 0; k + 1 < m; k++) {
                uint32_t r = rank_of(t, w[k], w[k + 1]);
                best = r < best ? r : best;
            }
            if (best == NO_RANK)
                break;
            uint32_t a = 0, b = 0;
            for (size_t k = 0; k + 1 < m; k++)
                if (rank_of(t, w[k], w[k + 1]) == best) {
                    a = w[k];
                    b = w[k + 1];
                    break;
                }
            size_t o = 0;
            for (size_t k = 0; k < m;) {
                if (k + 1 < m && w[k] == a && w[k + 1] == b) {
                    w[o++] = 256 + best;
                    k += 2;
                } else {
                    w[o++] = w[k++];
                }
            }
            m = o;
        }
        for (size_t k = 0; k < m; k++) {
            if (out == cap) {
                free(w);
                *n = out;
                return MF_RESOURCE_EXHAUSTED;
            }
            ids[out++] = w[k];
        }
        i = j;
    }
    free(w);
    *n = out;
    return MF_OK;
}
