/*
 * mf_ucx_setup — the UCX setup both ends of a UCX connection share: libmapflow's ucx:
 * transport (client/transport_ucx.c) and mapflowd's UCX module (daemon/ucx.c). One
 * place says which UCX features a MapFlow context asks for (RMA, active messages,
 * wakeup), how its worker is made (event fd, the frame handler on MF_UCX_AM_FRAME) and
 * how a client endpoint connects (client-server wire-up to HOST:PORT, peer error
 * handling). Frames, RMA, listeners and the event loops stay with their owners.
 *
 * UCX is reached through a table of its functions (mf_ucx_api_t): the daemon links UCX
 * and passes the functions themselves, libmapflow loads UCX with dlopen on first use and
 * passes what it found, so this module links against nothing.
 *
 * Owns nothing after it returns: the context, worker and endpoint belong to the caller.
 * Thread safety: any thread, on objects no other thread uses meanwhile (UCX's rules).
 */
#ifndef MF_UCX_SETUP_H
#define MF_UCX_SETUP_H

#include <stddef.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include "mf_status.h"

/* One protocol frame (proto/mf_frame.h) = one active message of this id: part of the
 * wire contract between libmapflow and mapflowd, and between daemons. */
#define MF_UCX_AM_FRAME 17u

#define MF_UCX_SETUP_FUNCS(X) \
    X(ucs_status_string) \
    X(ucp_config_read) \
    X(ucp_config_release) \
    X(ucp_init_version) \
    X(ucp_cleanup) \
    X(ucp_worker_create) \
    X(ucp_worker_destroy) \
    X(ucp_worker_get_efd) \
    X(ucp_worker_set_am_recv_handler) \
    X(ucp_ep_create)

/* The UCX functions the setup calls (see above for where they come from). */
typedef struct mf_ucx_api {
#define MF_UCX_X(f) __typeof__(f) *f;
    MF_UCX_SETUP_FUNCS(MF_UCX_X)
#undef MF_UCX_X
} mf_ucx_api_t;

/*
 * A context named name (UCX's logs) and one worker in thread_mode with its event fd and
 * on_frame(arg, …) receiving every MF_UCX_AM_FRAME message whole. MF_OK with *ctx,
 * *worker, *efd; otherwise MF_UNAVAILABLE, the step that failed in err, and nothing left
 * to clean up. UCX reads its UCX_* environment here (set what must hold before).
 */
mf_status_t mf_ucx_worker_open(const mf_ucx_api_t *api, const char *name,
                               ucs_thread_mode_t thread_mode, ucp_am_recv_callback_t on_frame,
                               void *arg, ucp_context_h *ctx, ucp_worker_h *worker, int *efd,
                               char *err, size_t errlen);
/* Destroys the worker, then the context (their endpoints closed before). */
void mf_ucx_worker_close(const mf_ucx_api_t *api, ucp_context_h ctx, ucp_worker_h worker);

/*
 * A client endpoint on worker to the listener at ss (sl bytes): client-server wire-up,
 * peer failure reported to on_error(arg, ep, status). The UCX status is returned (the
 * caller words the message: it knows the address as the user wrote it); *ep is NULL
 * unless UCS_OK.
 */
ucs_status_t mf_ucx_ep_open(const mf_ucx_api_t *api, ucp_worker_h worker,
                            const struct sockaddr_storage *ss, socklen_t sl,
                            ucp_err_handler_cb_t on_error, void *arg, ucp_ep_h *ep);

#endif /* MF_UCX_SETUP_H */
