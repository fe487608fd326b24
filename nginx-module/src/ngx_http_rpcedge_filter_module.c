
/*
 * rpcedge: size-gated and streaming compression of JSON-RPC responses, and
 * their transcoding to SSZ for clients that ask for it.
 *
 * Thin glue over rpcedge-core (shared-core/): every decision is the core's.
 * The header filter feeds the request and response heads (and the request
 * body, when the core asks for it to transcode) and gets a plan;
 * a precontent handler feeds the request first, to ask the node for
 * identity (and with rpcedge_transcode_upstream_ssz for SSZ) where the core
 * says so;
 * the body filter feeds the body and sends what the core returns, holding
 * the headers while the core buffers. With "aio threads", the core hands
 * large whole-body compressions out as jobs, run in the thread pool.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <rpcedge.h>

#include "ngx_http_rpcedge_module.h"


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


#if (NGX_THREADS)

/* what a thread sees of an exchange: its job alone, never the request */
typedef struct {
    rpcedge_job_t             *job;
    /* how long the job ran, for compress_time_us */
    uint64_t                   ns;
} ngx_http_rpcedge_thread_ctx_t;

#endif


static ngx_int_t ngx_http_rpcedge_header_filter(ngx_http_request_t *r);
static ngx_int_t ngx_http_rpcedge_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
typedef void (*ngx_http_rpcedge_feed_header_pt)(rpcedge_exchange_t *ex,
    const uint8_t *name, size_t name_len, const uint8_t *value,
    size_t value_len);

static ngx_http_rpcedge_ctx_t *ngx_http_rpcedge_create_ctx(
    ngx_http_request_t *r);
static ngx_int_t ngx_http_rpcedge_new_exchange(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx, ngx_http_rpcedge_conf_t *conf);
static void ngx_http_rpcedge_feed_response(ngx_http_request_t *r,
    rpcedge_exchange_t *ex);
static void ngx_http_rpcedge_feed_request_body(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx);
static ngx_int_t ngx_http_rpcedge_ask_handler(ngx_http_request_t *r);
static void ngx_http_rpcedge_ask_body_handler(ngx_http_request_t *r);
static ngx_int_t ngx_http_rpcedge_ask_node(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx);
static void ngx_http_rpcedge_feed_list(rpcedge_exchange_t *ex,
    ngx_list_t *list, ngx_http_rpcedge_feed_header_pt feed);
static ngx_int_t ngx_http_rpcedge_set_header(ngx_http_request_t *r,
    const rpcedge_header_t *header);
static ngx_int_t ngx_http_rpcedge_apply_edits(ngx_http_request_t *r,
    rpcedge_header_edits_t *edits);
static ngx_int_t ngx_http_rpcedge_send_headers(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx, rpcedge_header_edits_t *edits);
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
static ngx_int_t ngx_http_rpcedge_thread_post(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx);
static void ngx_http_rpcedge_thread_handler(void *data, ngx_log_t *log);
static void ngx_http_rpcedge_thread_event_handler(ngx_event_t *ev);
#endif
static uint64_t ngx_http_rpcedge_now_ns(void);
static void ngx_http_rpcedge_set_timer(ngx_http_rpcedge_ctx_t *ctx);
static void ngx_http_rpcedge_timer_handler(ngx_event_t *ev);
static void ngx_http_rpcedge_cleanup(void *data);
static void ngx_http_rpcedge_stop_timer(void *data);

static ngx_int_t ngx_http_rpcedge_mode_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_rpcedge_ratio_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);

static char *ngx_http_rpcedge_parsed_slot(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static ngx_int_t ngx_http_rpcedge_add_variables(ngx_conf_t *cf);
static void *ngx_http_rpcedge_create_conf(ngx_conf_t *cf);
static char *ngx_http_rpcedge_merge_conf(ngx_conf_t *cf, void *parent,
    void *child);
static ngx_int_t ngx_http_rpcedge_filter_init(ngx_conf_t *cf);


static ngx_http_rpcedge_list_check_t  ngx_http_rpcedge_type_check =
    { rpcedge_check_type, 0 };

/* a value the core parses into rpcedge_config_t's form */
typedef struct {
    int32_t  (*parse)(const uint8_t *value, size_t len, uint32_t *out,
                      rpcedge_error_t *err);
} ngx_http_rpcedge_parser_t;

static ngx_http_rpcedge_parser_t  ngx_http_rpcedge_level_parser =
    { rpcedge_parse_level };
static ngx_http_rpcedge_parser_t  ngx_http_rpcedge_beacon_network_parser =
    { rpcedge_parse_beacon_network };

static ngx_http_rpcedge_check_t  ngx_http_rpcedge_max_buffer_check =
    { ngx_http_rpcedge_check, "max_buffer", NGX_HTTP_RPCEDGE_SIZE_SLOT };
static ngx_http_rpcedge_check_t  ngx_http_rpcedge_stream_level_check =
    { ngx_http_rpcedge_check, "stream_level",
      NGX_HTTP_RPCEDGE_NUM_SLOT };
static ngx_http_rpcedge_check_t  ngx_http_rpcedge_stream_delay_check =
    { ngx_http_rpcedge_check, "stream_delay_ms",
      NGX_HTTP_RPCEDGE_MSEC_SLOT };
static ngx_http_rpcedge_check_t  ngx_http_rpcedge_offload_min_length_check =
    { ngx_http_rpcedge_check, "offload_min_length",
      NGX_HTTP_RPCEDGE_SIZE_SLOT };
static ngx_http_rpcedge_check_t  ngx_http_rpcedge_transcode_max_check =
    { ngx_http_rpcedge_check, "transcode_max", NGX_HTTP_RPCEDGE_SIZE_SLOT };
static ngx_http_rpcedge_check_t  ngx_http_rpcedge_transcode_hold_max_check =
    { ngx_http_rpcedge_check, "transcode_hold_max",
      NGX_HTTP_RPCEDGE_SIZE_SLOT };
static ngx_http_rpcedge_check_t  ngx_http_rpcedge_transcode_budget_check =
    { ngx_http_rpcedge_check, "transcode_budget", NGX_HTTP_RPCEDGE_SIZE_SLOT };


static ngx_command_t  ngx_http_rpcedge_filter_commands[] = {

    { ngx_string("rpcedge"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_HTTP_LIF_CONF
                        |NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_conf_t, enable),
      NULL },

    { ngx_string("rpcedge_max_buffer"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_conf_t, max_buffer),
      &ngx_http_rpcedge_max_buffer_check },

    { ngx_string("rpcedge_level"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_rpcedge_parsed_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_conf_t, level),
      &ngx_http_rpcedge_level_parser },

    { ngx_string("rpcedge_stream_level"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_conf_t, stream_level),
      &ngx_http_rpcedge_stream_level_check },

    { ngx_string("rpcedge_stream_delay"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_conf_t, stream_delay),
      &ngx_http_rpcedge_stream_delay_check },

    { ngx_string("rpcedge_offload_min_length"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_conf_t, offload_min_length),
      &ngx_http_rpcedge_offload_min_length_check },

    { ngx_string("rpcedge_transcode"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_conf_t, transcode),
      NULL },

    { ngx_string("rpcedge_transcode_max"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_conf_t, transcode_max),
      &ngx_http_rpcedge_transcode_max_check },

    { ngx_string("rpcedge_transcode_hold_max"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_conf_t, transcode_hold_max),
      &ngx_http_rpcedge_transcode_hold_max_check },

    { ngx_string("rpcedge_transcode_budget"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_conf_t, transcode_budget),
      &ngx_http_rpcedge_transcode_budget_check },

    { ngx_string("rpcedge_transcode_upstream_ssz"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_conf_t, transcode_upstream_ssz),
      NULL },

    { ngx_string("rpcedge_beacon_network"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_rpcedge_parsed_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_conf_t, beacon_network),
      &ngx_http_rpcedge_beacon_network_parser },

    { ngx_string("rpcedge_types"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_rpcedge_list_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_conf_t, types),
      &ngx_http_rpcedge_type_check },


      ngx_null_command
};


static ngx_http_module_t  ngx_http_rpcedge_filter_module_ctx = {
    ngx_http_rpcedge_add_variables,        /* preconfiguration */
    ngx_http_rpcedge_filter_init,          /* postconfiguration */

    NULL,                                  /* create main configuration */
    NULL,                                  /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_rpcedge_create_conf,          /* create location configuration */
    ngx_http_rpcedge_merge_conf            /* merge location configuration */
};


ngx_module_t  ngx_http_rpcedge_filter_module = {
    NGX_MODULE_V1,
    &ngx_http_rpcedge_filter_module_ctx,   /* module context */
    ngx_http_rpcedge_filter_commands,      /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    NULL,                                  /* init module */
    NULL,                                  /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    NULL,                                  /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


static ngx_http_variable_t  ngx_http_rpcedge_vars[] = {

    { ngx_string("rpcedge_mode"), NULL, ngx_http_rpcedge_mode_variable,
      0, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("rpcedge_ratio"), NULL, ngx_http_rpcedge_ratio_variable,
      0, NGX_HTTP_VAR_NOCACHEABLE, 0 },

      ngx_http_null_variable
};


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;


static ngx_int_t
ngx_http_rpcedge_header_filter(ngx_http_request_t *r)
{
    ngx_uint_t                plan;
    rpcedge_header_edits_t    edits;
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
                                          (uint16_t) r->headers_out.status,
                                          &edits);

#if (NGX_DEBUG)
    mode = rpcedge_exchange_mode(ctx->exchange);

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "rpcedge plan:%ui mode:%*s", plan, mode.len, mode.data);
#endif

    if (plan == RPCEDGE_PLAN_PASS) {
        ctx->done = 1;
        return ngx_http_rpcedge_send_headers(r, ctx, &edits);
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
        return ngx_http_rpcedge_send_headers(r, ctx, &edits);
    }

    /* RPCEDGE_PLAN_BUFFER: the headers wait for the body */

    return NGX_OK;
}


static ngx_http_rpcedge_ctx_t *
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

static ngx_int_t
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

static void
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


static void
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


/*
 * Before the request goes to the node, the exchange is made from it: the
 * node is to answer identity wherever rpcedge may have work on the answer,
 * and with rpcedge_transcode_upstream_ssz it may be asked for SSZ in place of
 * the client's JSON (its body read first when the core wants it)
 */

static ngx_int_t
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


static ngx_int_t
ngx_http_rpcedge_send_headers(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx, rpcedge_header_edits_t *edits)
{
    if (ngx_http_rpcedge_apply_edits(r, edits) != NGX_OK) {
        return NGX_ERROR;
    }

    ctx->headers_sent = 1;

    return ngx_http_next_header_filter(r);
}


static ngx_int_t
ngx_http_rpcedge_apply_edits(ngx_http_request_t *r,
    rpcedge_header_edits_t *edits)
{
    ngx_str_t                  vary;
    ngx_uint_t                 i, vary_encoding;
    ngx_table_elt_t           *h;
#if (NGX_HTTP_GZIP)
    ngx_http_core_loc_conf_t  *clcf;
#endif

    if (edits->content_type) {
        /* static in the core */
        r->headers_out.content_type.data = (u_char *) edits->content_type;
        r->headers_out.content_type.len = edits->content_type_len;
        r->headers_out.content_type_len = edits->content_type_len;
        r->headers_out.content_type_lowcase = NULL;
        r->headers_out.charset.len = 0;
    }

    /*
     * Vary: what the core adds, in one field line; Available-Dictionary in
     * a line of its own, below
     */

    vary_encoding = edits->add_vary;

#if (NGX_HTTP_GZIP)
    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    if (vary_encoding && clcf->gzip_vary) {
        /* gzip may ask for it too: nginx's header filter adds it once */
        r->gzip_vary = 1;
        vary_encoding = 0;
    }
#endif

    if (edits->add_vary_accept || vary_encoding) {
        if (!edits->add_vary_accept) {
            ngx_str_set(&vary, "Accept-Encoding");

        } else if (vary_encoding) {
            ngx_str_set(&vary, "Accept, Accept-Encoding");

        } else {
            ngx_str_set(&vary, "Accept");
        }

        if (ngx_http_rpcedge_push_header(&r->headers_out.headers, "Vary",
                                         vary.data, vary.len)
            == NULL)
        {
            return NGX_ERROR;
        }
    }

    /* a field line of its own, as gzip_vary may have taken Accept-Encoding */

    if (edits->vary_dictionary) {
        if (ngx_http_rpcedge_push_header(&r->headers_out.headers, "Vary",
                                         (u_char *) "Available-Dictionary",
                                         sizeof("Available-Dictionary") - 1)
            == NULL)
        {
            return NGX_ERROR;
        }
    }

    for (i = 0; i < edits->set_len; i++) {
        if (ngx_http_rpcedge_set_header(r, &edits->set[i]) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    /* the node's, for a body that was decoded */

    if (edits->remove_content_encoding && r->headers_out.content_encoding) {
        r->headers_out.content_encoding->hash = 0;
        r->headers_out.content_encoding = NULL;
    }

    if (edits->content_encoding.data) {
        h = ngx_http_rpcedge_push_header(&r->headers_out.headers,
                                         "Content-Encoding",
                                         (u_char *) edits->content_encoding.data,
                                         edits->content_encoding.len);
        if (h == NULL) {
            return NGX_ERROR;
        }

        r->headers_out.content_encoding = h;
    }

    switch (edits->content_length_op) {

    case RPCEDGE_EDIT_SET:
        ngx_http_clear_content_length(r);
        r->headers_out.content_length_n = edits->content_length;
        break;

    case RPCEDGE_EDIT_REMOVE:
        ngx_http_clear_content_length(r);
        break;
    }

    switch (edits->etag_op) {

    case RPCEDGE_EDIT_SET:
        if (r->headers_out.etag == NULL) {
            break;
        }

        r->headers_out.etag->value.data = ngx_pnalloc(r->pool,
                                                      edits->etag_len);
        if (r->headers_out.etag->value.data == NULL) {
            return NGX_ERROR;
        }

        ngx_memcpy(r->headers_out.etag->value.data, edits->etag,
                   edits->etag_len);
        r->headers_out.etag->value.len = edits->etag_len;
        break;

    case RPCEDGE_EDIT_REMOVE:
        ngx_http_clear_etag(r);
        break;
    }

    if (edits->remove_accept_ranges) {
        ngx_http_clear_accept_ranges(r);
    }

    return NGX_OK;
}


/* sets a header the core names, replacing any of that name; the core's
 * strings live only until its next call, so they are copied */

static ngx_int_t
ngx_http_rpcedge_set_header(ngx_http_request_t *r,
    const rpcedge_header_t *header)
{
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    part = &r->headers_out.headers.part;
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

        if (h[i].hash && h[i].key.len == header->name_len
            && ngx_strncasecmp(h[i].key.data, (u_char *) header->name,
                               header->name_len) == 0)
        {
            h[i].hash = 0;
        }
    }

    if (ngx_http_rpcedge_push_copy(r->pool, &r->headers_out.headers, header)
        == NULL)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
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
        if (ngx_http_rpcedge_thread_post(r, ctx) == NGX_OK) {
            ngx_http_rpcedge_count(counts, rpcedge_count_offload(1, counts));
            return NGX_AGAIN;
        }

        ngx_http_rpcedge_count(counts, rpcedge_count_offload(0, counts));
#endif

        /* the next feed completes it */
        return NGX_OK;
    }

    if (out.flags & RPCEDGE_OUT_HEADERS) {
        if (ngx_http_rpcedge_send_headers(r, ctx, &out.edits) == NGX_ERROR) {
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

static ngx_int_t
ngx_http_rpcedge_thread_post(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx)
{
    ngx_str_t                  name;
    ngx_thread_pool_t         *tp;
    ngx_thread_task_t         *task;
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);
    tp = clcf->thread_pool;

    if (tp == NULL) {
        if (ngx_http_complex_value(r, clcf->thread_pool_value, &name)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        tp = ngx_thread_pool_get((ngx_cycle_t *) ngx_cycle, &name);

        if (tp == NULL) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "thread pool \"%V\" not found", &name);
            return NGX_ERROR;
        }
    }

    task = ctx->task;

    if (task == NULL) {
        task = ngx_thread_task_alloc(r->pool,
                                     sizeof(ngx_http_rpcedge_thread_ctx_t));
        if (task == NULL) {
            return NGX_ERROR;
        }

        task->handler = ngx_http_rpcedge_thread_handler;
        ctx->task = task;
    }

    /* the thread sees the job alone, never the request */

    ((ngx_http_rpcedge_thread_ctx_t *) task->ctx)->job = ctx->job;

    /* what the completion needs: r->ctx may be cleared by then (a redirect) */

    task->event.data = ctx;
    task->event.handler = ngx_http_rpcedge_thread_event_handler;

    if (ngx_thread_task_post(tp, task) != NGX_OK) {
        return NGX_ERROR;
    }

    /* the request may be finalized meanwhile, but is not freed */

    r->main->blocked++;
    ctx->offloaded = 1;

    return NGX_OK;
}


static void
ngx_http_rpcedge_thread_handler(void *data, ngx_log_t *log)
{
    ngx_http_rpcedge_thread_ctx_t  *tctx = data;

    uint64_t  started;

    ngx_log_debug0(NGX_LOG_DEBUG_CORE, log, 0, "rpcedge thread handler");

    started = ngx_http_rpcedge_now_ns();
    rpcedge_job_run(tctx->job);
    tctx->ns = ngx_http_rpcedge_now_ns() - started;
}


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
    ctx->compress_ns += ((ngx_http_rpcedge_thread_ctx_t *) ctx->task->ctx)->ns;

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


/* the core's work is timed finer than nginx's cached milliseconds */

static uint64_t
ngx_http_rpcedge_now_ns(void)
{
    struct timespec  ts;

    (void) clock_gettime(CLOCK_MONOTONIC, &ts);

    return (uint64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}


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


static void
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


static void
ngx_http_rpcedge_stop_timer(void *data)
{
    ngx_http_rpcedge_ctx_t  *ctx = data;

    if (ctx->timer.timer_set) {
        ngx_del_timer(&ctx->timer);
    }
}


static ngx_int_t
ngx_http_rpcedge_mode_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    rpcedge_str_t            mode;
    ngx_http_rpcedge_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_rpcedge_filter_module);

    if (ctx == NULL || ctx->exchange == NULL || ctx->offloaded) {
        v->not_found = 1;
        return NGX_OK;
    }

    mode = rpcedge_exchange_mode(ctx->exchange);

    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;
    v->data = (u_char *) mode.data;
    v->len = mode.len;

    return NGX_OK;
}


static ngx_int_t
ngx_http_rpcedge_ratio_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    uint64_t                 in, out;
    ngx_uint_t               whole, frac;
    ngx_http_rpcedge_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_rpcedge_filter_module);

    if (ctx == NULL || ctx->exchange == NULL || ctx->offloaded) {
        v->not_found = 1;
        return NGX_OK;
    }

    rpcedge_exchange_counts(ctx->exchange, &in, &out);

    if (out == 0) {
        v->not_found = 1;
        return NGX_OK;
    }

    v->data = ngx_pnalloc(r->pool, NGX_INT64_LEN + 3);
    if (v->data == NULL) {
        return NGX_ERROR;
    }

    whole = (ngx_uint_t) (in / out);
    frac = (ngx_uint_t) ((in * 100 / out) % 100);

    v->len = ngx_sprintf(v->data, "%ui.%02ui", whole, frac) - v->data;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;

    return NGX_OK;
}


/*
 * "auto" or a level, a chain's name: the core parses it, as it does the JSON
 * of the other hosts
 */

static char *
ngx_http_rpcedge_parsed_slot(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    char  *p = conf;

    uint32_t                    parsed;
    ngx_int_t                  *field;
    ngx_str_t                  *value;
    rpcedge_error_t             err;
    ngx_http_rpcedge_parser_t  *parser;

    field = (ngx_int_t *) (p + cmd->offset);

    if (*field != NGX_CONF_UNSET) {
        return "is duplicate";
    }

    value = cf->args->elts;
    parser = cmd->post;

    if (parser->parse(value[1].data, value[1].len, &parsed, &err) != 0) {
        return ngx_http_rpcedge_conf_error(cf, &err);
    }

    *field = parsed;

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_rpcedge_add_variables(ngx_conf_t *cf)
{
    return ngx_http_rpcedge_add_variables_of(cf, ngx_http_rpcedge_vars);
}


static void *
ngx_http_rpcedge_create_conf(ngx_conf_t *cf)
{
    ngx_http_rpcedge_conf_t  *conf;

    conf = ngx_pcalloc(cf->pool, sizeof(ngx_http_rpcedge_conf_t));
    if (conf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     conf->settings = NULL;
     */

    conf->enable = NGX_CONF_UNSET;
    conf->max_buffer = NGX_CONF_UNSET_SIZE;
    conf->level = NGX_CONF_UNSET;
    conf->stream_level = NGX_CONF_UNSET;
    conf->stream_delay = NGX_CONF_UNSET_MSEC;
    conf->offload_min_length = NGX_CONF_UNSET_SIZE;
    conf->transcode = NGX_CONF_UNSET;
    conf->transcode_max = NGX_CONF_UNSET_SIZE;
    conf->transcode_hold_max = NGX_CONF_UNSET_SIZE;
    conf->transcode_budget = NGX_CONF_UNSET_SIZE;
    conf->transcode_upstream_ssz = NGX_CONF_UNSET;
    conf->beacon_network = NGX_CONF_UNSET;
    conf->types = NGX_CONF_UNSET_PTR;

    return conf;
}


static char *
ngx_http_rpcedge_merge_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_rpcedge_conf_t *prev = parent;
    ngx_http_rpcedge_conf_t *conf = child;

    rpcedge_config_t   config;

    /* the core's defaults are the one source of defaults */

    config = rpcedge_config_default();

    ngx_conf_merge_value(conf->enable, prev->enable, 0);
    ngx_conf_merge_size_value(conf->max_buffer, prev->max_buffer,
                              config.max_buffer);
    ngx_conf_merge_value(conf->level, prev->level, config.level);
    ngx_conf_merge_value(conf->stream_level, prev->stream_level,
                         config.stream_level);
    ngx_conf_merge_msec_value(conf->stream_delay, prev->stream_delay,
                              config.stream_delay_ms);
    ngx_conf_merge_size_value(conf->offload_min_length,
                              prev->offload_min_length,
                              config.offload_min_length);
    ngx_conf_merge_value(conf->transcode, prev->transcode, config.transcode);
    ngx_conf_merge_size_value(conf->transcode_max, prev->transcode_max,
                              config.transcode_max);
    ngx_conf_merge_size_value(conf->transcode_hold_max,
                              prev->transcode_hold_max,
                              config.transcode_hold_max);
    ngx_conf_merge_size_value(conf->transcode_budget, prev->transcode_budget,
                              config.transcode_budget);
    ngx_conf_merge_value(conf->transcode_upstream_ssz,
                         prev->transcode_upstream_ssz,
                         config.transcode_upstream_ssz);
    ngx_conf_merge_value(conf->beacon_network, prev->beacon_network,
                         config.beacon_network);
    ngx_conf_merge_ptr_value(conf->types, prev->types, NULL);

    config.min_length = ngx_http_rpcedge_conf_min_length(cf);
    config.max_buffer = conf->max_buffer;
    config.level = conf->level;
    config.stream_level = conf->stream_level;
    config.stream_delay_ms = conf->stream_delay;
    config.offload_min_length = conf->offload_min_length;
    config.transcode = conf->transcode;
    config.transcode_max = conf->transcode_max;
    config.transcode_hold_max = conf->transcode_hold_max;
    config.transcode_budget = conf->transcode_budget;
    config.transcode_upstream_ssz = conf->transcode_upstream_ssz;
    config.beacon_network = conf->beacon_network;

    if (ngx_http_rpcedge_strs(cf, conf->types, &config.types,
                              &config.types_len)
        != NGX_OK
        || ngx_http_rpcedge_conf_encodings(cf, &config) != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    if (!conf->enable) {
        /* each directive was checked as it was read */
        return NGX_CONF_OK;
    }

    conf->settings = ngx_http_rpcedge_settings(cf, &config);

    return conf->settings ? NGX_CONF_OK : NGX_CONF_ERROR;
}


static ngx_int_t
ngx_http_rpcedge_filter_init(ngx_conf_t *cf)
{
    ngx_http_handler_pt        *h;
    ngx_http_core_main_conf_t  *cmcf;

    /* registered before the cache's handler, so it runs after: see config */

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_PRECONTENT_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_rpcedge_ask_handler;

    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_rpcedge_header_filter;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_rpcedge_body_filter;

    return NGX_OK;
}
