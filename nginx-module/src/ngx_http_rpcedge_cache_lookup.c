
/*
 * rpcedge cache: looking a request up. A precontent handler reads the request
 * body, makes the core's cache exchange for it, and takes the steps the core
 * gives (rpcedge_cache_look_up, then rpcedge_cache_looked_up after each
 * answer): a hit from the hot tier, a lookup (a background subrequest that
 * waits at most as long as the core says), or the node, with the body the
 * core gives in place of the client's (a batch less the calls the cache
 * answered). A hit is sent from here.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_rpcedge_cache.h"


static void ngx_http_rpcedge_cache_body_handler(ngx_http_request_t *r);
static void ngx_http_rpcedge_cache_new(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx, rpcedge_str_t body);
static void ngx_http_rpcedge_cache_lookup(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx);
static void ngx_http_rpcedge_cache_step(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx, int32_t step,
    rpcedge_cache_next_t *next);
static ngx_int_t ngx_http_rpcedge_cache_ask(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx, rpcedge_daemon_call_t *lookup);
static ngx_int_t ngx_http_rpcedge_cache_forward(ngx_http_request_t *r,
    rpcedge_str_t body);
static ngx_int_t ngx_http_rpcedge_cache_looked_up(ngx_http_request_t *r,
    void *data, ngx_int_t rc);
static void ngx_http_rpcedge_cache_timed_out(ngx_event_t *ev);
static ngx_int_t ngx_http_rpcedge_cache_send_hit(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx);


ngx_int_t
ngx_http_rpcedge_cache_handler(ngx_http_request_t *r)
{
    ngx_int_t                       rc;
    rpcedge_str_t                   body;
    ngx_pool_cleanup_t             *cln;
    ngx_http_cleanup_t             *hcln;
    ngx_http_rpcedge_cache_ctx_t   *ctx;
    ngx_http_rpcedge_cache_conf_t  *conf;

    /* subrequests (this module's own among them) are not looked up */

    if (r != r->main) {
        return NGX_DECLINED;
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_rpcedge_cache_module);

    if (ctx) {
        switch (ctx->state) {

        case ngx_http_rpcedge_cache_reading:
        case ngx_http_rpcedge_cache_looking:
            return NGX_DONE;

        case ngx_http_rpcedge_cache_hit:
            return ngx_http_rpcedge_cache_send_hit(r, ctx);

        case ngx_http_rpcedge_cache_answered:
            return NGX_DONE;

        case ngx_http_rpcedge_cache_failed_on:
            return NGX_HTTP_INTERNAL_SERVER_ERROR;

        default: /* ngx_http_rpcedge_cache_pass_on */
            return NGX_DECLINED;
        }
    }

    conf = ngx_http_get_module_loc_conf(r, ngx_http_rpcedge_cache_module);

    if (!conf->enable) {
        return NGX_DECLINED;
    }

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_rpcedge_cache_ctx_t));
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_ERROR;
    }

    cln->handler = ngx_http_rpcedge_cache_cleanup;
    cln->data = ctx;

    /* runs on terminate too, while the pool may outlive the request */

    hcln = ngx_http_cleanup_add(r, 0);
    if (hcln == NULL) {
        return NGX_ERROR;
    }

    hcln->handler = ngx_http_rpcedge_cache_stop_timer;
    hcln->data = ctx;

    ctx->request = r;
    ctx->pass = conf->pass;
    ctx->timer.handler = ngx_http_rpcedge_cache_timed_out;
    ctx->timer.data = ctx;
    ctx->timer.log = r->connection->log;
    ctx->timer.cancelable = 1;

    ngx_http_set_ctx(r, ctx, ngx_http_rpcedge_cache_module);

    /* a Beacon-API read is looked up by its path: there is no body to read */

    if (r->method == NGX_HTTP_GET) {
        ngx_http_rpcedge_cache_lookup(r, ctx);
        return ngx_http_rpcedge_cache_handler(r);
    }

    /*
     * JSON-RPC is POST; anything else, and a body too long for a lookup
     * (not worth reading first), is a BYPASS: the core, without the body,
     * says why
     */

    if (r->method != NGX_HTTP_POST
        || (r->headers_in.content_length_n > 0
            && !rpcedge_cache_takes_length(conf->settings,
                                           r->headers_in.content_length_n)))
    {
        ngx_memzero(&body, sizeof(rpcedge_str_t));
        ngx_http_rpcedge_cache_new(r, ctx, body);

        ctx->state = ngx_http_rpcedge_cache_pass_on;
        return NGX_DECLINED;
    }

    ctx->state = ngx_http_rpcedge_cache_reading;

    rc = ngx_http_read_client_request_body(r,
                                           ngx_http_rpcedge_cache_body_handler);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    ngx_http_finalize_request(r, NGX_DONE);
    return NGX_DONE;
}


static void
ngx_http_rpcedge_cache_body_handler(ngx_http_request_t *r)
{
    ngx_http_rpcedge_cache_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_rpcedge_cache_module);

    ngx_http_rpcedge_cache_lookup(r, ctx);

    r->write_event_handler = ngx_http_core_run_phases;
    ngx_http_core_run_phases(r);
}


/* the core's cache exchange for r, whose body is body (NULL data: not held) */

static void
ngx_http_rpcedge_cache_new(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx, rpcedge_str_t body)
{
    size_t                          n;
    ngx_str_t                       value;
    rpcedge_str_t                   ns, method, path;
    rpcedge_header_t               *headers;
    ngx_http_rpcedge_cache_conf_t  *conf;

    conf = ngx_http_get_module_loc_conf(r, ngx_http_rpcedge_cache_module);

    method.data = r->method_name.data;
    method.len = r->method_name.len;

    /* as the client sent it, with its query: a Beacon-API read's key */

    path.data = r->unparsed_uri.data;
    path.len = r->unparsed_uri.len;

    /*
     * the namespace is where nginx routed the request, as configured: never
     * the client's Host, which need not name the server block that matched
     */

    ngx_memzero(&ns, sizeof(rpcedge_str_t));

    value = conf->ns.len ? conf->ns : conf->default_ns;

    if (value.len) {
        ns.data = value.data;
        ns.len = value.len;
    }

    /* all of them: Accept-Encoding, Accept, what a stored answer varies on */

    headers = ngx_http_rpcedge_cache_headers(r->pool, &r->headers_in.headers,
                                             NULL, NULL, &n);
    if (headers == NULL) {
        return;
    }

    ctx->cache = rpcedge_cache_new(conf->settings, ns, method, path,
                                   body.data, body.len, headers, n);
}


static void
ngx_http_rpcedge_cache_lookup(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx)
{
    int32_t                         step;
    rpcedge_hot_tier_t              tier;
    rpcedge_cache_next_t            next;
    ngx_http_rpcedge_cache_conf_t  *conf;

    conf = ngx_http_get_module_loc_conf(r, ngx_http_rpcedge_cache_module);

    ctx->state = ngx_http_rpcedge_cache_pass_on;

    ngx_http_rpcedge_cache_new(r, ctx, ngx_http_rpcedge_request_body(r));

    if (ctx->cache == NULL) {
        return;
    }

    ngx_http_rpcedge_cache_release_orphans(r, &ctx->pass);

    step = rpcedge_cache_look_up(ctx->cache,
                                 ngx_http_rpcedge_cache_lend_hot(conf->hot,
                                                                 &tier),
                                 ngx_time(), ngx_http_rpcedge_min_length(r),
                                 &next);

    ngx_http_rpcedge_cache_step(r, ctx, step, &next);
}


/* takes the step the core gives: a hit, a lookup to make (one that cannot be
 * made fails as one that got no answer), or on to the node */

static void
ngx_http_rpcedge_cache_step(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx, int32_t step,
    rpcedge_cache_next_t *next)
{
    while (step == RPCEDGE_CACHE_ASK
           && ngx_http_rpcedge_cache_ask(r, ctx, &next->call) != NGX_OK)
    {
        step = rpcedge_cache_looked_up(ctx->cache, 0, NULL, 0, NULL, 0, NULL,
                                       0, 0, next);
    }

    switch (step) {

    case RPCEDGE_CACHE_ASK:
        ctx->state = ngx_http_rpcedge_cache_looking;
        return;

    case RPCEDGE_CACHE_HIT:
        ctx->state = ngx_http_rpcedge_cache_hit;
        return;

    default: /* RPCEDGE_CACHE_NODE */
        ctx->state = ngx_http_rpcedge_cache_pass_on;

        if (ngx_http_rpcedge_cache_forward(r, next->node_body) != NGX_OK) {
            ctx->state = ngx_http_rpcedge_cache_failed_on;
        }
    }
}


/* the lookup, a subrequest that waits as long as the core says
 * (rpcedge_cache_timeout, or the lock's time for a miss that waits for
 * another's answer) */

static ngx_int_t
ngx_http_rpcedge_cache_ask(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx, rpcedge_daemon_call_t *lookup)
{
    ngx_http_request_t          *sr;
    ngx_http_post_subrequest_t  *ps;

    ps = ngx_palloc(r->pool, sizeof(ngx_http_post_subrequest_t));
    if (ps == NULL) {
        return NGX_ERROR;
    }

    ps->handler = ngx_http_rpcedge_cache_looked_up;
    ps->data = ctx;

    sr = ngx_http_rpcedge_cache_call(r, &ctx->pass, lookup, ps, 1);
    if (sr == NULL) {
        return NGX_ERROR;
    }

    ctx->call = sr;
    ctx->timer.handler = ngx_http_rpcedge_cache_timed_out;

    ngx_add_timer(&ctx->timer, (ngx_msec_t) lookup->timeout_ms);

    return NGX_OK;
}


/* the lookups are over: the node gets the body the core gives (a batch less
 * the calls the cache answered), if any, in place of the client's */

static ngx_int_t
ngx_http_rpcedge_cache_forward(ngx_http_request_t *r, rpcedge_str_t body)
{
    u_char         *p;
    ngx_buf_t      *b;
    ngx_chain_t    *cl;

    if (body.data == NULL) {
        return NGX_OK;
    }

    /* the core merges the node's answer as if it had the smaller batch */

    b = ngx_calloc_buf(r->pool);
    cl = ngx_alloc_chain_link(r->pool);

    if (b == NULL || cl == NULL || r->request_body == NULL) {
        return NGX_ERROR;
    }

    /* the body stays in the cache's handle until the request's pool goes */

    b->start = (u_char *) body.data;
    b->last = b->start + body.len;
    b->pos = b->start;
    b->end = b->last;
    b->memory = 1;
    b->last_buf = 1;

    cl->buf = b;
    cl->next = NULL;

    r->request_body->bufs = cl;
    r->request_body->buf = b;
    r->headers_in.content_length_n = body.len;
    r->headers_in.chunked = 0;

    if (r->headers_in.content_length) {
        p = ngx_pnalloc(r->pool, NGX_OFF_T_LEN);
        if (p == NULL) {
            return NGX_ERROR;
        }

        r->headers_in.content_length->value.data = p;
        r->headers_in.content_length->value.len =
                                  ngx_sprintf(p, "%O", (off_t) body.len) - p;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_rpcedge_cache_looked_up(ngx_http_request_t *r, void *data,
    ngx_int_t rc)
{
    ngx_http_rpcedge_cache_ctx_t   *ctx = data;

    int32_t                         step;
    ngx_http_request_t             *mr;
    rpcedge_hot_tier_t              tier;
    rpcedge_cache_next_t            next;
    ngx_http_rpcedge_cache_call_t  *call;
    ngx_http_rpcedge_cache_conf_t  *conf;
#if (NGX_DEBUG)
    rpcedge_str_t                   status;
#endif

    /* the client has gone on without us (the timeout), or this is the
     * error page after a failed call */

    if (ctx->state != ngx_http_rpcedge_cache_looking) {
        return NGX_OK;
    }

    mr = ctx->request;

    if (ctx->timer.timer_set) {
        ngx_del_timer(&ctx->timer);
    }

    call = ngx_http_get_module_ctx(r, ngx_http_rpcedge_cache_module);

    if (call && rc == NGX_OK && call->complete && !call->too_large
        && call->status != 0 && call->status <= 0xffff)
    {
        /* what it found is kept hot too: a call's hit, a batch's entries */

        conf = ngx_http_get_module_loc_conf(mr, ngx_http_rpcedge_cache_module);

        step = rpcedge_cache_looked_up(ctx->cache, (uint16_t) call->status,
                                       call->headers, call->nheaders,
                                       call->answer.data, call->answer.len,
                                       ngx_http_rpcedge_cache_lend_hot(conf->hot,
                                                                       &tier),
                                       ngx_time(),
                                       ngx_http_rpcedge_min_length(mr), &next);

    } else {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "rpcedge cache: lookup failed (%i, status %ui)",
                      rc, call ? call->status : 0);

        step = rpcedge_cache_looked_up(ctx->cache, 0, NULL, 0, NULL, 0, NULL,
                                       0, 0, &next);
    }

    /* another lookup: the wait for the answer another request for the key
     * is getting */

    ngx_http_rpcedge_cache_step(mr, ctx, step, &next);

    if (ctx->state == ngx_http_rpcedge_cache_looking) {
        return NGX_OK;
    }

#if (NGX_DEBUG)
    status = rpcedge_cache_status(ctx->cache, 1);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "rpcedge cache lookup: %*s", status.len, status.data);
#endif

    if (ngx_http_post_request(mr, NULL) != NGX_OK) {
        return NGX_ERROR;
    }

    /* fail open: a daemon that failed never fails the client's request */

    return NGX_OK;
}


static void
ngx_http_rpcedge_cache_timed_out(ngx_event_t *ev)
{
    ngx_http_rpcedge_cache_ctx_t  *ctx = ev->data;

    int32_t                step;
    ngx_connection_t      *c;
    ngx_http_upstream_t   *u;
    ngx_http_request_t    *r, *sr;
    rpcedge_cache_next_t   next;

    r = ctx->request;
    c = r->connection;
    sr = ctx->call;

    ngx_log_error(NGX_LOG_INFO, c->log, 0,
                  "rpcedge cache: no answer from the daemon in time");

    step = rpcedge_cache_looked_up(ctx->cache, 0, NULL, 0, NULL, 0, NULL, 0, 0,
                                   &next);

    ngx_http_rpcedge_cache_step(r, ctx, step, &next);

    /*
     * end the lookup now: a background subrequest holds the client's
     * connection (keepalive, an HTTP/2 stream) until it ends
     */

    u = sr->upstream;

    if (u && u->cleanup && *u->cleanup) {
        (*u->cleanup)(sr);
    }

    r->write_event_handler(r);
    ngx_http_run_posted_requests(c);
}


static ngx_int_t
ngx_http_rpcedge_cache_send_hit(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx)
{
    u_char            *v, *p;
    size_t             i;
    uint16_t           status;
    ngx_int_t          rc, coded;
    ngx_buf_t         *b;
    ngx_chain_t        out;
    rpcedge_str_t      body, name, value;
    ngx_table_elt_t   *h;
    rpcedge_header_t   header;

    ctx->state = ngx_http_rpcedge_cache_answered;

    if (ngx_http_rpcedge_answer_from_cache(r) != NGX_OK) {
        return NGX_ERROR;
    }

    coded = rpcedge_cache_hit(ctx->cache, &status, &body);

    r->headers_out.status = status;

    /* the core's headers: Content-Type, Content-Encoding, Vary, the node's */

    for (i = 0; rpcedge_cache_hit_header(ctx->cache, i, &name, &value); i++) {
        header.name = name.data;
        header.name_len = name.len;
        header.value = value.data;
        header.value_len = value.len;

        h = ngx_http_rpcedge_push_copy(r->pool, &r->headers_out.headers,
                                       &header);
        if (h == NULL) {
            return NGX_ERROR;
        }

        if (name.len == sizeof("content-type") - 1
            && ngx_strncmp(name.data, "content-type", name.len) == 0)
        {
            /* the type alone, kept apart, as nginx's charset filter wants it */

            h->hash = 0;

            v = h->value.data;
            p = ngx_strlchr(v, v + h->value.len, ';');

            r->headers_out.content_type = h->value;
            r->headers_out.content_type_len = p ? (size_t) (p - v)
                                                : h->value.len;
            r->headers_out.content_type_lowcase = NULL;

            continue;
        }

        if (coded && name.len == sizeof("content-encoding") - 1
            && ngx_strncmp(name.data, "content-encoding", name.len) == 0)
        {
            r->headers_out.content_encoding = h;
        }
    }

    r->headers_out.content_length_n = body.len;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        ngx_http_finalize_request(r, rc);
        return NGX_DONE;
    }

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_ERROR;
    }

    /* the body stays in ctx->cache until the request's pool goes */

    b->pos = (u_char *) body.data;
    b->last = b->pos + body.len;
    b->memory = body.len ? 1 : 0;
    b->last_buf = 1;
    b->last_in_chain = 1;

    out.buf = b;
    out.next = NULL;

    ngx_http_finalize_request(r, ngx_http_output_filter(r, &out));
    return NGX_DONE;
}
