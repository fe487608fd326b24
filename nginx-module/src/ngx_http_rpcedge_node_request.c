
/*
 * The request the node gets.
 *
 * Where rpcedge has work on the node's answer, the node is asked for
 * identity (no Accept-Encoding) and, to transcode, for SSZ (the core's
 * Accept). nginx keeps one header list per request, which every module reads:
 * gzip and gunzip, proxy_cache's Vary, $http_accept_encoding in a log or a
 * map, SSI's subrequests. So the node's list stands in for the client's only
 * while an upstream module makes the node's request from it: around the
 * location's content handler, and around the handler it leaves to run once
 * the request body is in. Before and after, every module sees the client's
 * request as it came (r->headers_in.accept_encoding is never touched).
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_rpcedge_module.h"


typedef struct {
    ngx_list_t                  client;
    ngx_list_t                  node;
#if (NGX_HTTP_HEADERS)
    ngx_table_elt_t            *client_accept;
    ngx_table_elt_t            *node_accept;
#endif
    ngx_http_handler_pt         content_handler;
    ngx_http_client_body_handler_pt  body_handler;
    unsigned                    open:1;
} ngx_http_rpcedge_node_request_ctx_t;


static ngx_http_rpcedge_node_request_ctx_t *
    ngx_http_rpcedge_node_request_ctx(ngx_http_request_t *r,
    ngx_uint_t body_handler);
static void ngx_http_rpcedge_node_request_cleanup(void *data);
static ngx_int_t ngx_http_rpcedge_node_request_handler(ngx_http_request_t *r);
static void ngx_http_rpcedge_node_request_body_handler(ngx_http_request_t *r);
static void ngx_http_rpcedge_node_request_open(ngx_http_request_t *r,
    ngx_http_rpcedge_node_request_ctx_t *ctx);
static void ngx_http_rpcedge_node_request_shut(ngx_http_request_t *r,
    ngx_http_rpcedge_node_request_ctx_t *ctx);
static void ngx_http_rpcedge_list_move(ngx_list_t *dst, ngx_list_t *src);


/*
 * From the precontent phase, where the node is to answer identity: the
 * node's list is made now (the client's without Accept-Encoding, and with
 * `accept` in place of its Accept where given), and stands in while the
 * location's content handler runs. A location without one (static files)
 * asks no node.
 */

ngx_int_t
ngx_http_rpcedge_node_request(ngx_http_request_t *r, rpcedge_str_t accept)
{
    ngx_uint_t                            i;
    ngx_list_part_t                      *part;
    ngx_table_elt_t                      *h, *copy;
    ngx_pool_cleanup_t                   *cln;
    ngx_http_rpcedge_node_request_ctx_t  *ctx;

    if (r->content_handler == NULL) {
        return NGX_OK;
    }

    /*
     * kept where an internal redirect, which voids the request's module
     * contexts, cannot lose it: the window must still shut, and the body's
     * handler still run
     */

    cln = ngx_pool_cleanup_add(r->pool,
                               sizeof(ngx_http_rpcedge_node_request_ctx_t));
    if (cln == NULL) {
        return NGX_ERROR;
    }

    ctx = cln->data;
    ngx_memzero(ctx, sizeof(ngx_http_rpcedge_node_request_ctx_t));
    cln->handler = ngx_http_rpcedge_node_request_cleanup;

    if (ngx_list_init(&ctx->node, r->pool, 20, sizeof(ngx_table_elt_t))
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    part = &r->headers_in.headers.part;
    h = part->elts;

    for (i = 0; /* void */; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if ((accept.data
             && h[i].key.len == sizeof("Accept") - 1
             && ngx_strncasecmp(h[i].key.data, (u_char *) "Accept",
                                sizeof("Accept") - 1) == 0)
            || (h[i].key.len == sizeof("Accept-Encoding") - 1
                && ngx_strncasecmp(h[i].key.data, (u_char *) "Accept-Encoding",
                                   sizeof("Accept-Encoding") - 1) == 0))
        {
            continue;
        }

        copy = ngx_list_push(&ctx->node);
        if (copy == NULL) {
            return NGX_ERROR;
        }

        *copy = h[i];
    }

#if (NGX_HTTP_HEADERS)
    ctx->node_accept = r->headers_in.accept;
#endif

    if (accept.data) {

        /* hashed as nginx hashes a request header: proxy_set_header wins */

        copy = ngx_http_rpcedge_push_header(&ctx->node, "accept",
                                            (u_char *) accept.data,
                                            accept.len);
        if (copy == NULL) {
            return NGX_ERROR;
        }

        ngx_str_set(&copy->key, "Accept");
        copy->hash = ngx_hash_key(copy->lowcase_key, copy->key.len);

#if (NGX_HTTP_HEADERS)
        ctx->node_accept = copy;
#endif

        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "rpcedge asks the node: Accept: %*s",
                       accept.len, accept.data);
    }

    ctx->content_handler = r->content_handler;
    r->content_handler = ngx_http_rpcedge_node_request_handler;

    return NGX_OK;
}


/*
 * the request's latest (or the one that holds the body's handler), found as
 * ngx_pool_run_cleanup_file finds a file
 */

static ngx_http_rpcedge_node_request_ctx_t *
ngx_http_rpcedge_node_request_ctx(ngx_http_request_t *r,
    ngx_uint_t body_handler)
{
    ngx_pool_cleanup_t                   *c;
    ngx_http_rpcedge_node_request_ctx_t  *ctx;

    for (c = r->pool->cleanup; c; c = c->next) {
        if (c->handler != ngx_http_rpcedge_node_request_cleanup) {
            continue;
        }

        ctx = c->data;

        if (!body_handler || ctx->body_handler) {
            return ctx;
        }
    }

    return NULL;
}


static void
ngx_http_rpcedge_node_request_cleanup(void *data)
{
    /* its lists are the pool's: nothing to free */
}


/*
 * The client's list back in place, where a response began while the node's
 * stood in (a proxy_cache hit sent from within the content handler): the
 * response's filters and whatever they start see the client's request.
 */

void
ngx_http_rpcedge_node_request_done(ngx_http_request_t *r)
{
    ngx_http_rpcedge_node_request_ctx_t  *ctx;

    ctx = ngx_http_rpcedge_node_request_ctx(r->main, 0);

    if (ctx) {
        ngx_http_rpcedge_node_request_shut(r->main, ctx);
    }
}


static ngx_int_t
ngx_http_rpcedge_node_request_handler(ngx_http_request_t *r)
{
    ngx_int_t                             rc;
    ngx_http_request_body_t              *rb;
    ngx_http_rpcedge_node_request_ctx_t  *ctx;

    /*
     * a clone of the request (proxy_cache's background update) starts at
     * the content phase with the main request's handler, and the headers it
     * was made with
     */

    ctx = ngx_http_rpcedge_node_request_ctx(r, 0);

    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (r != r->main) {
        return ctx->content_handler(r);
    }

    ngx_http_rpcedge_node_request_open(r, ctx);

    rc = ctx->content_handler(r);

    /*
     * where the body is still on its way, the node's request is made once it
     * is in: so is the window (a handler nginx has called already, it does
     * not call again)
     */

    rb = r->request_body;

    if (rb && rb->post_handler
        && rb->post_handler != ngx_http_rpcedge_node_request_body_handler)
    {
        ctx->body_handler = rb->post_handler;
        rb->post_handler = ngx_http_rpcedge_node_request_body_handler;
    }

    ngx_http_rpcedge_node_request_shut(r, ctx);

    return rc;
}


static void
ngx_http_rpcedge_node_request_body_handler(ngx_http_request_t *r)
{
    ngx_http_rpcedge_node_request_ctx_t  *ctx;

    ctx = ngx_http_rpcedge_node_request_ctx(r, 1);

    ngx_http_rpcedge_node_request_open(r, ctx);

    ctx->body_handler(r);

    ngx_http_rpcedge_node_request_shut(r, ctx);
}


static void
ngx_http_rpcedge_node_request_open(ngx_http_request_t *r,
    ngx_http_rpcedge_node_request_ctx_t *ctx)
{
    if (ctx->open) {
        return;
    }

    ngx_http_rpcedge_list_move(&ctx->client, &r->headers_in.headers);
    ngx_http_rpcedge_list_move(&r->headers_in.headers, &ctx->node);

#if (NGX_HTTP_HEADERS)
    ctx->client_accept = r->headers_in.accept;
    r->headers_in.accept = ctx->node_accept;
#endif

    ctx->open = 1;
}


static void
ngx_http_rpcedge_node_request_shut(ngx_http_request_t *r,
    ngx_http_rpcedge_node_request_ctx_t *ctx)
{
    if (!ctx->open) {
        return;
    }

    /* what modules pushed meanwhile (proxy_set_header pushes none) stays */

    ngx_http_rpcedge_list_move(&ctx->node, &r->headers_in.headers);
    ngx_http_rpcedge_list_move(&r->headers_in.headers, &ctx->client);

#if (NGX_HTTP_HEADERS)
    ctx->node_accept = r->headers_in.accept;
    r->headers_in.accept = ctx->client_accept;
#endif

    ctx->open = 0;
}


/* a list's last part may be its first, held in the list itself */

static void
ngx_http_rpcedge_list_move(ngx_list_t *dst, ngx_list_t *src)
{
    *dst = *src;

    if (src->last == &src->part) {
        dst->last = &dst->part;
    }
}
