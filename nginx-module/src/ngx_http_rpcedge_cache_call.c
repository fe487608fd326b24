
/*
 * rpcedge cache: a call to the daemon. Each is the core's (method, path,
 * headers, body) made as a background subrequest to rpcedge_cache_pass.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_rpcedge_cache.h"


static ngx_int_t ngx_http_rpcedge_cache_set_body(ngx_http_request_t *sr,
    rpcedge_str_t body);


/*
 * the core's call to the daemon as a background subrequest: its method,
 * `pass` (an rpcedge_cache_pass) + its path and its headers (none of the client's),
 * copied into the request's pool; its body, which stays in ctx->cache until
 * the request's pool goes
 */

ngx_http_request_t *
ngx_http_rpcedge_cache_call(ngx_http_request_t *r, ngx_str_t *pass,
    rpcedge_daemon_call_t *dc, ngx_http_post_subrequest_t *ps,
    ngx_uint_t lookup)
{
    u_char                         *p;
    size_t                          i;
    ngx_str_t                       uri;
    ngx_http_request_t             *sr;
    ngx_http_rpcedge_cache_call_t  *call;

    call = ngx_pcalloc(r->pool, sizeof(ngx_http_rpcedge_cache_call_t));
    if (call == NULL) {
        return NULL;
    }

    uri.len = pass->len + dc->path.len;
    uri.data = ngx_pnalloc(r->pool, uri.len);
    if (uri.data == NULL) {
        return NULL;
    }

    p = ngx_cpymem(uri.data, pass->data, pass->len);
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
