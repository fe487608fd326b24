
/*
 * rpcedge cache: the filter over the answers. For a daemon call it keeps the
 * daemon's answer (its status, headers and body) for the module alone; for
 * the client's request it counts the cache status, sets the status header
 * and holds the node's plain body for the store, or holds a split batch's
 * answer and sends the core's merge of it in its place. It sits just above
 * postpone, which would otherwise hold the daemon's answers, and so sees the
 * node's body before rpcedge compresses it.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_rpcedge_cache.h"


static void ngx_http_rpcedge_cache_answered_by(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_call_t *call);
static ngx_int_t ngx_http_rpcedge_cache_replace(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx, ngx_chain_t *in);
static ngx_int_t ngx_http_rpcedge_cache_hold(ngx_pool_t *pool,
    ngx_http_rpcedge_cache_bytes_t *bytes, ngx_buf_t *b, size_t limit);


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;


/* the daemon that answered a lookup: a key it let the request hold is
 * released there should the request go away (the upstream forgets its peer
 * once finalized) */

static void
ngx_http_rpcedge_cache_answered_by(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_call_t *call)
{
    ngx_http_upstream_t  *u;

    u = r->upstream;

    if (u == NULL || u->peer.sockaddr == NULL
        || u->peer.socklen > sizeof(ngx_sockaddr_t))
    {
        return;
    }

#if (NGX_HTTP_SSL)
    if (u->ssl) {
        return;
    }
#endif

    ngx_memcpy(&call->daemon, u->peer.sockaddr, u->peer.socklen);
    call->daemon_len = u->peer.socklen;
}


static ngx_int_t
ngx_http_rpcedge_cache_header_filter(ngx_http_request_t *r)
{
    off_t                           length;
    size_t                          n;
    rpcedge_str_t                   status;
    rpcedge_header_t               *headers;
    ngx_http_upstream_t            *u;
    rpcedge_count_t                 counts[RPCEDGE_COUNTS_MAX];
    ngx_http_rpcedge_cache_ctx_t   *ctx;
    ngx_http_rpcedge_cache_call_t  *call;
    ngx_http_rpcedge_cache_conf_t  *conf;

    if (r != r->main) {
        call = ngx_http_get_module_ctx(r, ngx_http_rpcedge_cache_module);

        if (call == NULL) {
            return ngx_http_next_header_filter(r);
        }

        /* the daemon's answer is for this module only */

        call->status = r->headers_out.status;
        r->filter_need_in_memory = 1;

        /* a lookup's answer goes to the core, its headers with it; a store's
         * status alone is counted */

        if (call->lookup) {
            call->headers = ngx_http_rpcedge_cache_headers(r->pool,
                                                    &r->headers_out.headers,
                                                    NULL, NULL, &call->nheaders);
            if (call->headers == NULL) {
                call->status = 0;
            }

            ngx_http_rpcedge_cache_answered_by(r, call);
        }

        length = r->headers_out.content_length_n;

        if (length > (off_t) RPCEDGE_CACHE_MAX_ANSWER) {
            call->too_large = 1;

        } else if (length > 0 && call->lookup) {
            call->answer.data = ngx_pnalloc(r->pool, length);
            if (call->answer.data != NULL) {
                call->answer.size = length;
            }
        }

        return NGX_OK;
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_rpcedge_cache_module);

    if (ctx == NULL) {
        return ngx_http_next_header_filter(r);
    }

    if (ctx->state == ngx_http_rpcedge_cache_pass_on && ctx->cache) {

        /*
         * the node's own headers, as nginx passes them on: not what
         * add_header, expires or other modules add to every answer, which a
         * hit gets from them again
         */

        u = r->upstream;

        if (u && u->conf && u->conf->hide_headers_hash.buckets) {
            headers = ngx_http_rpcedge_cache_headers(r->pool,
                                                 &u->headers_in.headers, NULL,
                                                 &u->conf->hide_headers_hash,
                                                 &n);

        } else {
            headers = ngx_http_rpcedge_cache_headers(r->pool,
                                                 &r->headers_out.headers,
                                                 &r->headers_out.content_type,
                                                 NULL, &n);
        }

        if (headers == NULL) {
            return NGX_ERROR;
        }

        ctx->holding = rpcedge_cache_response_head(ctx->cache,
                                           (uint16_t) r->headers_out.status,
                                           r->headers_out.content_length_n,
                                           headers, n);

        ctx->replacing = rpcedge_cache_replaces_body(ctx->cache);

        if (ctx->holding) {
            /* file buffers are read into memory above this filter */
            r->filter_need_in_memory = 1;
        }
    }

    /* an error page after the answer began is the same request's */

    if (!ctx->counted) {
        ctx->counted = 1;
        ngx_http_rpcedge_count(counts, rpcedge_count_cache(ctx->cache, counts));
    }

    conf = ngx_http_get_module_loc_conf(r, ngx_http_rpcedge_cache_module);

    if (conf->status_header) {
        status = rpcedge_cache_status(ctx->cache, conf->status_reason);

        if (ngx_http_rpcedge_push_header(&r->headers_out.headers,
                                         "X-Rpcedge-Cache",
                                         (u_char *) status.data, status.len)
            == NULL)
        {
            return NGX_ERROR;
        }
    }

    /* a merged batch's headers go with its body, which sets their length */

    if (ctx->replacing) {
        return NGX_OK;
    }

    return ngx_http_next_header_filter(r);
}


static ngx_int_t
ngx_http_rpcedge_cache_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_int_t                       rc;
    ngx_buf_t                      *b;
    ngx_uint_t                      last;
    ngx_chain_t                    *cl;
    ngx_http_rpcedge_cache_ctx_t   *ctx;
    ngx_http_rpcedge_cache_call_t  *call;

    if (r != r->main) {
        call = ngx_http_get_module_ctx(r, ngx_http_rpcedge_cache_module);

        if (call == NULL) {
            return ngx_http_next_body_filter(r, in);
        }

        /* take the daemon's answer and consume it */

        for (cl = in; cl; cl = cl->next) {

            if (call->lookup && !call->too_large
                && ngx_http_rpcedge_cache_hold(r->pool, &call->answer, cl->buf,
                                               RPCEDGE_CACHE_MAX_ANSWER)
                   != NGX_OK)
            {
                call->too_large = 1;
            }

            if (cl->buf->last_buf || cl->buf->last_in_chain) {
                call->complete = 1;
            }

            cl->buf->pos = cl->buf->last;
            cl->buf->file_pos = cl->buf->file_last;
        }

        return NGX_OK;
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_rpcedge_cache_module);

    if (ctx == NULL || ctx->ended
        || ctx->state == ngx_http_rpcedge_cache_answered)
    {
        return ngx_http_next_body_filter(r, in);
    }

    if (ctx->replacing) {
        return ngx_http_rpcedge_cache_replace(r, ctx, in);
    }

    last = 0;

    for (cl = in; cl; cl = cl->next) {
        b = cl->buf;

        /* the core holds the body for the store while it may keep it; one
         * not in memory cannot be held whole */

        if (ctx->holding
            && ((!ngx_buf_in_memory(b) && ngx_buf_size(b))
                || rpcedge_cache_pass(ctx->cache, b->pos, b->last - b->pos,
                                      b->last_buf, NULL)
                   != RPCEDGE_PASS_KEPT))
        {
            ctx->holding = 0;
        }

        last |= b->last_buf;
    }

    rc = ngx_http_next_body_filter(r, in);

    if (last) {
        ngx_http_rpcedge_cache_ended(r, ctx, rc);
    }

    return rc;
}


/* the node's answer to a split batch: held by the core (its buffers consumed)
 * until it gives the merged answer, which goes out with its headers and exact
 * length; past what is held, the cache's answers go first and the rest of the
 * node's after them */

static ngx_int_t
ngx_http_rpcedge_cache_replace(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx, ngx_chain_t *in)
{
    int32_t         passed;
    ngx_int_t       rc;
    ngx_uint_t      last, whole;
    ngx_buf_t      *b;
    ngx_chain_t    *cl, *rest, out;
    rpcedge_str_t   answer;

    passed = RPCEDGE_PASS_HELD;

    for (cl = in; cl; cl = cl->next) {
        b = cl->buf;

        if (!ngx_buf_in_memory(b) && ngx_buf_size(b)) {
            return NGX_ERROR;
        }

        passed = rpcedge_cache_pass(ctx->cache, b->pos, b->last - b->pos,
                                    b->last_buf, &answer);

        b->pos = b->last;
        b->file_pos = b->file_last;

        if (passed != RPCEDGE_PASS_HELD) {
            break;
        }
    }

    if (passed == RPCEDGE_PASS_HELD) {
        return NGX_OK;
    }

    if (passed != RPCEDGE_PASS_MERGED) {
        return NGX_ERROR;
    }

    /* merged at cl: whole if the node's answer ended there, else the rest of
     * the chain goes on after it */

    whole = cl->buf->last_buf;
    rest = cl->next;
    last = whole;

    for (cl = rest; cl; cl = cl->next) {
        last |= cl->buf->last_buf;
    }

    ctx->replacing = 0;

    /* a whole answer's stores were taken as it was merged */

    ctx->holding = whole;

    r->headers_out.content_length_n = whole ? (off_t) answer.len : -1;

    if (r->headers_out.content_length) {
        r->headers_out.content_length->hash = 0;
        r->headers_out.content_length = NULL;
    }

    rc = ngx_http_next_header_filter(r);

    if (rc == NGX_ERROR || rc > NGX_OK) {
        return NGX_ERROR;
    }

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_ERROR;
    }

    /* the answer stays in ctx->cache until the request's pool goes */

    b->pos = (u_char *) answer.data;
    b->last = b->pos + answer.len;
    b->memory = answer.len ? 1 : 0;
    b->last_buf = whole;
    b->flush = !whole;

    out.buf = b;
    out.next = rest;

    rc = ngx_http_next_body_filter(r, &out);

    if (last) {
        ngx_http_rpcedge_cache_ended(r, ctx, rc);
    }

    return rc;
}


/* copies b's bytes after those held; NGX_DECLINED past limit or for bytes
 * that are not in memory */

static ngx_int_t
ngx_http_rpcedge_cache_hold(ngx_pool_t *pool,
    ngx_http_rpcedge_cache_bytes_t *bytes, ngx_buf_t *b, size_t limit)
{
    u_char  *p;
    size_t   len, size;

    if (!ngx_buf_in_memory(b)) {
        return ngx_buf_size(b) ? NGX_DECLINED : NGX_OK;
    }

    len = b->last - b->pos;

    if (len > limit - bytes->len) {
        return NGX_DECLINED;
    }

    if (bytes->len + len > bytes->size) {
        size = ngx_max(bytes->size * 2, bytes->len + len);
        size = ngx_max(size, 4096);

        p = ngx_pnalloc(pool, size);
        if (p == NULL) {
            return NGX_ERROR;
        }

        if (bytes->data) {
            ngx_memcpy(p, bytes->data, bytes->len);
            ngx_pfree(pool, bytes->data);
        }

        bytes->data = p;
        bytes->size = size;
    }

    ngx_memcpy(bytes->data + bytes->len, b->pos, len);
    bytes->len += len;

    return NGX_OK;
}


/*
 * a header list as the core takes it, Content-Type first where nginx keeps
 * it apart (headers_out), without those in hide (an upstream's hidden ones);
 * the pairs point into the list's own strings
 */

rpcedge_header_t *
ngx_http_rpcedge_cache_headers(ngx_pool_t *pool, ngx_list_t *list,
    ngx_str_t *content_type, ngx_hash_t *hide, size_t *n)
{
    size_t             count;
    ngx_uint_t         i;
    ngx_list_part_t   *part;
    ngx_table_elt_t   *h;
    rpcedge_header_t  *headers, *header;

    count = 1;

    for (part = &list->part; part; part = part->next) {
        count += part->nelts;
    }

    headers = ngx_palloc(pool, count * sizeof(rpcedge_header_t));
    if (headers == NULL) {
        return NULL;
    }

    header = headers;

    if (content_type && content_type->len) {
        header->name = (const uint8_t *) "Content-Type";
        header->name_len = sizeof("Content-Type") - 1;
        header->value = content_type->data;
        header->value_len = content_type->len;
        header++;
    }

    for (part = &list->part; part; part = part->next) {
        h = part->elts;

        for (i = 0; i < part->nelts; i++) {
            if (h[i].hash == 0) {
                continue;
            }

            if (hide && ngx_hash_find(hide, h[i].hash, h[i].lowcase_key,
                                      h[i].key.len))
            {
                continue;
            }

            header->name = h[i].key.data;
            header->name_len = h[i].key.len;
            header->value = h[i].value.data;
            header->value_len = h[i].value.len;
            header++;
        }
    }

    *n = header - headers;

    return headers;
}


/* the filter goes where config's ngx_module_order puts it, above postpone */

ngx_int_t
ngx_http_rpcedge_cache_filter_init(ngx_conf_t *cf)
{
    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_rpcedge_cache_header_filter;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_rpcedge_cache_body_filter;

    return NGX_OK;
}
