
/*
 * Before the request goes to the node: the precontent handler makes the
 * response's exchange from the request, and the node's request from what
 * the core says of it (ngx_http_rpcedge_node_request.c).
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_rpcedge_filter.h"


static void ngx_http_rpcedge_ask_body_handler(ngx_http_request_t *r);
static ngx_int_t ngx_http_rpcedge_ask_node(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx);


/*
 * Before the request goes to the node, the exchange is made from it: the
 * node is to answer identity wherever rpcedge may have work on the answer,
 * and with rpcedge_transcode_upstream_ssz it may be asked for SSZ in place of
 * the client's JSON (its body read first when the core wants it)
 */

ngx_int_t
ngx_http_rpcedge_ask_handler(ngx_http_request_t *r)
{
    ngx_int_t                 rc;
    ngx_http_rpcedge_ctx_t   *ctx;
    ngx_http_rpcedge_conf_t  *conf;

    if (r != r->main) {
        return NGX_DECLINED;
    }

    /* an internal redirect made while the node's request was made */

    ngx_http_rpcedge_node_request_done(r);

    conf = ngx_http_get_module_loc_conf(r, ngx_http_rpcedge_filter_module);

    if (!conf->enable) {
        return NGX_DECLINED;
    }

    /* the phases run again once the body is in */

    if (ngx_http_get_module_ctx(r, ngx_http_rpcedge_filter_module)) {
        return NGX_DECLINED;
    }

    ctx = ngx_http_rpcedge_create_ctx(r);
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->asked = 1;

    if (ngx_http_rpcedge_new_exchange(r, ctx, conf) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_rpcedge_cache_keeps(r)) {
        rpcedge_exchange_cache_may_keep(ctx->exchange);
    }

    if (!conf->transcode_upstream_ssz
        || ctx->fed_body
        || !rpcedge_exchange_wants_request_body(ctx->exchange))
    {
        return ngx_http_rpcedge_ask_node(r, ctx);
    }

    rc = ngx_http_read_client_request_body(r,
                                           ngx_http_rpcedge_ask_body_handler);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    ngx_http_finalize_request(r, NGX_DONE);
    return NGX_DONE;
}


static void
ngx_http_rpcedge_ask_body_handler(ngx_http_request_t *r)
{
    ngx_http_rpcedge_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_rpcedge_filter_module);

    ngx_http_rpcedge_feed_request_body(r, ctx);

    if (ngx_http_rpcedge_ask_node(r, ctx) != NGX_DECLINED) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    r->write_event_handler = ngx_http_core_run_phases;
    ngx_http_core_run_phases(r);
}


/*
 * Accept as the core gives it, and no Accept-Encoding, where the node is to
 * answer identity: in the node's request alone, whatever proxy_set_header the
 * location has (they replace the server's, Accept-Encoding "" included)
 */

static ngx_int_t
ngx_http_rpcedge_ask_node(ngx_http_request_t *r, ngx_http_rpcedge_ctx_t *ctx)
{
    rpcedge_str_t  accept;

    /* the node asked for SSZ is asked for identity too */

    accept = rpcedge_exchange_upstream_accept(ctx->exchange);

    if (!rpcedge_exchange_node_identity(ctx->exchange)) {
        return NGX_DECLINED;
    }

    if (ngx_http_rpcedge_node_request(r, accept) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return NGX_DECLINED;
}
