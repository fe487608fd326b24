
/*
 * The response through the core: the header filter feeds the exchange the
 * response's head and gets a plan (pass, buffer, stream), its header edits
 * applied as the headers go (ngx_http_rpcedge_edits.c); the body filter
 * feeds it the body and sends what the core returns, holding the headers
 * while the core buffers, and a timer sends held data once it has waited
 * stream_delay.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_rpcedge_filter.h"


/* the core returns the bytes to send; they are copied into these buffers */
#define NGX_HTTP_RPCEDGE_BUF_SIZE   32768
#define NGX_HTTP_RPCEDGE_BUFS       32

/*
 * c->buffered while input or output waits in this filter, as gzip does:
 * nginx then keeps the request until the writer has called us again. Not in
 * NGX_LOWLEVEL_BUFFERED (0x0f), which makes the write filter report
 * NGX_AGAIN; gzip has 0x20, write 0x10.
 */
#define NGX_HTTP_RPCEDGE_BUFFERED   0x80


static ngx_int_t ngx_http_rpcedge_header_filter(ngx_http_request_t *r);
static ngx_int_t ngx_http_rpcedge_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
static ngx_int_t ngx_http_rpcedge_send_headers(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx);
static ngx_int_t ngx_http_rpcedge_fail(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx, ngx_uint_t status);
static ngx_int_t ngx_http_rpcedge_upstream_gave_up(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx, ngx_chain_t *in);
static void ngx_http_rpcedge_wait_for_client(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx);
static void ngx_http_rpcedge_writer(ngx_http_request_t *r);
static ngx_int_t ngx_http_rpcedge_filter(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx);
static ngx_int_t ngx_http_rpcedge_feed(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx);
static ngx_int_t ngx_http_rpcedge_copy_pending(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx);
static ngx_buf_t *ngx_http_rpcedge_get_buf(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx);
#if (NGX_THREADS)
static void ngx_http_rpcedge_thread_event_handler(ngx_event_t *ev);
#endif
static void ngx_http_rpcedge_set_timer(ngx_http_rpcedge_ctx_t *ctx);
static void ngx_http_rpcedge_timer_handler(ngx_event_t *ev);


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;


void
ngx_http_rpcedge_install_filters(void)
{
    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_rpcedge_header_filter;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_rpcedge_body_filter;
}


static ngx_int_t
ngx_http_rpcedge_header_filter(ngx_http_request_t *r)
{
    ngx_uint_t                plan;
    ngx_http_rpcedge_ctx_t   *ctx;
    ngx_http_rpcedge_conf_t  *conf;
#if (NGX_DEBUG)
    rpcedge_str_t             mode;
#endif

    conf = ngx_http_get_module_loc_conf(r, ngx_http_rpcedge_filter_module);

    /* a subrequest's output is part of its parent's body */

    if (r != r->main) {
        return ngx_http_next_header_filter(r);
    }

    /* the response, and whatever its filters start, see the client's request */

    ngx_http_rpcedge_node_request_done(r);

    /*
     * a new response (maybe an error page in a location where rpcedge is
     * off) voids whatever this filter held of an earlier one
     */

    r->connection->buffered &= ~NGX_HTTP_RPCEDGE_BUFFERED;

    /* a cache hit is sent as the core spliced it */

    if (!conf->enable || ngx_http_rpcedge_cache_answering(r)) {
        return ngx_http_next_header_filter(r);
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_rpcedge_filter_module);

    if (ctx == NULL) {
        ctx = ngx_http_rpcedge_create_ctx(r);
        if (ctx == NULL) {
            return NGX_ERROR;
        }

    } else if (ctx->asked) {
        /*
         * made by the precontent handler, with the request as it came; the
         * body, which the proxy has read since, where the core wants it
         */
        ctx->asked = 0;
        ngx_http_rpcedge_feed_request_body(r, ctx);

    } else {
        if (r->filter_finalize) {
            /* the error page for this filter's own failure goes as it is */
            return ngx_http_next_header_filter(r);
        }

        /* an error page replaces the response: start over */

        if (ctx->offloaded) {
            /* a thread still works on this exchange's body */
            ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                          "rpcedge: response replaced while compressing");
            return NGX_ERROR;
        }

        ngx_http_rpcedge_cleanup(ctx);
        ngx_memzero(ctx, sizeof(ngx_http_rpcedge_ctx_t));
        ctx->request = r;
    }

    ctx->last_out = &ctx->out;

    if (ctx->exchange == NULL
        && ngx_http_rpcedge_new_exchange(r, ctx, conf) != NGX_OK)
    {
        return NGX_ERROR;
    }

    ngx_http_rpcedge_feed_response(r, ctx->exchange);

    plan = rpcedge_exchange_response_head(ctx->exchange,
                                          (uint16_t) r->headers_out.status);

#if (NGX_DEBUG)
    mode = rpcedge_exchange_mode(ctx->exchange);

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "rpcedge plan:%ui mode:%*s", plan, mode.len, mode.data);
#endif

    if (plan == RPCEDGE_PLAN_PASS) {
        ctx->done = 1;
        return ngx_http_rpcedge_send_headers(r, ctx);
    }

    r->main_filter_need_in_memory = 1;

    /*
     * the range filter below works at header time, before the core knows
     * whether the body will be encoded: no ranges, as with gzip
     */

    r->allow_ranges = 0;

    /* fires when held data has waited stream_delay */

    ctx->timer.handler = ngx_http_rpcedge_timer_handler;
    ctx->timer.data = ctx;
    ctx->timer.log = r->connection->log;
    ctx->timer.cancelable = 1;

    if (plan == RPCEDGE_PLAN_STREAM) {
        return ngx_http_rpcedge_send_headers(r, ctx);
    }

    /* RPCEDGE_PLAN_BUFFER: the headers wait for the body */

    return NGX_OK;
}


static ngx_int_t
ngx_http_rpcedge_send_headers(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx)
{
    if (ngx_http_rpcedge_apply_edits(r, ctx->exchange) != NGX_OK) {
        return NGX_ERROR;
    }

    ctx->headers_sent = 1;

    return ngx_http_next_header_filter(r);
}


static ngx_int_t
ngx_http_rpcedge_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_int_t                rc;
    ngx_http_rpcedge_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_rpcedge_filter_module);

    if (ctx == NULL || ctx->exchange == NULL || r->header_only
        || (ctx->done && ctx->pending_len == 0 && ctx->pending_flags == 0
            && ctx->out == NULL && ctx->busy == NULL))
    {
        return ngx_http_next_body_filter(r, in);
    }

    if (ctx->offloaded) {
        /* the body is in and being compressed: its thread event resumes */
        return NGX_AGAIN;
    }

    if (in) {
        if (ngx_chain_add_copy(r->pool, &ctx->in, in) != NGX_OK) {
            return ngx_http_rpcedge_fail(r, ctx, 0);
        }
    }

    if (!ctx->done && ngx_http_rpcedge_upstream_gave_up(r, ctx, in)) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "rpcedge: the upstream response ended before "
                      "its body did");
        return ngx_http_rpcedge_fail(r, ctx,
                                     rpcedge_exchange_abort(ctx->exchange));
    }

    rc = ngx_http_rpcedge_filter(r, ctx);

    if (rc == NGX_ERROR) {
        return ngx_http_rpcedge_fail(r, ctx, 0);
    }

    if (rc == NGX_DECLINED) {
        return ngx_http_rpcedge_fail(r, ctx,
                                     rpcedge_exchange_failure(ctx->exchange));
    }

    if (ctx->in || ctx->pending_len || ctx->pending_flags || ctx->more
        || ctx->offloaded)
    {
        r->connection->buffered |= NGX_HTTP_RPCEDGE_BUFFERED;

    } else {
        r->connection->buffered &= ~NGX_HTTP_RPCEDGE_BUFFERED;
    }

    if (rc == NGX_AGAIN && !ctx->offloaded) {
        ngx_http_rpcedge_wait_for_client(r, ctx);
    }

    ngx_http_rpcedge_set_timer(ctx);

    return rc;
}


/*
 * The exchange failed: answer with the status the core gives, or, with 0,
 * reset (NGX_ERROR closes the connection, so the client never sees a
 * truncated body as complete).
 */

static ngx_int_t
ngx_http_rpcedge_fail(ngx_http_request_t *r, ngx_http_rpcedge_ctx_t *ctx,
    ngx_uint_t status)
{
    ctx->done = 1;
    ctx->pending_len = 0;
    ctx->pending_flags = 0;

    ngx_http_rpcedge_stop_timer(ctx);

    r->connection->buffered &= ~NGX_HTTP_RPCEDGE_BUFFERED;

    if (status == RPCEDGE_FAILURE_RESET) {
        return NGX_ERROR;
    }

    r->keepalive = 0;

    return ngx_http_filter_finalize_request(r, &ngx_http_rpcedge_filter_module,
                                            status);
}


/*
 * The upstream module ends a response by finalizing itself (u->cleanup is
 * then NULL) and sending the last buffer; when it gives up (a reset, a body
 * shorter than its length) it sends a bare flush instead, then terminates
 * the request. Such a flush, before any last buffer, means the body will
 * never end.
 */

static ngx_int_t
ngx_http_rpcedge_upstream_gave_up(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx, ngx_chain_t *in)
{
    ngx_uint_t    special, flush;
    ngx_chain_t  *cl;

    special = 1;
    flush = 0;

    /* every buffer is looked at: a last buffer may follow data */

    for (cl = in; cl; cl = cl->next) {
        ctx->last_in |= cl->buf->last_buf;
        special &= ngx_buf_special(cl->buf) ? 1 : 0;
        flush |= cl->buf->flush;
    }

    return special && flush && !ctx->last_in
           && r->upstream && r->upstream->cleanup == NULL;
}


/*
 * Output waits for the client. The event pipe calls the body filter again
 * only for new upstream data, so the client's next write event must come
 * here first: the request's write handler is wrapped until then.
 */

static void
ngx_http_rpcedge_wait_for_client(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx)
{
    if (r->write_event_handler == ngx_http_rpcedge_writer) {
        return;
    }

    ctx->write_event_handler = r->write_event_handler;
    r->write_event_handler = ngx_http_rpcedge_writer;
}


static void
ngx_http_rpcedge_writer(ngx_http_request_t *r)
{
    ngx_connection_t           *c;
    ngx_http_rpcedge_ctx_t     *ctx;
    ngx_http_event_handler_pt   handler;

    c = r->connection;
    ctx = ngx_http_get_module_ctx(r, ngx_http_rpcedge_filter_module);

    ngx_log_debug0(NGX_LOG_DEBUG_HTTP, c->log, 0, "rpcedge writer");

    if (ctx == NULL) {
        /* only a redirect clears the ctx, and it sets its own handler */
        ngx_http_finalize_request(r, NGX_ERROR);
        return;
    }

    /* the filter may wrap the handler again: the request's own runs next */

    handler = ctx->write_event_handler;
    r->write_event_handler = handler;

    /*
     * from the top, as nginx's own writer does: filters above (copy) may
     * hold input for this one, read from the temp file the event pipe
     * spools to behind a slow client
     */

    if (!c->write->timedout && ngx_http_output_filter(r, NULL) == NGX_ERROR) {
        c->error = 1;
        ngx_http_finalize_request(r, NGX_ERROR);
        return;
    }

    handler(r);
}


/*
 * Moves input through the core and its output on to the next filter, as far
 * as free buffers allow. NGX_DECLINED: the core failed.
 */

static ngx_int_t
ngx_http_rpcedge_filter(ngx_http_request_t *r, ngx_http_rpcedge_ctx_t *ctx)
{
    ngx_int_t     rc;
    ngx_chain_t  *out;

    for ( ;; ) {

        /* cycle while there are free buffers for the core's output ... */

        for ( ;; ) {
            rc = ngx_http_rpcedge_copy_pending(r, ctx);

            if (rc == NGX_ERROR) {
                return NGX_ERROR;
            }

            if (rc == NGX_DECLINED) {
                break;
            }

            /* ... and input, or a due timer, to feed the core */

            rc = ngx_http_rpcedge_feed(r, ctx);

            if (rc == NGX_DONE) {
                break;
            }

            if (rc != NGX_OK) {
                return rc;
            }
        }

        if (!ctx->headers_sent) {
            return NGX_OK;
        }

        if (ctx->out == NULL && ctx->busy == NULL) {
            return NGX_OK;
        }

        /* a filter below may call the output filter again: hand over */

        out = ctx->out;
        ctx->out = NULL;
        ctx->last_out = &ctx->out;
        ctx->tail = NULL;

        rc = ngx_http_next_body_filter(r, out);

        if (rc == NGX_ERROR) {
            return NGX_ERROR;
        }

        ngx_chain_update_chains(r->pool, &ctx->free, &ctx->busy, &out,
                                (ngx_buf_tag_t) &ngx_http_rpcedge_filter_module);

        if (ctx->pending_len == 0 && !ctx->more
            && (ctx->in == NULL || ctx->done))
        {
            /* all that came in is on its way */
            return rc;
        }

        if (ctx->free == NULL && ctx->bufs >= NGX_HTTP_RPCEDGE_BUFS) {
            /* every buffer is on its way to the client: wait for it */
            return NGX_AGAIN;
        }
    }
}


/*
 * Completes a job, or feeds the next input buffer, or an empty tick when the
 * core's deadline has passed. NGX_OK: output is pending; NGX_DONE: nothing to
 * feed now; NGX_AGAIN: a job went to the thread pool; NGX_DECLINED: the core
 * failed.
 */

static ngx_int_t
ngx_http_rpcedge_feed(ngx_http_request_t *r, ngx_http_rpcedge_ctx_t *ctx)
{
    u_char            *data;
    size_t             size;
    int32_t            rc;
    int64_t            deadline;
    uint32_t           flags;
    ngx_buf_t         *b;
    ngx_chain_t       *cl;
    uint64_t           started;
    rpcedge_error_t    err;
    rpcedge_output_t   out;
#if (NGX_THREADS)
    rpcedge_count_t    counts[RPCEDGE_COUNTS_MAX];
#endif

    if (ctx->done) {
        return NGX_DONE;
    }

    flags = 0;

    if (ctx->job) {
        /* run in a thread, or, when no thread took it, here */

        started = ngx_http_rpcedge_now_ns();
        rc = rpcedge_exchange_complete_job(ctx->exchange, ctx->job, &out,
                                           &err);
        ctx->compress_ns += ngx_http_rpcedge_now_ns() - started;
        ctx->job = NULL;

        goto output;
    }

    if (ctx->more) {
        /* the core has more of the body ready: an empty feed takes it */
        data = NULL;
        size = 0;

    } else if (ctx->in) {
        cl = ctx->in;
        b = cl->buf;
        data = b->pos;
        size = ngx_buf_size(b);

        if (!ngx_buf_in_memory(b) && !ngx_buf_special(b)) {
            /* main_filter_need_in_memory asked for memory buffers */
            ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                          "rpcedge: file buffer in body filter");
            return NGX_ERROR;
        }

        if (ngx_buf_special(b)) {
            data = NULL;
            size = 0;
        }

        if (b->last_buf) {
            flags |= RPCEDGE_FEED_END;
        }

        if (b->flush) {
            flags |= RPCEDGE_FEED_FLUSH;
        }

        b->pos = b->last;

        if (b->in_file) {
            b->file_pos = b->file_last;
        }

        ctx->in = cl->next;
        ngx_free_chain(r->pool, cl);

    } else {
        deadline = rpcedge_exchange_deadline(ctx->exchange);

        if (deadline < 0 || (ngx_msec_t) deadline > ngx_current_msec) {
            return NGX_DONE;
        }

        data = NULL;
        size = 0;
    }

    started = ngx_http_rpcedge_now_ns();
    rc = rpcedge_exchange_feed(ctx->exchange, data, size, flags,
                               ngx_current_msec, &out, &err);
    ctx->compress_ns += ngx_http_rpcedge_now_ns() - started;

output:

    if (rc != 0) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "rpcedge: %s", err.message);

        return NGX_DECLINED;
    }

    if (out.flags & RPCEDGE_OUT_WORK) {
        ctx->job = rpcedge_exchange_take_job(ctx->exchange);

#if (NGX_THREADS)
        if (ngx_http_rpcedge_thread_post(r, ctx,
                                         ngx_http_rpcedge_thread_event_handler)
            == NGX_OK) {
            ngx_http_rpcedge_count(counts, rpcedge_count_offload(1, counts));
            return NGX_AGAIN;
        }

        ngx_http_rpcedge_count(counts, rpcedge_count_offload(0, counts));
#endif

        /* the next feed completes it */
        return NGX_OK;
    }

    if (out.flags & RPCEDGE_OUT_HEADERS) {
        if (ngx_http_rpcedge_send_headers(r, ctx) == NGX_ERROR) {
            return NGX_ERROR;
        }
    }

    ctx->pending = (u_char *) out.data;
    ctx->pending_len = out.len;
    ctx->pending_flags = out.flags;
    ctx->more = (out.flags & RPCEDGE_OUT_MORE) ? 1 : 0;

    if (out.flags & RPCEDGE_OUT_END) {
        ctx->done = 1;
    }

    return NGX_OK;
}


/*
 * Copies pending core output into buffers on ctx->out, filling the last one
 * before taking another. NGX_OK: all copied; NGX_DECLINED: no free buffer.
 */

static ngx_int_t
ngx_http_rpcedge_copy_pending(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx)
{
    size_t        n;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    while (ctx->pending_len) {

        b = ctx->tail;

        if (b == NULL || b->last == b->end) {
            b = ngx_http_rpcedge_get_buf(r, ctx);

            if (b == NULL) {
                return NGX_ERROR;
            }

            if (b == NGX_CONF_UNSET_PTR) {
                return NGX_DECLINED;
            }
        }

        n = ngx_min(ctx->pending_len, (size_t) (b->end - b->last));
        b->last = ngx_cpymem(b->last, ctx->pending, n);
        ctx->pending += n;
        ctx->pending_len -= n;
    }

    if (!(ctx->pending_flags & (RPCEDGE_OUT_FLUSH|RPCEDGE_OUT_END))) {
        ctx->pending_flags = 0;
        return NGX_OK;
    }

    if (ctx->tail == NULL) {
        /* a bare flush or end: a special buffer, not one of ours */

        cl = ngx_alloc_chain_link(r->pool);
        if (cl == NULL) {
            return NGX_ERROR;
        }

        cl->buf = ngx_calloc_buf(r->pool);
        if (cl->buf == NULL) {
            return NGX_ERROR;
        }

        cl->next = NULL;
        *ctx->last_out = cl;
        ctx->last_out = &cl->next;
        ctx->tail = cl->buf;
    }

    b = ctx->tail;
    b->flush = (ctx->pending_flags & RPCEDGE_OUT_FLUSH) ? 1 : 0;
    b->last_buf = (ctx->pending_flags & RPCEDGE_OUT_END) ? 1 : 0;
    ctx->pending_flags = 0;

    return NGX_OK;
}


/*
 * A free or new output buffer appended to ctx->out as its tail, or
 * NGX_CONF_UNSET_PTR when all NGX_HTTP_RPCEDGE_BUFS are on their way.
 */

static ngx_buf_t *
ngx_http_rpcedge_get_buf(ngx_http_request_t *r, ngx_http_rpcedge_ctx_t *ctx)
{
    u_char       *start, *end;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    if (ctx->free) {
        cl = ctx->free;
        ctx->free = cl->next;

        b = cl->buf;
        start = b->start;
        end = b->end;

        ngx_memzero(b, sizeof(ngx_buf_t));

        b->start = start;
        b->pos = start;
        b->last = start;
        b->end = end;
        b->temporary = 1;

    } else if (ctx->bufs < NGX_HTTP_RPCEDGE_BUFS) {
        cl = ngx_alloc_chain_link(r->pool);
        if (cl == NULL) {
            return NULL;
        }

        b = ngx_create_temp_buf(r->pool, NGX_HTTP_RPCEDGE_BUF_SIZE);
        if (b == NULL) {
            return NULL;
        }

        ctx->bufs++;
        cl->buf = b;

    } else {
        return NGX_CONF_UNSET_PTR;
    }

    b->tag = (ngx_buf_tag_t) &ngx_http_rpcedge_filter_module;
    b->recycled = 1;

    cl->next = NULL;
    *ctx->last_out = cl;
    ctx->last_out = &cl->next;
    ctx->tail = b;

    return b;
}


#if (NGX_THREADS)

static void
ngx_http_rpcedge_thread_event_handler(ngx_event_t *ev)
{
    ngx_connection_t        *c;
    ngx_http_request_t      *r;
    ngx_http_rpcedge_ctx_t  *ctx;

    ctx = ev->data;
    r = ctx->request;
    c = r->connection;

    ngx_http_set_log_request(c->log, r);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, c->log, 0,
                   "rpcedge thread: \"%V?%V\"", &r->uri, &r->args);

    r->main->blocked--;
    ctx->offloaded = 0;
    ctx->compress_ns += ngx_http_rpcedge_thread_ns(ctx->task);

    if (ngx_http_get_module_ctx(r, ngx_http_rpcedge_filter_module) != ctx
        || c->error)
    {
        /*
         * the request moved on (a redirect, post_action) or the client went
         * away: nobody waits for this body; its writer finishes the request
         */

        rpcedge_job_free(ctx->job);
        ctx->job = NULL;

        r->write_event_handler(r);
        ngx_http_run_posted_requests(c);
        return;
    }

    /* complete the job and send from here down, as the timer does */

    if (ngx_http_rpcedge_body_filter(r, NULL) == NGX_ERROR) {
        c->error = 1;
        ngx_http_finalize_request(r, NGX_ERROR);
        ngx_http_run_posted_requests(c);
        return;
    }

    /* c->buffered kept the request from being done: it still has a writer */

    r->write_event_handler(r);
    ngx_http_run_posted_requests(c);
}

#endif


static void
ngx_http_rpcedge_set_timer(ngx_http_rpcedge_ctx_t *ctx)
{
    int64_t  deadline;

    /* while output waits for the client, its write event brings us back */

    deadline = (ctx->done || ctx->pending_len || ctx->pending_flags
                || ctx->offloaded)
               ? -1 : rpcedge_exchange_deadline(ctx->exchange);

    if (deadline < 0) {
        if (ctx->timer.timer_set) {
            ngx_del_timer(&ctx->timer);
        }

        return;
    }

    ngx_add_timer(&ctx->timer, (ngx_msec_t) deadline > ngx_current_msec
                               ? (ngx_msec_t) deadline - ngx_current_msec : 1);
}


static void
ngx_http_rpcedge_timer_handler(ngx_event_t *ev)
{
    ngx_connection_t        *c;
    ngx_http_request_t      *r;
    ngx_http_rpcedge_ctx_t  *ctx;

    ctx = ev->data;
    r = ctx->request;
    c = r->connection;

    ngx_http_set_log_request(c->log, r);

    ngx_log_debug0(NGX_LOG_DEBUG_HTTP, c->log, 0, "rpcedge timer");

    /*
     * held data waited out stream_delay: send it from here down, as the
     * filters above (postpone) may hold an empty call back
     */

    if (ngx_http_rpcedge_body_filter(r, NULL) == NGX_ERROR) {
        c->error = 1;
        ngx_http_finalize_request(r, NGX_ERROR);
    }

    ngx_http_run_posted_requests(c);
}
