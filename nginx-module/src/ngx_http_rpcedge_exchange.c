
/*
 * A response's exchange with the core: made from the request (its method,
 * path, headers and, where the core wants it and nginx holds it whole, its
 * body), fed the response's head, and freed with the request's pool, once
 * its counts are added.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_rpcedge_filter.h"


typedef void (*ngx_http_rpcedge_feed_header_pt)(rpcedge_exchange_t *ex,
    const uint8_t *name, size_t name_len, const uint8_t *value,
    size_t value_len);

static void ngx_http_rpcedge_feed_list(rpcedge_exchange_t *ex,
    ngx_list_t *list, ngx_http_rpcedge_feed_header_pt feed);


ngx_http_rpcedge_ctx_t *
ngx_http_rpcedge_create_ctx(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t      *cln;
    ngx_http_cleanup_t      *hcln;
    ngx_http_rpcedge_ctx_t  *ctx;

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_rpcedge_ctx_t));
    if (ctx == NULL) {
        return NULL;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NULL;
    }

    cln->handler = ngx_http_rpcedge_cleanup;
    cln->data = ctx;

    /* runs on terminate too, while the pool may outlive the request */

    hcln = ngx_http_cleanup_add(r, 0);
    if (hcln == NULL) {
        return NULL;
    }

    hcln->handler = ngx_http_rpcedge_stop_timer;
    hcln->data = ctx;

    ctx->request = r;
    ngx_http_set_ctx(r, ctx, ngx_http_rpcedge_filter_module);

    return ctx;
}


/* the exchange, fed the request's head (and body, when the core wants it) */

ngx_int_t
ngx_http_rpcedge_new_exchange(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx, ngx_http_rpcedge_conf_t *conf)
{
    rpcedge_exchange_t        *ex;
#if (NGX_THREADS)
    ngx_http_core_loc_conf_t  *clcf;
#endif

    ex = rpcedge_exchange_new(conf->settings);
    if (ex == NULL) {
        return NGX_ERROR;
    }

    ctx->exchange = ex;

#if (NGX_THREADS)
    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    if (clcf->aio == NGX_HTTP_AIO_THREADS) {
        rpcedge_exchange_offload(ex);
    }
#endif

    rpcedge_exchange_request_method(ex, r->method_name.data,
                                    r->method_name.len);
    rpcedge_exchange_request_path(ex, r->uri.data, r->uri.len);

    ngx_http_rpcedge_feed_list(ex, &r->headers_in.headers,
                               rpcedge_exchange_request_header);

    ngx_http_rpcedge_feed_request_body(r, ctx);

    return NGX_OK;
}


/* the request body, once, where the core wants it and nginx holds it whole */

void
ngx_http_rpcedge_feed_request_body(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx)
{
    rpcedge_str_t  body;

    if (ctx->fed_body || !rpcedge_exchange_wants_request_body(ctx->exchange)) {
        return;
    }

    body = ngx_http_rpcedge_request_body(r);

    if (body.data) {
        ctx->fed_body = 1;
        rpcedge_exchange_request_body(ctx->exchange, body.data, body.len);
    }
}


void
ngx_http_rpcedge_feed_response(ngx_http_request_t *r, rpcedge_exchange_t *ex)
{
    /* nginx keeps these two apart from the header list */

    rpcedge_exchange_response_content_length(ex,
                                          r->headers_out.content_length_n);

    if (r->headers_out.content_type.len) {
        rpcedge_exchange_response_header(ex, (u_char *) "Content-Type",
                                         sizeof("Content-Type") - 1,
                                         r->headers_out.content_type.data,
                                         r->headers_out.content_type.len);
    }

    ngx_http_rpcedge_feed_list(ex, &r->headers_out.headers,
                               rpcedge_exchange_response_header);
}


static void
ngx_http_rpcedge_feed_list(rpcedge_exchange_t *ex, ngx_list_t *list,
    ngx_http_rpcedge_feed_header_pt feed)
{
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    part = &list->part;
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

        /* deleted */

        if (h[i].hash == 0) {
            continue;
        }

        feed(ex, h[i].key.data, h[i].key.len, h[i].value.data, h[i].value.len);
    }
}


void
ngx_http_rpcedge_cleanup(void *data)
{
    ngx_http_rpcedge_ctx_t  *ctx = data;

    rpcedge_error_t  why;
    rpcedge_count_t  counts[RPCEDGE_COUNTS_MAX];

    ngx_http_rpcedge_stop_timer(ctx);

    if (ctx->exchange) {
        if (rpcedge_exchange_transcode(ctx->exchange, &why)
            == RPCEDGE_TRANSCODE_REFUSED)
        {
            ngx_log_error(NGX_LOG_WARN, ctx->request->connection->log, 0,
                          "rpcedge: not transcoded, sent as it came: %s",
                          why.message);
        }

        ngx_http_rpcedge_count(counts,
                               rpcedge_count_exchange(ctx->exchange, ctx->done,
                                                      ctx->compress_ns / 1000,
                                                      counts));
    }

    /* a job taken but not given back; a running one blocks the request */

    rpcedge_job_free(ctx->job);
    ctx->job = NULL;

    rpcedge_exchange_free(ctx->exchange);
    ctx->exchange = NULL;
}


void
ngx_http_rpcedge_stop_timer(void *data)
{
    ngx_http_rpcedge_ctx_t  *ctx = data;

    if (ctx->timer.timer_set) {
        ngx_del_timer(&ctx->timer);
    }
}
