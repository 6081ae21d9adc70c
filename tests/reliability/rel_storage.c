/*
 * rel_storage — the storage side of issue 22, each part against a real mapflowd that this
 * command starts, stops and restarts itself (`storage --mapflowd BIN --dir DIR`; `--asan
 * BIN` repeats every refused start under an ASan daemon):
 *   ssd-open      durable rows on the SSD tier, then CURRENT removed, 32 MANIFEST bytes
 *                 overwritten, a bit flipped in an SST's index block, one in the block the
 *                 row index is scanned from: each start is refused
 *                 cleanly (exit 1, RocksDB's status in the log, no signal, no sanitizer
 *                 report) and leaves the files alone; undone, every row verifies again. A
 *                 bit flipped in a blob file: that row is DATA_LOSS, then gone from the
 *                 index, counted (ssd_corrupt_rows_total). `--ssd_reset on` moves the
 *                 database aside (nothing deleted) and starts empty, after a scan failure
 *                 and after a missing CURRENT.
 *   collision     block 0 of two contexts collides for real (rel_collide_block), later
 *                 blocks are equal: the second context gets no hit at any block (Lookup,
 *                 Get copy, Get lease; from block 0 or past it; before and after a restart;
 *                 also once it wrote its own block 0), the first keeps its rows; a row
 *                 whose hash is not H(parent, tokens) is refused at commit.
 *   durable-full  durable puts into a small ssd_bytes until refused: RESOURCE_EXHAUSTED,
 *                 counted; other puts still work; no acknowledged durable row is evicted
 *                 (all verify after host eviction and a restart); a delete makes room.
 * Ownership: each part owns the daemon it starts (stopped before it returns).
 * Thread safety: single-threaded.
 */
#include "rel_tool.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NS "storage"
#define MODEL "storage-model"
#define BIG_B 64   /* FP8 rows of 8+ KiB: RocksDB keeps their values in blob files */
#define N_ROWS 24
#define CB 8       /* collision part: XXH3-128 collisions are built for B = 8 */
#define CNB 4
#define CNL 3

typedef struct st_ctx {
    const char *bin, *asan;
    char sock[1024], data[1024], log[1024], db[1100];
    pid_t pid;
} st_ctx_t;

static const char *const g_base[] = {"--host_bytes", "64mb", NULL};

static void ctx_dirs(st_ctx_t *x, const char *dir, const char *part)
{
    snprintf(x->sock, sizeof(x->sock), "%s/%s.sock", dir, part);
    snprintf(x->data, sizeof(x->data), "%s/%s", dir, part);
    snprintf(x->log, sizeof(x->log), "%s/%s.log", dir, part);
    snprintf(x->db, sizeof(x->db), "%s/rocksdb", x->data);
    mkdir(x->data, 0700);
}

static int up(st_ctx_t *x, const char *const *extra)
{
    x->pid = rel_spawn_daemon(x->bin, x->sock, x->data, extra, x->log);
    return x->pid > 0 ? 0 : -1;
}

static int down(st_ctx_t *x)
{
    if (x->pid <= 0)
        return -1;
    int rc = rel_stop_daemon(x->pid, SIGTERM);
    x->pid = 0;
    return rc;
}

static long file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

/* The log's bytes from `off` on (malloc'd, NUL-terminated; NULL when unreadable). */
static char *log_since(const st_ctx_t *x, long off)
{
    FILE *f = fopen(x->log, "rb");
    long end = file_size(x->log);
    if (!f || end < off) {
        if (f)
            fclose(f);
        return NULL;
    }
    char *b = malloc((size_t)(end - off) + 1);
    size_t n = 0;
    if (b && fseek(f, off, SEEK_SET) == 0)
        n = fread(b, 1, (size_t)(end - off), f);
    fclose(f);
    if (b)
        b[n] = 0;
    return b;
}

/*
 * Starts `bin` expecting a refusal: exit 1 within 30 s, `needle` in the log, no crash or
 * sanitizer report. The "cannot start: ..." line goes to msg. Returns 1 when all held.
 */
static int refused_by(st_ctx_t *x, const char *bin, const char *const *extra,
                      const char *needle, char *msg, size_t msglen)
{
    long off = file_size(x->log);
    if (off < 0)
        off = 0;
    const char *prev = getenv("ASAN_OPTIONS");
    char *saved = prev ? strdup(prev) : NULL;
    if (bin == x->asan) /* a leak at exit is a report too */
        setenv("ASAN_OPTIONS", "detect_leaks=1:halt_on_error=1:exitcode=99", 1);
    pid_t pid = rel_exec_daemon(bin, x->sock, x->data, extra, x->log);
    if (saved)
        setenv("ASAN_OPTIONS", saved, 1);
    else
        unsetenv("ASAN_OPTIONS");
    free(saved);
    int rc = pid > 0 ? rel_wait_exit(pid, 30000) : -1;
    char *log = log_since(x, off);
    const char *line = log ? strstr(log, "cannot start: ") : NULL;
    msg[0] = 0;
    /* The table names data_dir, not this run's temporary path. */
    for (const char *p = line ? line + 14 : "?", *end = p + strcspn(p, "\n"); p < end;) {
        const char *d = strstr(p, x->data);
        size_t n = strlen(msg), take = (size_t)((d && d < end ? d : end) - p);
        snprintf(msg + n, msglen - n, "%.*s%s", (int)take, p, d && d < end ? "DATA_DIR" : "");
        p += take + (d && d < end ? strlen(x->data) : 0);
    }
    int ok = REL_CHECK(rc == 1, "%s: exit %d, want 1 (a clean refusal)", bin, rc);
    ok &= REL_CHECK(log && strstr(log, needle), "%s: no '%s' in the log", bin, needle);
    ok &= REL_CHECK(log && !strstr(log, "Caught signal") && !strstr(log, "Sanitizer"),
                    "%s: crash or sanitizer report in the log:\n%s", bin, log ? log : "");
    free(log);
    return ok;
}

static int refused(st_ctx_t *x, const char *const *extra, const char *needle, char *msg,
                   size_t msglen)
{
    char amsg[512];
    int ok = refused_by(x, x->bin, extra, needle, msg, msglen);
    if (x->asan)
        ok &= refused_by(x, x->asan, extra, needle, amsg, sizeof(amsg));
    return ok;
}

/* RocksDB files of the database ending in `suffix`: their count; the largest into big. */
static int count_files(const st_ctx_t *x, const char *suffix, char *big, size_t biglen)
{
    DIR *d = opendir(x->db);
    int n = 0;
    long best = -1;
    if (!d)
        return 0;
    for (struct dirent *de; (de = readdir(d));) {
        size_t l = strlen(de->d_name), sl = strlen(suffix);
        if (l <= sl || strcmp(de->d_name + l - sl, suffix) != 0)
            continue;
        char p[1500];
        snprintf(p, sizeof(p), "%s/%s", x->db, de->d_name);
        long sz = file_size(p);
        n++;
        if (big && sz > best) {
            best = sz;
            snprintf(big, biglen, "%s", p);
        }
    }
    closedir(d);
    return n;
}

/* pread / pwrite of len bytes at off. 0 or -1. */
static int file_io(const char *path, long off, uint8_t *buf, size_t len, int write)
{
    int fd = open(path, write ? O_WRONLY : O_RDONLY);
    if (fd < 0)
        return -1;
    ssize_t n = write ? pwrite(fd, buf, len, off) : pread(fd, buf, len, off);
    if (write)
        fsync(fd);
    close(fd);
    return n == (ssize_t)len ? 0 : -1;
}

/* Flips one bit at off (again to undo). 0 or -1. */
static int flip_bit(const char *path, long off, uint8_t bit)
{
    uint8_t b;
    if (file_io(path, off, &b, 1, 0) != 0)
        return -1;
    b ^= (uint8_t)(1u << (bit & 7));
    return file_io(path, off, &b, 1, 1);
}

/* Offset of the middle of a block-based SST's index block (from its footer: checksum
 * type, metaindex handle, index handle as varints, ..., u64 magic), or -1. */
static long sst_index_middle(const char *path)
{
    long size = file_size(path);
    uint8_t f[53];
    if (size < 53 || file_io(path, size - 53, f, 53, 0) != 0)
        return -1;
    uint64_t magic = 0;
    for (int i = 7; i >= 0; i--)
        magic = (magic << 8) | f[45 + i];
    if (magic != 0x88e241b785f4cff7ull) /* kBlockBasedTableMagicNumber */
        return -1;
    uint64_t v[4] = {0};
    size_t at = 1;
    for (int k = 0; k < 4; k++)
        for (int sh = 0; at < 45; sh += 7) {
            uint8_t c = f[at++];
            v[k] |= (uint64_t)(c & 0x7f) << sh;
            if (!(c & 0x80))
                break;
        }
    if (!v[3] || v[2] + v[3] > (uint64_t)size)
        return -1;
    return (long)(v[2] + v[3] / 2);
}

static uint8_t *big_row(uint32_t ctx, uint32_t *tokens, size_t *len)
{
    rel_tokens(tokens, BIG_B, 5000 + ctx);
    rel_row_spec_t rs = {NS, MODEL, 0, BIG_B, tokens, 0, MF_CODEC_FP8_E4M3, ctx + 1, NULL};
    return rel_row(&rs, len);
}

/* Puts contexts [from, to) (one big row each). Returns the ErrorReply code of the first
 * failure (stopping there) or 0; *acked counts the rows acknowledged (durable when asked). */
static int put_big(st_ctx_t *x, uint32_t from, uint32_t to, int durable, uint32_t *acked,
                   char *err, size_t errlen)
{
    rel_conn_t c;
    *acked = 0;
    if (!REL_CHECK(rel_open(&c, x->sock, NS, NULL, 1, 10000) == 0, "connect"))
        return -1;
    int rc = 0;
    for (uint32_t i = from; i < to && rc == 0; i++) {
        uint32_t t[BIG_B];
        size_t len;
        uint8_t *row = big_row(i, t, &len);
        int dur = 0;
        rc = row ? rel_put(&c, row, len, durable, &dur) : -1;
        free(row);
        if (rc == 0 && REL_CHECK(dur == durable, "put %u: durable %d, asked %d", i, dur, durable))
            (*acked)++;
    }
    if (err)
        snprintf(err, errlen, "%s", c.err);
    rel_close(&c);
    return rc;
}

typedef struct tally {
    uint32_t ok, loss, missing, other, bad;
} tally_t;

/* Get copy of contexts [from, to): each reply row's status; OK rows checked in full. */
static tally_t get_big(st_ctx_t *x, uint32_t from, uint32_t to)
{
    tally_t t = {0};
    rel_conn_t c;
    if (!REL_CHECK(rel_open(&c, x->sock, NS, NULL, 0, 10000) == 0, "connect")) {
        t.other = to - from;
        return t;
    }
    uint32_t layer = 0;
    for (uint32_t i = from; i < to; i++) {
        uint32_t tok[BIG_B];
        rel_tokens(tok, BIG_B, 5000 + i);
        mf_envelope_t *r = rel_get_prefix(&c, MODEL, BIG_B, &layer, 1, tok, BIG_B, 0, 1, 0);
        int st = r && r->body_case == MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY &&
                         r->get_reply->n_rows == 1
                     ? (int)r->get_reply->rows[0]->status
                     : -1;
        if (st == MF_OK) {
            const Mapflow__V1__RowRef *ref = r->get_reply->rows[0];
            const char *why = "outside the payload";
            if (ref->payload_offset + ref->length <= c.payload_len &&
                rel_row_check(c.payload + ref->payload_offset, ref->length, NS, MODEL, 0,
                              BIG_B, tok, 0, &why) == 0)
                t.ok++;
            else
                REL_CHECK(++t.bad == 0, "row %u read back bad: %s", i, why);
        } else if (st == MF_DATA_LOSS) {
            t.loss++;
        } else if (st == MF_NOT_FOUND) {
            t.missing++;
        } else {
            t.other++;
        }
        if (r)
            mf_envelope_free(r);
    }
    rel_close(&c);
    return t;
}

static uint64_t counter(st_ctx_t *x, const char *name)
{
    rel_conn_t c;
    if (rel_open(&c, x->sock, NS, NULL, 0, 10000) != 0)
        return UINT64_MAX;
    uint64_t v = rel_counter(&c, name);
    rel_close(&c);
    return v;
}

static uint64_t listed(st_ctx_t *x)
{
    rel_conn_t c;
    uint64_t n = UINT64_MAX;
    if (rel_open(&c, x->sock, NS, NULL, 0, 10000) == 0) {
        if (rel_list_count(&c, MODEL, &n) != 0)
            n = UINT64_MAX;
        rel_close(&c);
    }
    return n;
}

/* Starts with --ssd_reset on (left running): 0 rows, and the log names where the old
 * database went, which holds `blobs` blob files. Returns 1 when all held. */
static int reset_start(st_ctx_t *x, int blobs)
{
    static const char *const reset[] = {"--host_bytes", "64mb", "--ssd_reset", "on", NULL};
    long off = file_size(x->log);
    if (!REL_CHECK(up(x, reset) == 0, "start with --ssd_reset on"))
        return 0;
    uint64_t n = listed(x);
    int ok = REL_CHECK(n == 0, "%llu rows after ssd_reset", (unsigned long long)n);
    char *log = log_since(x, off);
    const char *m = log ? strstr(log, "moved to ") : NULL;
    st_ctx_t old = *x;
    if (m)
        snprintf(old.db, sizeof(old.db), "%.*s", (int)strcspn(m + 9, " \n"), m + 9);
    ok &= REL_CHECK(m && count_files(&old, ".blob", NULL, 0) == blobs,
                    "the old database's files are not where the log says");
    free(log);
    return ok;
}

static int part_ssd_open(st_ctx_t *x)
{
    uint32_t acked = 0;
    char m_cur[512] = "", m_man[512] = "", m_sst[512] = "", sst[1500] = "", blob[1500] = "";
    if (!REL_CHECK(up(x, g_base) == 0, "start"))
        return 1;
    put_big(x, 0, N_ROWS, 1, &acked, NULL, 0);
    REL_CHECK(acked == N_ROWS, "%u/%u durable puts acknowledged", acked, N_ROWS);
    REL_CHECK(down(x) == 0, "SIGTERM exit");
    /* The next open replays the WAL into SST and blob files. */
    if (!REL_CHECK(up(x, g_base) == 0, "restart"))
        return 1;
    tally_t t0 = get_big(x, 0, N_ROWS);
    REL_CHECK(t0.ok == N_ROWS, "%u/%u rows back after a restart", t0.ok, N_ROWS);
    REL_CHECK(down(x) == 0, "SIGTERM exit");
    int n_sst = count_files(x, ".sst", sst, sizeof(sst));
    int n_blob = count_files(x, ".blob", blob, sizeof(blob));
    if (!REL_CHECK(n_sst >= 1 && n_blob >= 1, "%d SST, %d blob files", n_sst, n_blob))
        return 1;

    /* 1. CURRENT removed: refused, and the data files are still there. */
    char cur[1300], away[1400];
    snprintf(cur, sizeof(cur), "%s/CURRENT", x->db);
    snprintf(away, sizeof(away), "%s/CURRENT.away", x->db);
    REL_CHECK(rename(cur, away) == 0, "rename CURRENT");
    int ok_cur = refused(x, g_base, "no CURRENT", m_cur, sizeof(m_cur));
    ok_cur &= REL_CHECK(count_files(x, ".sst", NULL, 0) == n_sst &&
                            count_files(x, ".blob", NULL, 0) == n_blob,
                        "data files deleted by a refused start");
    REL_CHECK(rename(away, cur) == 0, "restore CURRENT");

    /* 2. 32 bytes in the middle of the MANIFEST that CURRENT names overwritten. */
    char name[256] = "", man[1500];
    FILE *f = fopen(cur, "r");
    if (f) {
        if (!fgets(name, sizeof(name), f))
            name[0] = 0;
        fclose(f);
    }
    name[strcspn(name, "\n")] = 0;
    snprintf(man, sizeof(man), "%s/%s", x->db, name);
    long msize = file_size(man), moff = msize / 2 - 16;
    uint8_t saved[32], junk[32];
    uint64_t seed = 0x5eed;
    for (int i = 0; i < 32; i++)
        junk[i] = (uint8_t)rel_rand(&seed);
    int ok_man = REL_CHECK(msize >= 64 && file_io(man, moff, saved, 32, 0) == 0 &&
                               file_io(man, moff, junk, 32, 1) == 0,
                           "overwrite 32 bytes of %s", man);
    ok_man &= refused(x, g_base, "Corruption", m_man, sizeof(m_man));
    REL_CHECK(file_io(man, moff, saved, 32, 1) == 0, "restore the MANIFEST");

    /* 3. One bit of an SST's index block. */
    long ioff = sst_index_middle(sst);
    int ok_sst = REL_CHECK(ioff > 0 && flip_bit(sst, ioff, 3) == 0, "flip a bit in %s", sst);
    ok_sst &= refused(x, g_base, "Corruption", m_sst, sizeof(m_sst));
    REL_CHECK(ioff > 0 && flip_bit(sst, ioff, 3) == 0, "restore the SST");

    /* 4. One bit of the SST's first data block (its first keys: the 'm' index records the
     * start scans; RocksDB reads data blocks only then, not when it opens the file). */
    char m_scan[512] = "";
    int ok_scan = REL_CHECK(flip_bit(sst, 20, 2) == 0, "flip a bit in %s", sst);
    ok_scan &= refused(x, g_base, "scanning the row index", m_scan, sizeof(m_scan));
    REL_CHECK(flip_bit(sst, 20, 2) == 0, "restore the SST");

    /* Undone: every row is back. */
    tally_t t1 = {0};
    if (REL_CHECK(up(x, g_base) == 0, "start after undoing the damage")) {
        t1 = get_big(x, 0, N_ROWS);
        REL_CHECK(t1.ok == N_ROWS, "%u/%u rows back after undoing", t1.ok, N_ROWS);
        REL_CHECK(down(x) == 0, "SIGTERM exit");
    }
    rel_result("ssd-open", "SSD database damaged before a start",
               "24 durable 8 KiB rows (blob files); remove rocksdb/CURRENT; overwrite 32 "
               "MANIFEST bytes; flip a bit in an SST index block; flip a bit in the SST "
               "block the row index is scanned from; each undone before the next",
               "%d/4 starts refused cleanly (exit 1, no signal%s): no CURRENT: \"%.100s\"; "
               "MANIFEST: \"%.100s\"; SST index: \"%.100s\"; scan: \"%.100s\"; data files "
               "kept: %s; undone: %u/%u rows verify",
               ok_cur + ok_man + ok_sst + ok_scan, x->asan ? ", also under ASan: no report" : "",
               m_cur, m_man, m_sst, m_scan, ok_cur ? "yes" : "NO", t1.ok, N_ROWS);

    /* 4. One bit in the middle of a blob file: that row is DATA_LOSS, then gone. */
    long boff = file_size(blob) / 2;
    REL_CHECK(boff > 0 && flip_bit(blob, boff, 5) == 0, "flip a bit in %s", blob);
    tally_t t2 = {0}, t3 = {0};
    uint64_t corrupt = UINT64_MAX, left = UINT64_MAX;
    if (REL_CHECK(up(x, g_base) == 0, "start with a damaged blob")) {
        t2 = get_big(x, 0, N_ROWS);
        REL_CHECK(t2.loss >= 1 && t2.loss + t2.ok == N_ROWS && !t2.other && !t2.bad,
                  "damaged blob: %u OK, %u DATA_LOSS, %u NOT_FOUND, %u other", t2.ok,
                  t2.loss, t2.missing, t2.other);
        corrupt = counter(x, "ssd_corrupt_rows_total");
        REL_CHECK(corrupt == t2.loss, "ssd_corrupt_rows_total %llu, want %u",
                  (unsigned long long)corrupt, t2.loss);
        t3 = get_big(x, 0, N_ROWS);
        left = listed(x);
        REL_CHECK(t3.missing == t2.loss && t3.ok == t2.ok && left == t2.ok,
                  "after DATA_LOSS: %u NOT_FOUND, %u OK, %llu listed", t3.missing, t3.ok,
                  (unsigned long long)left);
        REL_CHECK(down(x) == 0, "SIGTERM exit");
    }
    rel_result("ssd-corrupt-row", "a row corrupt on the SSD tier",
               "flip one bit in the middle of a blob file, restart, Get every row twice",
               "first Get: %u DATA_LOSS, %u OK (verified); ssd_corrupt_rows_total %llu; second "
               "Get: %u NOT_FOUND, %u OK; List %llu rows (the corrupt ones left the index)",
               t2.loss, t2.ok, (unsigned long long)corrupt, t3.missing, t3.ok,
               (unsigned long long)left);

    /* 5. ssd_reset, once for a scan failure, once for a missing CURRENT: the database
     * is moved aside (its files where the log says) and the daemon starts empty. */
    int ok_scan_reset = REL_CHECK(flip_bit(sst, 20, 2) == 0, "flip a bit in %s", sst);
    ok_scan_reset &= reset_start(x, n_blob);
    put_big(x, 0, 4, 1, &acked, NULL, 0); /* a database with files again */
    ok_scan_reset &= REL_CHECK(acked == 4 && down(x) == 0 && up(x, g_base) == 0 &&
                                   down(x) == 0,
                               "rows into the new database");
    int n_new = count_files(x, ".blob", NULL, 0);
    REL_CHECK(rename(cur, away) == 0, "rename CURRENT");
    int ok_cur_reset = reset_start(x, n_new);
    REL_CHECK(down(x) == 0, "SIGTERM exit");
    rel_result("ssd-reset", "explicit reset of an unreadable SSD database",
               "start with --ssd_reset on: after a bit flip in the scanned SST block, and "
               "after CURRENT was removed",
               "scan failure: %s; no CURRENT: %s (started with 0 rows, the old directory "
               "moved aside with its files, nothing deleted)",
               ok_scan_reset ? "yes" : "NO", ok_cur_reset ? "yes" : "NO");
    return 0;
}

static int status_of(mf_envelope_t *r, size_t i)
{
    return r && r->body_case == MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY &&
                   i < r->get_reply->n_rows
               ? (int)r->get_reply->rows[i]->status
               : -1;
}

/* Get of blocks [first, first + n) on every layer: rows OK (checked against tokens when
 * `check`), and the rest must be NOT_FOUND. Leases are released. Returns the OK count. */
static uint32_t get_ctx(rel_conn_t *c, const uint32_t *tok, const uint32_t *layers,
                        size_t nl, uint32_t first, uint32_t n, int lease, int check)
{
    mf_envelope_t *r = rel_get_prefix(c, MODEL, CB, layers, nl, tok, CNB * CB, first, n, lease);
    uint32_t ok = 0;
    for (size_t i = 0; i < nl * n; i++) {
        int st = status_of(r, i);
        if (st == MF_OK) {
            const Mapflow__V1__RowRef *ref = r->get_reply->rows[i];
            const uint8_t *row = lease ? c->arena + ref->arena_offset
                                       : c->payload + ref->payload_offset;
            const char *why = "";
            REL_CHECK(!check || rel_row_check(row, ref->length, NS, MODEL, ref->layer, CB, tok,
                                              ref->block, &why) == 0,
                      "row layer %u block %u: %s", ref->layer, ref->block, why);
            if (lease)
                rel_release(c, &ref->lease_id, 1, NULL);
            ok++;
        } else {
            REL_CHECK(st == MF_NOT_FOUND, "Get row %zu: status %d", i, st);
        }
    }
    if (r)
        mf_envelope_free(r);
    return ok;
}

static int part_collision(st_ctx_t *x)
{
    uint32_t ta[CNB * CB], tb[CNB * CB], partner[CB], layers[CNL] = {0, 1, 2};
    rel_tokens(ta, CNB * CB, 77);
    if (!REL_CHECK(rel_collide_block(ta, CB, partner, 78) == 0, "no collision built"))
        return 1;
    memcpy(tb, ta, sizeof(tb));
    memcpy(tb, partner, sizeof(partner));
    mf_hash128_t pa, ha, pb, hb;
    rel_block_hashes(NS, MODEL, CB, ta, CNB - 1, &pa, &ha);
    rel_block_hashes(NS, MODEL, CB, tb, CNB - 1, &pb, &hb);
    REL_CHECK(mf_hash_eq(ha, hb) && memcmp(ta, tb, CB * 4) != 0,
              "contexts A and B do not share their block hashes");
    if (!REL_CHECK(up(x, g_base) == 0, "start"))
        return 1;
    rel_conn_t c;
    if (!REL_CHECK(rel_open(&c, x->sock, NS, NULL, 1, 10000) == 0, "connect"))
        return 1;
    uint32_t put_ok = 0;
    for (uint32_t l = 0; l < CNL; l++)
        for (uint32_t b = 0; b < CNB; b++) {
            rel_row_spec_t rs = {NS, MODEL, l, CB, ta, b, MF_CODEC_MASK, 10 * l + b + 1, NULL};
            size_t len;
            uint8_t *row = rel_row(&rs, &len);
            put_ok += row && rel_put(&c, row, len, 0, NULL) == 0;
            free(row);
        }
    REL_CHECK(put_ok == CNL * CNB, "%u/%u puts of A", put_ok, CNL * CNB);
    /* A row whose header hash is not H(parent, tokens) (B's tokens under A's block 1). */
    rel_block_hashes(NS, MODEL, CB, ta, 1, &pa, &ha);
    uint32_t tother[CNB * CB];
    rel_tokens(tother, CNB * CB, 99);
    rel_row_spec_t fs = {NS, MODEL, 0, CB, tother, 1, MF_CODEC_MASK, 3, &ha};
    size_t flen;
    uint8_t *frow = rel_row(&fs, &flen);
    int forced = frow ? rel_put(&c, frow, flen, 0, NULL) : -1;
    free(frow);
    char forced_err[160];
    snprintf(forced_err, sizeof(forced_err), "%s", c.err);
    REL_CHECK(forced == MF_INVALID_ARGUMENT && strstr(forced_err, "H(parent"),
              "a row whose hash is not H(parent, tokens): %d (%s)", forced, forced_err);

    uint64_t mm0 = rel_counter(&c, "hash_mismatches_total");
    uint32_t blocks[CNL], b_lookup = 0, b_rows = 0, a_rows = 0;
    REL_CHECK(rel_lookup(&c, MODEL, CB, layers, CNL, tb, CNB * CB, blocks) == 0, "Lookup B");
    for (int l = 0; l < CNL; l++)
        b_lookup += blocks[l];
    REL_CHECK(rel_lookup(&c, MODEL, CB, layers, CNL, ta, CNB * CB, blocks) == 0 &&
                  blocks[0] == CNB && blocks[1] == CNB && blocks[2] == CNB,
              "Lookup A: %u %u %u", blocks[0], blocks[1], blocks[2]);
    for (int lease = 0; lease < 2; lease++) {
        b_rows += get_ctx(&c, tb, layers, CNL, 0, CNB, lease, 0);
        b_rows += get_ctx(&c, tb, layers, CNL, 1, CNB - 1, lease, 0);
        a_rows += get_ctx(&c, ta, layers, CNL, 0, CNB, lease, 1);
        a_rows += get_ctx(&c, ta, layers, CNL, 1, CNB - 1, lease, 1);
    }
    REL_CHECK(b_lookup == 0 && b_rows == 0, "context B: %u lookup blocks, %u rows", b_lookup,
              b_rows);
    REL_CHECK(a_rows == 2 * CNL * (2 * CNB - 1), "context A: %u rows", a_rows);
    rel_close(&c);

    /* After a restart the rows are known by key only until read. */
    REL_CHECK(down(x) == 0, "SIGTERM exit");
    uint32_t b_after = 0, a_after = 0, b_own = 0, a_later = 0;
    if (REL_CHECK(up(x, g_base) == 0, "restart") &&
        REL_CHECK(rel_open(&c, x->sock, NS, NULL, 1, 10000) == 0, "connect")) {
        b_after += get_ctx(&c, tb, layers, CNL, 1, CNB - 1, 0, 0);
        b_after += get_ctx(&c, tb, layers, CNL, 0, CNB, 1, 0);
        a_after = get_ctx(&c, ta, layers, CNL, 0, CNB, 0, 1);
        b_after += get_ctx(&c, tb, layers, CNL, 1, CNB - 1, 1, 0);
        /* B writes its own block 0 on layer 0 (a legitimate row under the same key). */
        rel_row_spec_t rs = {NS, MODEL, 0, CB, tb, 0, MF_CODEC_MASK, 77, NULL};
        size_t len;
        uint8_t *row = rel_row(&rs, &len);
        REL_CHECK(row && rel_put(&c, row, len, 0, NULL) == 0, "B's block 0: %s", c.err);
        free(row);
        b_own = get_ctx(&c, tb, layers, 1, 0, CNB, 0, 1);   /* its block 0 only */
        a_later = get_ctx(&c, ta, layers, 1, 0, CNB, 1, 1); /* blocks 1..3 */
        REL_CHECK(b_after == 0 && b_own == 1, "B after the restart: %u rows, own %u", b_after,
                  b_own);
        REL_CHECK(a_after == CNL * CNB && a_later == CNB - 1, "A after the restart: %u, %u",
                  a_after, a_later);
        uint64_t mm1 = rel_counter(&c, "hash_mismatches_total");
        rel_close(&c);
        REL_CHECK(down(x) == 0, "SIGTERM exit");
        rel_result("collision-chain", "colliding blocks (real XXH3-128 collisions)",
                   "contexts A, B: block 0 collides (B = 8), blocks 1-3 equal; A puts 3 layers "
                   "x 4 blocks; B: Lookup, Get copy / lease of blocks 0-3 and 1-3, before and "
                   "after a restart, then B puts its own block 0; a row whose hash is not "
                   "H(parent, tokens)",
                   "B: %u Lookup blocks, %u rows served (0 after restart; its own block 0 "
                   "only once written); A: %u/%u rows verified, %u after restart; forced-hash "
                   "row refused: %s \"%s\"; hash_mismatches_total +%llu",
                   b_lookup, b_rows, a_rows, 2 * CNL * (2 * CNB - 1), a_after,
                   mf_status_name(forced > 0 ? (mf_status_t)forced : MF_INTERNAL), forced_err,
                   (unsigned long long)(mm1 - mm0));
    }
    return 0;
}

/* Delete by key of big context i. */
static int delete_big(rel_conn_t *c, uint32_t i)
{
    uint32_t t[BIG_B];
    rel_tokens(t, BIG_B, 5000 + i);
    mf_hash128_t parent, h;
    rel_block_hashes(NS, MODEL, BIG_B, t, 0, &parent, &h);
    uint8_t hash[16];
    mf_hash_to_le(h, hash);
    Mapflow__V1__Key k = MAPFLOW__V1__KEY__INIT;
    k.model = MODEL;
    k.hash.data = hash;
    k.hash.len = 16;
    Mapflow__V1__Delete m = MAPFLOW__V1__DELETE__INIT;
    m.key = &k;
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_DELETE;
    env.delete_ = &m;
    mf_envelope_t *r = rel_call(c, &env, NULL, 0);
    int rc = rel_status(r, MAPFLOW__V1__ENVELOPE__BODY_DELETE_REPLY, c);
    if (rc == 0 && r->delete_reply->deleted != 1)
        rc = -1;
    if (r)
        mf_envelope_free(r);
    return rc;
}

static int part_durable_full(st_ctx_t *x)
{
    const char *const small[] = {"--host_bytes", "64mb", "--ssd_bytes", "1mb", NULL};
    if (!REL_CHECK(up(x, small) == 0, "start"))
        return 1;
    uint32_t acked = 0, more = 0, plain = 0;
    char err[160] = "";
    int rc = put_big(x, 0, 400, 1, &acked, err, sizeof(err));
    REL_CHECK(rc == MF_RESOURCE_EXHAUSTED && acked >= 20,
              "durable puts into 1 MiB: %u acknowledged, then %d (%s)", acked, rc, err);
    /* Non-durable puts still work (host tier); durable ones are still refused. */
    int rc_plain = put_big(x, 1000, 1100, 0, &plain, NULL, 0);
    REL_CHECK(rc_plain == 0 && plain == 100, "non-durable puts: %u, then %d", plain, rc_plain);
    int rc_again = put_big(x, 400, 405, 1, &more, NULL, 0);
    REL_CHECK(rc_again == MF_RESOURCE_EXHAUSTED && more == 0, "durable put after: %d", rc_again);
    uint64_t refusals = counter(x, "ssd_full_refusals_total");
    REL_CHECK(refusals == 2, "ssd_full_refusals_total %llu, want 2",
              (unsigned long long)refusals);
    /* Push every row out of the host tier: durable rows stay on the SSD tier. */
    rel_conn_t c;
    uint64_t ev = 0;
    if (REL_CHECK(rel_open(&c, x->sock, NS, NULL, 0, 10000) == 0, "connect")) {
        REL_CHECK(rel_evict(&c, MAPFLOW__V1__TIER__TIER_HOST, &ev) == 0, "Evict host");
        REL_CHECK(rel_evict(&c, MAPFLOW__V1__TIER__TIER_SSD, NULL) == 0, "Evict ssd");
        rel_close(&c);
    }
    tally_t t1 = get_big(x, 0, acked);
    REL_CHECK(t1.ok == acked, "%u/%u durable rows after evictions", t1.ok, acked);
    REL_CHECK(down(x) == 0, "SIGTERM exit");
    tally_t t2 = {0};
    uint32_t after_delete = 0;
    if (REL_CHECK(up(x, small) == 0, "restart")) {
        t2 = get_big(x, 0, acked);
        REL_CHECK(t2.ok == acked, "%u/%u durable rows after a restart", t2.ok, acked);
        if (REL_CHECK(rel_open(&c, x->sock, NS, NULL, 0, 10000) == 0, "connect")) {
            REL_CHECK(delete_big(&c, 0) == 0, "delete one durable row: %s", c.err);
            rel_close(&c);
        }
        put_big(x, 500, 501, 1, &after_delete, NULL, 0);
        REL_CHECK(after_delete == 1, "a durable put after a delete made room");
        REL_CHECK(down(x) == 0, "SIGTERM exit");
    }
    rel_result("durable-full", "SSD budget full of durable rows",
               "ssd_bytes 1mb; 8 KiB durable puts until refused; 100 non-durable puts; more "
               "durable puts; Evict host and ssd; restart; delete one row",
               "after %u acknowledged: %s \"%s\"; non-durable %u/100 ok; again refused: %s; "
               "ssd_full_refusals_total %llu; durable rows kept: %u/%u after evictions, %u/%u "
               "after restart; put after a delete: %s",
               acked, mf_status_name(rc > 0 ? (mf_status_t)rc : MF_INTERNAL), err, plain,
               rc_again == MF_RESOURCE_EXHAUSTED ? "yes" : "NO", (unsigned long long)refusals,
               t1.ok, acked, t2.ok, acked, after_delete ? "ok" : "FAILED");
    return 0;
}

int rel_cmd_storage(int argc, char **argv)
{
    const char *bin = rel_opt(argc, argv, "--mapflowd", NULL);
    const char *dir = rel_opt(argc, argv, "--dir", NULL);
    const char *part = rel_opt(argc, argv, "--part", "all");
    if (!bin || !dir)
        return 2;
    st_ctx_t x = {.bin = bin, .asan = rel_opt(argc, argv, "--asan", NULL)};
    int rc = 0, all = strcmp(part, "all") == 0;
    if (all || !strcmp(part, "ssd-open")) {
        ctx_dirs(&x, dir, "ssd-open");
        rc |= part_ssd_open(&x);
    }
    if (all || !strcmp(part, "collision")) {
        ctx_dirs(&x, dir, "collision");
        rc |= part_collision(&x);
    }
    if (all || !strcmp(part, "durable-full")) {
        ctx_dirs(&x, dir, "durable-full");
        rc |= part_durable_full(&x);
    }
    if (x.pid > 0)
        rel_stop_daemon(x.pid, SIGKILL);
    return rc;
}
