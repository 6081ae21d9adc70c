/* mf_ucx_setup — UCX context, worker and client endpoint setup for both ends (see
 * mf_ucx_setup.h). */
#include "mf_ucx_setup.h"

#include <stdio.h>
#include <string.h>

mf_status_t mf_ucx_worker_open(const mf_ucx_api_t *api, const char *name,
                               ucs_thread_mode_t thread_mode, ucp_am_recv_callback_t on_frame,
                               void *arg, ucp_context_h *ctx, ucp_worker_h *worker, int *efd,
                               char *err, size_t errlen)
{
    *ctx = NULL;
    *worker = NULL;
    *efd = -1;
    ucp_config_t *cfg = NULL;
    ucs_status_t st = api->ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) {
        snprintf(err, errlen, "ucx: config: %s", api->ucs_status_string(st));
        return MF_UNAVAILABLE;
    }
    /* RMA: rows move one-sided into and out of the daemon's arena; AM: frames; WAKEUP:
     * the worker's event fd sits in the caller's poll / event loop. */
    ucp_params_t cp = {0};
    cp.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                    UCP_PARAM_FIELD_NAME;
    cp.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    cp.mt_workers_shared = 0; /* one worker per context */
    cp.name = name;
    ucp_context_h c = NULL;
    st = api->ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, &cp, cfg, &c);
    api->ucp_config_release(cfg);
    if (st != UCS_OK) {
        snprintf(err, errlen, "ucx: init: %s", api->ucs_status_string(st));
        return MF_UNAVAILABLE;
    }
    ucp_worker_params_t wp = {0};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = thread_mode;
    ucp_worker_h w = NULL;
    if ((st = api->ucp_worker_create(c, &wp, &w)) != UCS_OK) {
        snprintf(err, errlen, "ucx: worker: %s", api->ucs_status_string(st));
        api->ucp_cleanup(c);
        return MF_UNAVAILABLE;
    }
    int fd = -1;
    if ((st = api->ucp_worker_get_efd(w, &fd)) != UCS_OK) {
        snprintf(err, errlen, "ucx: worker event fd: %s", api->ucs_status_string(st));
        mf_ucx_worker_close(api, c, w);
        return MF_UNAVAILABLE;
    }
    /* Whole messages only: a frame is handed over in one piece or not at all. */
    ucp_am_handler_param_t ap = {0};
    ap.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    ap.id = MF_UCX_AM_FRAME;
    ap.flags = UCP_AM_FLAG_WHOLE_MSG;
    ap.cb = on_frame;
    ap.arg = arg;
    if ((st = api->ucp_worker_set_am_recv_handler(w, &ap)) != UCS_OK) {
        snprintf(err, errlen, "ucx: active message handler: %s", api->ucs_status_string(st));
        mf_ucx_worker_close(api, c, w);
        return MF_UNAVAILABLE;
    }
    *ctx = c;
    *worker = w;
    *efd = fd;
    return MF_OK;
}

void mf_ucx_worker_close(const mf_ucx_api_t *api, ucp_context_h ctx, ucp_worker_h worker)
{
    if (worker)
        api->ucp_worker_destroy(worker);
    if (ctx)
        api->ucp_cleanup(ctx);
}

ucs_status_t mf_ucx_ep_open(const mf_ucx_api_t *api, ucp_worker_h worker,
                            const struct sockaddr_storage *ss, socklen_t sl,
                            ucp_err_handler_cb_t on_error, void *arg, ucp_ep_h *ep)
{
    /* Peer error handling: a dead far side fails the endpoint (and its operations)
     * instead of leaving them waiting. */
    ucp_ep_params_t p = {0};
    p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                   UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    p.sockaddr.addr = (const struct sockaddr *)ss;
    p.sockaddr.addrlen = sl;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = on_error;
    p.err_handler.arg = arg;
    ucs_status_t st = api->ucp_ep_create(worker, &p, ep);
    if (st != UCS_OK)
        *ep = NULL;
    return st;
}
