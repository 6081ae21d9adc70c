/* dispatch — Hello and the request switch (see dispatch.h). */
#include "dispatch.h"
#include "mf_clock.h"
#include "admin.h"
#include "lease.h"
#include "log.h"
#include "peer.h"
#include "rows.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* ==== Hello ========================================================================= */

/* Length and every byte, in time that depends on the offered length only (the frame
 * decoder already refused a NUL inside, so strlen is the wire length). */
static int token_equal(const char *offered, const char *want)
{
    size_t lo = strlen(offered), lw = strlen(want);
    unsigned char d = (unsigned char)(lo != lw);
    for (size_t i = 0; i < lo; i++)
        d |= (unsigned char)(offered[i] ^ (lw ? want[i % lw] : 0));
    return d == 0;
}

static void handle_hello(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Hello *h)
{
    mfd_server_t *s = c->srv;
    if (c->hello_done) {
        mfd_conn_error(c, rid, MF_FAILED_PRECONDITION, "Hello was already sent");
        return;
    }
    if (h->protocol_version != MF_PROTOCOL_VERSION) {
        mfd_count(&s->metrics, MFD_C_CONN_REJECTED, 1);
        mfd_conn_fail(c, rid, MF_FAILED_PRECONDITION, "unsupported protocol_version (want 1)");
        return;
    }
    size_t nl = h->namespace_ ? strlen(h->namespace_) : 0;
    if (nl < 1 || nl > MFD_NS_MAX || mfd_has_control(h->namespace_) ||
        mfd_has_control(h->client_name)) {
        mfd_count(&s->metrics, MFD_C_CONN_REJECTED, 1);
        mfd_conn_fail(c, rid, MF_INVALID_ARGUMENT,
                  "namespace must be 1..128 bytes; namespace and client_name without control "
                  "characters");
        return;
    }
    if (c->tp->requires_token && s->cfg.token[0] &&
        !token_equal(h->token ? h->token : "", s->cfg.token)) {
        mfd_count(&s->metrics, MFD_C_CONN_REJECTED, 1);
        mfd_warn("connection %s: bad token, closing", c->peer);
        mfd_conn_fail(c, rid, MF_UNAUTHENTICATED, "token required and not matched");
        return;
    }
    /* An admin_token that is offered must be right: a wrong one is an attack, not a
     * tenant (and with none configured no Hello can claim admin this way). */
    if (h->admin_token && h->admin_token[0]) {
        if (!s->cfg.admin_token[0] || !token_equal(h->admin_token, s->cfg.admin_token)) {
            mfd_count(&s->metrics, MFD_C_CONN_REJECTED, 1);
            mfd_warn("connection %s (%s): admin_token refused, closing", c->peer,
                     c->creds[0] ? c->creds : "no credentials");
            mfd_conn_fail(c, rid, MF_UNAUTHENTICATED, "admin_token not matched");
            return;
        }
        if (!c->admin)
            c->admin = MFD_ADMIN_TOKEN;
    }
    if (!(c->acct = mfd_acct_get(s, h->namespace_, nl))) {
        mfd_conn_fail(c, rid, MF_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    memcpy(c->ns, h->namespace_, nl);
    c->ns[nl] = 0;
    c->ns_len = nl;
    snprintf(c->name, sizeof(c->name), "%s", h->client_name ? h->client_name : "");
    c->hello_done = 1;
    c->session_id = ++s->next_session;
    int pass_fd = h->want_host_arena && c->tp->can_pass_fds;
    /* UCX: the arena is reached one-sided; RemoteArena hands out its rkey. */
    int remote = h->want_host_arena && c->tp == &mfd_transport_ucx;
    c->has_arena = remote;

    Mapflow__V1__HelloReply r = MAPFLOW__V1__HELLO_REPLY__INIT;
    r.protocol_version = MF_PROTOCOL_VERSION;
    r.daemon_version = (char *)MFD_VERSION_STR;
    r.session_id = c->session_id;
    r.host_arena_bytes = pass_fd || remote ? mfd_store_host_capacity(&s->store) : 0;
    r.host_arena_fd = pass_fd;
    r.max_frame = (uint32_t)s->cfg.max_frame;
    r.max_batch = (uint32_t)s->cfg.max_batch;
    r.gpu_tier = s->store.gpu != NULL;
    /* GPU arenas: CUDA IPC works between processes of one node only, so unix clients. */
    Mapflow__V1__GpuArena ga[MFD_GPU_MAX_ARENAS], *gp[MFD_GPU_MAX_ARENAS];
    mfd_gpu_t *g = s->store.gpu;
    if (h->want_gpu_arena && g && c->tp == &mfd_transport_unix) {
        for (size_t i = 0; i < g->n; i++) {
            mapflow__v1__gpu_arena__init(&ga[i]);
            ga[i].index = g->a[i].index;
            ga[i].ipc_handle.data = (uint8_t *)g->a[i].ipc.reserved;
            ga[i].ipc_handle.len = MF_CU_IPC_HANDLE_SIZE;
            ga[i].bytes = g->a[i].bytes;
            ga[i].pci_bus_id = g->a[i].pci;
            ga[i].uuid.data = g->a[i].uuid;
            ga[i].uuid.len = 16;
            gp[i] = &ga[i];
        }
        r.n_gpu_arenas = g->n;
        r.gpu_arenas = gp;
        c->gpu_arenas = g->n;
    }
    /* Per connection: DEBUG, or a busy node's INFO log is all hellos. */
    mfd_debug("connection %s: hello from '%s', namespace '%s'%s%s%s", c->peer, c->name, c->ns,
              pass_fd ? ", host arena passed" : "", c->gpu_arenas ? ", gpu arenas announced" : "",
              c->admin ? ", admin" : "");
    if (!pass_fd) {
        MFD_REPLY(c, rid, HELLO_REPLY, hello_reply, &r, NULL, 0);
        return;
    }
    /* The fd rides on the HelloReply frame itself: one sendmsg, nothing queued before. */
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.request_id = rid;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_HELLO_REPLY;
    env.hello_reply = &r;
    uint8_t *frame;
    size_t flen;
    if (mf_frame_encode(&env, NULL, 0, (uint32_t)s->cfg.max_frame, &frame, &flen) != MF_OK) {
        mfd_conn_fail(c, rid, MF_INTERNAL, "cannot encode HelloReply");
        return;
    }
    int afd = mfd_store_host_fd(&s->store);
    char cbuf[CMSG_SPACE(sizeof(int))];
    memset(cbuf, 0, sizeof(cbuf));
    struct iovec iov = {frame, flen};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof(cbuf);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &afd, sizeof(int));
    ssize_t n = evbuffer_get_length(c->out) == 0 ? sendmsg(c->fd, &msg, MSG_NOSIGNAL) : -1;
    if (n < 0) {
        free(frame);
        mfd_warn("connection %s: cannot pass the arena fd: %s", c->peer, strerror(errno));
        mfd_conn_close(c);
        return;
    }
    c->has_arena = 1;
    if ((size_t)n < flen) /* the fd went with the first byte; the rest is plain data */
        evbuffer_add(c->out, frame + n, flen - (size_t)n);
    free(frame);
    mfd_conn_flush(c);
}

/* ==== dispatch ======================================================================== */

/* Requests that act beyond the caller's namespace or on the daemon itself; NULL = any
 * connection may send it. */
static const char *admin_request(const mf_envelope_t *env)
{
    switch (env->body_case) {
    case MAPFLOW__V1__ENVELOPE__BODY_CONFIG_SET: return "ConfigSet";
    case MAPFLOW__V1__ENVELOPE__BODY_PROFILE_PUT: return "ProfilePut";
    case MAPFLOW__V1__ENVELOPE__BODY_FLUSH:
        return env->flush->all_namespaces ? "Flush of every namespace" : NULL;
    case MAPFLOW__V1__ENVELOPE__BODY_EVICT:
        return env->evict->all_namespaces ? "Evict of every namespace" : NULL;
    default: return NULL;
    }
}

void mfd_server_dispatch(mfd_conn_t *c, const mf_envelope_t *env, const uint8_t *payload,
                         size_t plen)
{
    double t0 = mf_now_s();
    uint64_t rid = env->request_id;
    mfd_metrics_request(&c->srv->metrics, (int)env->body_case);
    if (!c->hello_done && env->body_case != MAPFLOW__V1__ENVELOPE__BODY_HELLO) {
        mfd_count(&c->srv->metrics, MFD_C_CONN_REJECTED, 1);
        mfd_conn_fail(c, rid, MF_FAILED_PRECONDITION, "the first frame must be Hello");
        return;
    }
    const char *adm = admin_request(env);
    if (adm && !c->admin) {
        mfd_count(&c->srv->metrics, MFD_C_ADMIN_DENIED, 1);
        uint64_t dropped;
        if (mfd_log_limit_pass(&c->srv->denied_log, mf_now_ms(), 10000, &dropped)) {
            /* A tenant can send these at will: one line per 10 s, all of them counted. */
            char who[320];
            mfd_conn_describe(c, who, sizeof(who));
            mfd_info("%s refused: %s is not an admin connection (%llu more admin requests "
                     "from tenants refused, not logged)",
                     adm, who, (unsigned long long)dropped);
        }
        mfd_conn_error(c, rid, MF_PERMISSION_DENIED,
                       "%s needs an admin connection (the admin socket, or Hello.admin_token)",
                       adm);
        return;
    }
    switch (env->body_case) {
    case MAPFLOW__V1__ENVELOPE__BODY_HELLO: handle_hello(c, rid, env->hello); break;
    case MAPFLOW__V1__ENVELOPE__BODY_PUT_BEGIN: mfd_rows_put_begin(c, rid, env->put_begin); break;
    case MAPFLOW__V1__ENVELOPE__BODY_PUT_COMMIT:
        mfd_rows_put_commit(c, rid, env->put_commit, payload, plen, t0);
        break;
    case MAPFLOW__V1__ENVELOPE__BODY_PUT_ABORT: mfd_rows_put_abort(c, rid, env->put_abort); break;
    case MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_BEGIN:
        mfd_rows_region_begin(c, rid, env->put_region_begin);
        break;
    case MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_COMMIT:
        mfd_rows_region_commit(c, rid, env->put_region_commit, t0);
        break;
    case MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_ABORT:
        mfd_rows_region_abort(c, rid, env->put_region_abort);
        break;
    case MAPFLOW__V1__ENVELOPE__BODY_LOOKUP:
        mfd_rows_lookup(c, rid, env->lookup, payload, plen, t0);
        break;
    case MAPFLOW__V1__ENVELOPE__BODY_GET:
        mfd_rows_get(c, rid, env->get, payload, plen, t0);
        break;
    case MAPFLOW__V1__ENVELOPE__BODY_REMOTE_ARENA: mfd_peers_remote_arena(c, rid); break;
    case MAPFLOW__V1__ENVELOPE__BODY_RELEASE: mfd_rows_release(c, rid, env->release); break;
    case MAPFLOW__V1__ENVELOPE__BODY_DELETE: mfd_admin_delete(c, rid, env->delete_); break;
    case MAPFLOW__V1__ENVELOPE__BODY_LIST: mfd_admin_list(c, rid, env->list); break;
    case MAPFLOW__V1__ENVELOPE__BODY_STATS: mfd_admin_stats(c, rid); break;
    case MAPFLOW__V1__ENVELOPE__BODY_EVICT: mfd_admin_evict(c, rid, env->evict); break;
    case MAPFLOW__V1__ENVELOPE__BODY_FLUSH: mfd_admin_flush(c, rid, env->flush); break;
    case MAPFLOW__V1__ENVELOPE__BODY_CONFIG_GET:
        mfd_admin_config_get(c, rid, env->config_get);
        break;
    case MAPFLOW__V1__ENVELOPE__BODY_CONFIG_SET:
        mfd_admin_config_set(c, rid, env->config_set);
        break;
    case MAPFLOW__V1__ENVELOPE__BODY_HEALTH: mfd_admin_health(c, rid); break;
    case MAPFLOW__V1__ENVELOPE__BODY_PROFILE_PUT:
        mfd_admin_profile_put(c, rid, env->profile_put);
        break;
    case MAPFLOW__V1__ENVELOPE__BODY_PROFILE_GET:
        mfd_admin_profile_get(c, rid, env->profile_get);
        break;
    case MAPFLOW__V1__ENVELOPE__BODY_PROFILE_LIST:
        mfd_admin_profile_list(c, rid, env->profile_list);
        break;
    default:
        mfd_conn_error(c, rid, MF_UNIMPLEMENTED, "%s is not a request this daemon serves",
                       mf_envelope_body_name((int)env->body_case));
        break;
    }
}
