/* ctl_profile — mapflowctl's profile put / get / ls (see ctl.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctl.h"
#include "mapflow.pb-c.h"

/* Decoded here first: a file that is not a MappingProfile is a usage error, and what was
 * stored (source → target, shape, bytes) is said afterwards. An admin request. */
int prep_profile_put(int argc, char **argv, cmd_opts_t *o)
{
    (void)argc, (void)argv;
    need(o->file, "--file", "profile put");
    return 1;
}

int cmd_profile_put(ctl_t *c, int argc, char **argv, const cmd_opts_t *o)
{
    (void)argc, (void)argv;
    size_t len;
    void *pb = read_file(o->file, &len);
    if (!pb)
        return file_fail(o->file, EXIT_USAGE);
    Mapflow__V1__MappingProfile *p = mapflow__v1__mapping_profile__unpack(NULL, len, pb);
    if (!p) {
        free(pb);
        report(MF_INVALID_ARGUMENT, o->file, "not an encoded mapflow.v1.MappingProfile");
        return EXIT_USAGE;
    }
    mf_status_t st = mf_profile_put(c->ch, pb, len, c->timeout_ms);
    free(pb);
    int rc = 0;
    const char *src = p->source_model ? p->source_model : "";
    const char *tgt = p->target_model ? p->target_model : "";
    if (st != MF_OK) {
        rc = ctl_fail(c, "profile put", st);
    } else if (c->json) {
        printf("{\"stored\":true,\"ns\":");
        json_str(c->ns);
        printf(",\"source_model\":");
        json_str(src);
        printf(",\"target_model\":");
        json_str(tgt);
        printf(",\"block_size\":%u,\"layers\":%zu,\"bytes\":%zu}\n", p->block_size,
               p->n_layers, len);
    } else {
        printf("stored profile ");
        text_strn(src, strlen(src));
        printf(" -> ");
        text_strn(tgt, strlen(tgt));
        printf(" (namespace ");
        text_strn(c->ns, strlen(c->ns));
        printf(", block %u, %zu layers, %zu bytes)\n", p->block_size, p->n_layers, len);
    }
    mapflow__v1__mapping_profile__free_unpacked(p, NULL);
    return rc;
}

int prep_profile_get(int argc, char **argv, cmd_opts_t *o)
{
    (void)argc, (void)argv;
    need(o->source, "--source", "profile get");
    need(o->target, "--target", "profile get");
    return 0;
}

int cmd_profile_get(ctl_t *c, int argc, char **argv, const cmd_opts_t *o)
{
    (void)argc, (void)argv;
    void *pb;
    size_t len;
    mf_status_t st = mf_profile_get(c->ch, o->source, o->target, &pb, &len, c->timeout_ms);
    if (st != MF_OK)
        return ctl_fail(c, "profile get", st);
    int rc = 0;
    if (o->out)
        rc = write_file(o->out, pb, len);
    if (c->json && rc == 0)
        rc = print_profile_json(pb, len, o->out);
    else if (o->out)
        ;
    else if (isatty(1))
        printf("%zu bytes (use --out FILE)\n", len);
    else
        rc = fwrite(pb, 1, len, stdout) == len ? 0 : file_fail("stdout", EXIT_DAEMON);
    free(pb);
    return rc;
}

static mf_status_t fetch_profiles(ctl_t *c, const cmd_opts_t *o, const uint8_t *tok,
                                  size_t tok_len, void **page, uint8_t **next,
                                  size_t *next_len)
{
    mf_profile_page_t *p;
    mf_status_t st = mf_profile_list(c->ch, o->page_size, tok, tok_len, &p, c->timeout_ms);
    if (st != MF_OK)
        return st;
    *page = p;
    *next = p->next_page_token;
    *next_len = p->next_page_token_len;
    p->next_page_token = NULL;
    return MF_OK;
}

static size_t print_profiles(const void *page, int json, size_t shown)
{
    const mf_profile_page_t *p = page;
    for (size_t i = 0; i < p->n_profiles; i++)
        print_profile_info(&p->profiles[i], json, shown + i == 0);
    return p->n_profiles;
}

static void free_profiles(void *page) { mf_profile_page_free(page); }

int cmd_profile_ls(ctl_t *c, int argc, char **argv, const cmd_opts_t *o)
{
    (void)argc, (void)argv;
    static const pager_t pg = {"profile ls", "profiles", fetch_profiles, print_profiles,
                               free_profiles};
    return run_pages(c, o, &pg);
}
