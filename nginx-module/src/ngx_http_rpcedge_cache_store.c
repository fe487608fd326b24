
/*
 * rpcedge cache: the stores. Once the node's answer has gone out, its
 * stores are made one after the other (ngx_http_rpcedge_cache_call.c), each
 * ended if it outlives its timeout; a key the request held without an answer
 * to store is released (that of a request that went away, by
 * ngx_http_rpcedge_cache_release.c).
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_rpcedge_cache.h"


static void ngx_http_rpcedge_cache_store_timed_out(ngx_event_t *ev);
static void ngx_http_rpcedge_cache_store(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx);
static void ngx_http_rpcedge_cache_put(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx, rpcedge_daemon_call_t *put);
static ngx_int_t ngx_http_rpcedge_cache_stored(ngx_http_request_t *r,
    void *data, ngx_int_t rc);


static void
ngx_http_rpcedge_cache_store_timed_out(ngx_event_t *ev)
{
    ngx_http_rpcedge_cache_ctx_t  *ctx = ev->data;

    rpcedge_count_t       counts[RPCEDGE_COUNTS_MAX];
    ngx_http_upstream_t  *u;

    u = ctx->call->upstream;

    /* a store not yet (or no longer) with the daemon ends on its own */

    if (u == NULL || u->cleanup == NULL || *u->cleanup == NULL) {
        return;
    }

    ngx_log_error(NGX_LOG_INFO, ctx->request->connection->log, 0,
                  "rpcedge cache: no answer to the store in time");

    /* as a store the daemon never answered: its subrequest ends without
     * its post handler, and with it maybe the request and ctx */

    ngx_http_rpcedge_count(counts, rpcedge_count_store(0, counts));

    (*u->cleanup)(ctx->call);
}


static void
ngx_http_rpcedge_cache_store(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx)
{
    rpcedge_daemon_call_t  put;

    if (rpcedge_cache_store(ctx->cache, &put)) {
        ngx_http_rpcedge_cache_put(r, ctx, &put);
    }
}


/* one store, a background subrequest; a batch's next store follows it */

static void
ngx_http_rpcedge_cache_put(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx, rpcedge_daemon_call_t *put)
{
    ngx_http_request_t          *sr;
    rpcedge_count_t              counts[RPCEDGE_COUNTS_MAX];
    ngx_http_post_subrequest_t  *ps;

    ps = ngx_palloc(r->pool, sizeof(ngx_http_post_subrequest_t));
    if (ps == NULL) {
        goto failed;
    }

    ps->handler = ngx_http_rpcedge_cache_stored;
    ps->data = ctx;

    sr = ngx_http_rpcedge_cache_call(r, &ctx->pass, put, ps, 0);
    if (sr == NULL) {
        goto failed;
    }

    /* the daemon compacts the entry before it answers: a timeout of its own */

    ctx->call = sr;
    ctx->timer.handler = ngx_http_rpcedge_cache_store_timed_out;

    ngx_add_timer(&ctx->timer, (ngx_msec_t) put->timeout_ms);

    return;

failed:

    /* a store never made counts as one the daemon never answered */

    ngx_http_rpcedge_count(counts, rpcedge_count_store(0, counts));
}


static ngx_int_t
ngx_http_rpcedge_cache_stored(ngx_http_request_t *r, void *data,
    ngx_int_t rc)
{
    ngx_http_rpcedge_cache_ctx_t   *ctx = data;

    ngx_uint_t                      status;
    rpcedge_count_t                 counts[RPCEDGE_COUNTS_MAX];
    rpcedge_daemon_call_t           put;
    ngx_http_rpcedge_cache_call_t  *call;

    if (ctx->timer.timer_set) {
        ngx_del_timer(&ctx->timer);
    }

    call = ngx_http_get_module_ctx(r, ngx_http_rpcedge_cache_module);

    status = (call && rc == NGX_OK) ? call->status : 0;

    if (status != NGX_HTTP_NO_CONTENT) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "rpcedge cache: store not taken (%i, status %ui)",
                      rc, call ? call->status : 0);
    }

    ngx_http_rpcedge_count(counts, rpcedge_count_store((uint16_t) status,
                                                       counts));

    if (rpcedge_cache_next_store(ctx->cache, &put)) {
        ngx_http_rpcedge_cache_put(ctx->request, ctx, &put);
    }

    /* the client has its answer whatever the daemon said */

    return NGX_OK;
}


/* the client has the whole answer on its way: store it behind it, or count
 * why the core would not keep it */

void
ngx_http_rpcedge_cache_ended(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx, ngx_int_t rc)
{
    size_t                 n;
    ngx_uint_t             gone;
    rpcedge_count_t        counts[RPCEDGE_COUNTS_MAX];
    rpcedge_daemon_call_t  release;

    ctx->ended = 1;

    /* nginx ends a request whose client is gone with its subrequests unrun */

    gone = (rc == NGX_ERROR || r->connection->error);

    if (ctx->holding && !gone) {
        ctx->holding = 0;
        ngx_http_rpcedge_cache_store(r, ctx);
    }

    while ((n = rpcedge_count_refusal(ctx->cache, counts))) {
        ngx_http_rpcedge_count(counts, n);
    }

    /* a key held without an answer to store: released, so that the requests
     * waiting for it go to the node themselves; the answer is not waited
     * for (the daemon drops a held key at the lock's time anyway) */

    if (rpcedge_cache_release(ctx->cache, &release)) {
        if (gone) {
            ngx_http_rpcedge_cache_let_go(ctx, &release);

        } else {
            (void) ngx_http_rpcedge_cache_call(r, &ctx->pass, &release, NULL, 0);
        }
    }
}


void
ngx_http_rpcedge_cache_cleanup(void *data)
{
    ngx_http_rpcedge_cache_ctx_t  *ctx = data;

    rpcedge_daemon_call_t  release;

    ngx_http_rpcedge_cache_stop_timer(ctx);

    if (ctx->cache && rpcedge_cache_release(ctx->cache, &release)) {
        ngx_http_rpcedge_cache_let_go(ctx, &release);
    }

    rpcedge_cache_free(ctx->cache);
    ctx->cache = NULL;
}


void
ngx_http_rpcedge_cache_stop_timer(void *data)
{
    ngx_http_rpcedge_cache_ctx_t  *ctx = data;

    if (ctx->timer.timer_set) {
        ngx_del_timer(&ctx->timer);
    }
}
