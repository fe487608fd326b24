
/*
 * What the compression filter's files share: its configuration, and one
 * response's state (ngx_http_rpcedge_filter_module.c, _exchange.c,
 * _request.c, _response.c, _edits.c, _offload.c).
 */


#ifndef _NGX_HTTP_RPCEDGE_FILTER_H_INCLUDED_
#define _NGX_HTTP_RPCEDGE_FILTER_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <rpcedge.h>

#include "ngx_http_rpcedge_module.h"


typedef struct {
    ngx_flag_t                 enable;
    size_t                     max_buffer;
    ngx_int_t                  level;
    ngx_int_t                  stream_level;
    ngx_msec_t                 stream_delay;
    size_t                     offload_min_length;
    ngx_flag_t                 transcode;
    size_t                     transcode_max;
    size_t                     transcode_hold_max;
    size_t                     transcode_budget;
    ngx_flag_t                 transcode_upstream_ssz;
    ngx_int_t                  beacon_network;
    ngx_array_t               *types;
    rpcedge_settings_t        *settings;
} ngx_http_rpcedge_conf_t;


typedef struct {
    ngx_http_request_t        *request;
    rpcedge_exchange_t        *exchange;

    ngx_chain_t               *in;
    ngx_chain_t               *free;
    ngx_chain_t               *busy;
    ngx_chain_t               *out;
    ngx_chain_t              **last_out;

    /* the last buffer on ctx->out, still being filled */
    ngx_buf_t                 *tail;

    /* core output not yet copied into buffers; valid until the next feed */
    u_char                    *pending;
    size_t                     pending_len;
    uint32_t                   pending_flags;

    ngx_uint_t                 bufs;
    ngx_event_t                timer;

    /* time spent in the core's feeds and jobs, counted as compress_time_us */
    uint64_t                   compress_ns;

    /* a job taken from the core, to run in a thread or complete */
    rpcedge_job_t             *job;

    /* the request's own write handler, while ours runs before it */
    ngx_http_event_handler_pt  write_event_handler;

#if (NGX_THREADS)
    ngx_thread_task_t         *task;
#endif

    unsigned                   headers_sent:1;
    /* the exchange was made before the response, from the request */
    unsigned                   asked:1;
    /* the exchange has had the request body */
    unsigned                   fed_body:1;
    /* the last buffer came in (it may still wait in ctx->in) */
    unsigned                   last_in:1;
    unsigned                   done:1;
    unsigned                   more:1;
    unsigned                   offloaded:1;
} ngx_http_rpcedge_ctx_t;




extern ngx_module_t  ngx_http_rpcedge_filter_module;


/* ngx_http_rpcedge_exchange.c: a response's exchange with the core, made
 * from the request, and freed with the request's pool */
ngx_http_rpcedge_ctx_t *ngx_http_rpcedge_create_ctx(ngx_http_request_t *r);
ngx_int_t ngx_http_rpcedge_new_exchange(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx, ngx_http_rpcedge_conf_t *conf);
void ngx_http_rpcedge_feed_request_body(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx);
void ngx_http_rpcedge_feed_response(ngx_http_request_t *r,
    rpcedge_exchange_t *ex);
void ngx_http_rpcedge_cleanup(void *data);
void ngx_http_rpcedge_stop_timer(void *data);

/* ngx_http_rpcedge_request.c: the precontent handler that asks the node */
ngx_int_t ngx_http_rpcedge_ask_handler(ngx_http_request_t *r);

/* ngx_http_rpcedge_response.c: the header and body filters */
void ngx_http_rpcedge_install_filters(void);

/* ngx_http_rpcedge_edits.c: the exchange's header edits, those it gave last,
 * on the response's head */
ngx_int_t ngx_http_rpcedge_apply_edits(ngx_http_request_t *r,
    rpcedge_exchange_t *ex);

#if (NGX_THREADS)
/* ngx_http_rpcedge_offload.c: ctx->job run in the location's thread pool;
 * done runs on the event loop once it has (its event's data is ctx) */
ngx_int_t ngx_http_rpcedge_thread_post(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx, ngx_event_handler_pt done);
/* how long the job of a done task ran */
uint64_t ngx_http_rpcedge_thread_ns(ngx_thread_task_t *task);
#endif


#endif /* _NGX_HTTP_RPCEDGE_FILTER_H_INCLUDED_ */
