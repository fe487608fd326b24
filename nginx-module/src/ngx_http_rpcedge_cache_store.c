
/*
 * rpcedge cache: the calls to the daemon. Each is the core's (method, path,
 * headers, body) made as a background subrequest to rpcedge_cache_pass.
 * Once the node's answer has gone out, its stores are made one after the
 * other, each ended if it outlives its timeout; a key the request held
 * without an answer to store is released (that of a request that went away,
 * by ngx_http_rpcedge_cache_release.c).
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
static ngx_int_t ngx_http_rpcedge_cache_set_body(ngx_http_request_t *sr,
    rpcedge_str_t body);


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

    sr = ngx_http_rpcedge_cache_call(r, put, ps, 0);
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


/* a call's body, bytes that outlive it */

static ngx_int_t
ngx_http_rpcedge_cache_set_body(ngx_http_request_t *sr, rpcedge_str_t body)
{
    ngx_buf_t                *b;
    ngx_chain_t              *cl;
    ngx_http_request_body_t  *rb;

    rb = ngx_pcalloc(sr->pool, sizeof(ngx_http_request_body_t));
    b = ngx_calloc_buf(sr->pool);
    cl = ngx_alloc_chain_link(sr->pool);

    if (rb == NULL || b == NULL || cl == NULL) {
        return NGX_ERROR;
    }

    b->start = (u_char *) body.data;
    b->pos = b->start;
    b->last = b->start + body.len;
    b->end = b->last;
    b->memory = body.len ? 1 : 0;
    b->last_buf = 1;

    cl->buf = b;
    cl->next = NULL;

    rb->bufs = cl;
    sr->request_body = rb;
    sr->headers_in.content_length_n = body.len;

    return NGX_OK;
}


/*
 * the core's call to the daemon as a background subrequest: its method,
 * rpcedge_cache_pass + its path and its headers (none of the client's),
 * copied into the request's pool; its body, which stays in ctx->cache until
 * the request's pool goes
 */

ngx_http_request_t *
ngx_http_rpcedge_cache_call(ngx_http_request_t *r, rpcedge_daemon_call_t *dc,
    ngx_http_post_subrequest_t *ps, ngx_uint_t lookup)
{
    u_char                         *p;
    size_t                          i;
    ngx_str_t                       uri;
    ngx_http_request_t             *sr;
    ngx_http_rpcedge_cache_call_t  *call;
    ngx_http_rpcedge_cache_conf_t  *conf;

    conf = ngx_http_get_module_loc_conf(r, ngx_http_rpcedge_cache_module);

    call = ngx_pcalloc(r->pool, sizeof(ngx_http_rpcedge_cache_call_t));
    if (call == NULL) {
        return NULL;
    }

    uri.len = conf->pass.len + dc->path.len;
    uri.data = ngx_pnalloc(r->pool, uri.len);
    if (uri.data == NULL) {
        return NULL;
    }

    p = ngx_cpymem(uri.data, conf->pass.data, conf->pass.len);
    ngx_memcpy(p, dc->path.data, dc->path.len);

    if (ngx_http_subrequest(r, &uri, NULL, &sr, ps,
                            NGX_HTTP_SUBREQUEST_BACKGROUND)
        != NGX_OK)
    {
        return NULL;
    }

    /* nginx knows the method by its name only: proxy_pass sends the name */

    sr->method = NGX_HTTP_UNKNOWN;
    sr->method_name.len = dc->method.len;
    sr->method_name.data = ngx_pnalloc(r->pool, dc->method.len);
    if (sr->method_name.data == NULL) {
        return NULL;
    }

    ngx_memcpy(sr->method_name.data, dc->method.data, dc->method.len);

    if (ngx_list_init(&sr->headers_in.headers, r->pool, 4,
                      sizeof(ngx_table_elt_t))
        != NGX_OK)
    {
        return NULL;
    }

    for (i = 0; i < dc->headers_len; i++) {
        if (ngx_http_rpcedge_push_copy(r->pool, &sr->headers_in.headers,
                                       &dc->headers[i])
            == NULL)
        {
            return NULL;
        }
    }

    sr->headers_in.content_length = NULL;
    sr->headers_in.transfer_encoding = NULL;
    sr->headers_in.chunked = 0;

    if (dc->body.data != NULL) {
        if (ngx_http_rpcedge_cache_set_body(sr, dc->body) != NGX_OK) {
            return NULL;
        }

    } else {
        sr->request_body = NULL;
        sr->headers_in.content_length_n = -1;
    }

    call->lookup = lookup;

    ngx_http_set_ctx(sr, call, ngx_http_rpcedge_cache_module);

    return sr;
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
            (void) ngx_http_rpcedge_cache_call(r, &release, NULL, 0);
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
