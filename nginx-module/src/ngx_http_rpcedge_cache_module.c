
/*
 * rpcedge cache: JSON-RPC answers from rpcedge-cached, the shared store.
 *
 * Thin glue over the core's cache exchange (rpcedge_cache_*): every decision
 * is the core's. A precontent handler reads the request body and asks the
 * daemon with a background subrequest to an internal location that proxies
 * to it (rpcedge_cache_pass), waiting at most rpcedge_cache_timeout. A hit
 * is answered from there; otherwise the request goes on to the node, this
 * module's body filter holds the node's plain answer, and once the answer
 * has gone out a second background subrequest stores it, ended if it takes
 * longer than rpcedge_cache_store_timeout. A JSON-RPC batch is looked up
 * key by key in one multi-key lookup (one per shard, one after the other);
 * the node is sent the calls that missed, and its answer is held, merged with
 * the cache's in the client's order, and sent with its own length. A call's
 * miss holds its key in the daemon while the node answers (coalescing): a
 * concurrent miss of the same key waits, at most rpcedge_cache_lock_timeout,
 * for the answer the store hands over, and a holder with none to store
 * releases the key with one more background subrequest (a holder whose
 * client went away leaves that to the worker's next lookup). With
 * rpcedge_cache_hot, the daemon's hits are also kept in a shared memory
 * zone (the core's hot tier), which answers them again without the trip. The filter sits
 * just above postpone, so that it sees the daemon's answers before postpone
 * would hold them, and the node's body before rpcedge compresses it.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <rpcedge.h>

#include "ngx_http_rpcedge_module.h"


/* the hot tier: a region of a shared memory zone, laid out by the core */
typedef struct {
    ngx_slab_pool_t            *shpool;
    u_char                     *region;
    size_t                      len;
} ngx_http_rpcedge_cache_hot_t;


typedef struct {
    ngx_flag_t                  enable;
    ngx_str_t                   pass;
    ngx_shm_zone_t             *hot;
    /* rpcedge_cache_namespace, or none */
    ngx_str_t                   ns;
    /* without it: the server's first server_name and the location's name */
    ngx_str_t                   default_ns;
    ngx_msec_t                  timeout;
    ngx_flag_t                  status_header;
    ngx_flag_t                  status_reason;
    ngx_int_t                   shards;
    time_t                      store_timeout;
    size_t                      max_request;
    size_t                      max_entry;
    time_t                      chain_ttl;
    ngx_uint_t                  max_batch;
    ngx_msec_t                  lock_timeout;
    /* the core's settings, with the limits above */
    rpcedge_settings_t         *settings;
} ngx_http_rpcedge_cache_conf_t;


typedef enum {
    ngx_http_rpcedge_cache_reading = 0,
    ngx_http_rpcedge_cache_looking,
    ngx_http_rpcedge_cache_hit,
    ngx_http_rpcedge_cache_answered,
    ngx_http_rpcedge_cache_pass_on,
    /* the node's body could not be made what the core asked for */
    ngx_http_rpcedge_cache_failed_on
} ngx_http_rpcedge_cache_state_e;


/* bytes held in one piece, grown in the request's pool */
typedef struct {
    u_char                     *data;
    size_t                      len;
    size_t                      size;
} ngx_http_rpcedge_cache_bytes_t;


/* the client's request */
typedef struct {
    ngx_http_request_t         *request;
    rpcedge_cache_t            *cache;
    ngx_http_rpcedge_cache_state_e  state;
    /* the lookup, then the store: ended if it outlives its timeout */
    ngx_http_request_t         *call;
    ngx_event_t                 timer;
    /* the node's plain answer, for the store */
    ngx_http_rpcedge_cache_bytes_t  held;
    unsigned                    holding:1;
    /* the node's answer to a split batch is held, and the merged one sent */
    unsigned                    replacing:1;
    /* the status is counted once, at the answer's head */
    unsigned                    counted:1;
    /* the answer's last buffer has passed */
    unsigned                    ended:1;
} ngx_http_rpcedge_cache_ctx_t;


/* a subrequest to the daemon: a lookup (its answer is kept) or a store */
typedef struct {
    /* the daemon it goes to: $rpcedge_cache_shard */
    ngx_uint_t                  shard;
    ngx_uint_t                  status;
    /* the daemon's answer: its headers, as the core reads them */
    rpcedge_header_t           *headers;
    size_t                      nheaders;
    ngx_http_rpcedge_cache_bytes_t  answer;
    unsigned                    lookup:1;
    unsigned                    complete:1;
    unsigned                    too_large:1;
} ngx_http_rpcedge_cache_call_t;


/*
 * a key held by a request that ended without its answer (its client went
 * away: nginx drops the subrequests of a request it terminates), released
 * by this worker's next lookup through the same server and daemons
 */
typedef struct {
    ngx_http_core_srv_conf_t   *server;
    ngx_str_t                   pass;
    ngx_uint_t                  shard;
    size_t                      method_len;
    u_char                      method[16];
    size_t                      path_len;
    u_char                      path[128];
} ngx_http_rpcedge_cache_orphan_t;


/* past this many, the daemon lets a key go at the lock's time */
#define NGX_HTTP_RPCEDGE_CACHE_ORPHANS  16


static ngx_int_t ngx_http_rpcedge_cache_handler(ngx_http_request_t *r);
static void ngx_http_rpcedge_cache_body_handler(ngx_http_request_t *r);
static void ngx_http_rpcedge_cache_new(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx, rpcedge_str_t body);
static void ngx_http_rpcedge_cache_lookup(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx);
static ngx_int_t ngx_http_rpcedge_cache_ask(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx);
static ngx_int_t ngx_http_rpcedge_cache_forward(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx);
static ngx_uint_t ngx_http_rpcedge_cache_find_hot(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx, ngx_shm_zone_t *zone);
static void ngx_http_rpcedge_cache_keep_hot(ngx_http_rpcedge_cache_ctx_t *ctx,
    ngx_shm_zone_t *zone, ngx_http_rpcedge_cache_call_t *call);
static ngx_int_t ngx_http_rpcedge_cache_looked_up(ngx_http_request_t *r,
    void *data, ngx_int_t rc);
static void ngx_http_rpcedge_cache_timed_out(ngx_event_t *ev);
static void ngx_http_rpcedge_cache_store_timed_out(ngx_event_t *ev);
static ngx_int_t ngx_http_rpcedge_cache_send_hit(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx);
static void ngx_http_rpcedge_cache_store(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx);
static void ngx_http_rpcedge_cache_put(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx, rpcedge_daemon_call_t *put);
static ngx_int_t ngx_http_rpcedge_cache_set_body(ngx_http_request_t *sr,
    rpcedge_str_t body);
static ngx_int_t ngx_http_rpcedge_cache_replace(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx, ngx_chain_t *in);
static void ngx_http_rpcedge_cache_orphan(ngx_http_request_t *r,
    rpcedge_daemon_call_t *release);
static void ngx_http_rpcedge_cache_release_orphans(ngx_http_request_t *r);
static void ngx_http_rpcedge_cache_ended(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx, ngx_int_t rc);
static ngx_int_t ngx_http_rpcedge_cache_stored(ngx_http_request_t *r,
    void *data, ngx_int_t rc);
static ngx_http_request_t *ngx_http_rpcedge_cache_call(ngx_http_request_t *r,
    rpcedge_daemon_call_t *dc, ngx_http_post_subrequest_t *ps,
    ngx_uint_t lookup);
static ngx_int_t ngx_http_rpcedge_cache_hold(ngx_pool_t *pool,
    ngx_http_rpcedge_cache_bytes_t *bytes, ngx_buf_t *b, size_t limit);
static rpcedge_header_t *ngx_http_rpcedge_cache_headers(ngx_pool_t *pool,
    ngx_list_t *list, ngx_str_t *content_type, ngx_hash_t *hide, size_t *n);
static void ngx_http_rpcedge_cache_cleanup(void *data);
static void ngx_http_rpcedge_cache_stop_timer(void *data);

static ngx_int_t ngx_http_rpcedge_cache_status_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_rpcedge_cache_shard_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);

static char *ngx_http_rpcedge_cache_check_pass(ngx_conf_t *cf, void *post,
    void *data);
static char *ngx_http_rpcedge_cache_check_ns(ngx_conf_t *cf, void *post,
    void *data);
static char *ngx_http_rpcedge_cache_hot(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static ngx_int_t ngx_http_rpcedge_cache_init_hot(ngx_shm_zone_t *shm_zone,
    void *data);
static ngx_int_t ngx_http_rpcedge_cache_add_variables(ngx_conf_t *cf);
static void *ngx_http_rpcedge_cache_create_conf(ngx_conf_t *cf);
static char *ngx_http_rpcedge_cache_default_ns(ngx_conf_t *cf,
    ngx_http_rpcedge_cache_conf_t *conf);
static char *ngx_http_rpcedge_cache_merge_conf(ngx_conf_t *cf, void *parent,
    void *child);
static ngx_int_t ngx_http_rpcedge_cache_init(ngx_conf_t *cf);


static ngx_conf_post_handler_pt  ngx_http_rpcedge_cache_pass_post =
    ngx_http_rpcedge_cache_check_pass;

static ngx_conf_post_handler_pt  ngx_http_rpcedge_cache_ns_post =
    ngx_http_rpcedge_cache_check_ns;

static ngx_http_rpcedge_check_t  ngx_http_rpcedge_cache_timeout_check =
    { ngx_http_rpcedge_check, "cache_timeout_ms", NGX_HTTP_RPCEDGE_MSEC_SLOT };

static ngx_http_rpcedge_check_t  ngx_http_rpcedge_cache_shards_check =
    { ngx_http_rpcedge_check, "cache_shards", NGX_HTTP_RPCEDGE_NUM_SLOT };

static ngx_http_rpcedge_check_t  ngx_http_rpcedge_cache_store_timeout_check =
    { ngx_http_rpcedge_check, "cache_store_timeout_s",
      NGX_HTTP_RPCEDGE_SEC_SLOT };

static ngx_http_rpcedge_check_t  ngx_http_rpcedge_cache_max_request_check =
    { ngx_http_rpcedge_check, "cache_max_request",
      NGX_HTTP_RPCEDGE_SIZE_SLOT };

static ngx_http_rpcedge_check_t  ngx_http_rpcedge_cache_max_entry_check =
    { ngx_http_rpcedge_check, "cache_max_entry", NGX_HTTP_RPCEDGE_SIZE_SLOT };

static ngx_http_rpcedge_check_t  ngx_http_rpcedge_cache_max_batch_check =
    { ngx_http_rpcedge_check, "cache_max_batch", NGX_HTTP_RPCEDGE_NUM_SLOT };
static ngx_http_rpcedge_check_t  ngx_http_rpcedge_cache_lock_timeout_check =
    { ngx_http_rpcedge_check, "cache_lock_timeout_ms",
      NGX_HTTP_RPCEDGE_MSEC_SLOT };

static ngx_http_rpcedge_check_t  ngx_http_rpcedge_cache_chain_ttl_check =
    { ngx_http_rpcedge_check, "cache_chain_ttl_s", NGX_HTTP_RPCEDGE_SEC_SLOT };


static ngx_command_t  ngx_http_rpcedge_cache_commands[] = {

    { ngx_string("rpcedge_cache"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_cache_conf_t, enable),
      NULL },

    { ngx_string("rpcedge_cache_pass"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_cache_conf_t, pass),
      &ngx_http_rpcedge_cache_pass_post },

    { ngx_string("rpcedge_cache_hot"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_rpcedge_cache_hot,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("rpcedge_cache_namespace"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_cache_conf_t, ns),
      &ngx_http_rpcedge_cache_ns_post },

    { ngx_string("rpcedge_cache_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_cache_conf_t, timeout),
      &ngx_http_rpcedge_cache_timeout_check },

    { ngx_string("rpcedge_cache_status_header"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_cache_conf_t, status_header),
      NULL },

    { ngx_string("rpcedge_cache_status_reason"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_cache_conf_t, status_reason),
      NULL },

    { ngx_string("rpcedge_cache_shards"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_cache_conf_t, shards),
      &ngx_http_rpcedge_cache_shards_check },

    { ngx_string("rpcedge_cache_store_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_sec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_cache_conf_t, store_timeout),
      &ngx_http_rpcedge_cache_store_timeout_check },

    { ngx_string("rpcedge_cache_max_request"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_cache_conf_t, max_request),
      &ngx_http_rpcedge_cache_max_request_check },

    { ngx_string("rpcedge_cache_max_entry"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_cache_conf_t, max_entry),
      &ngx_http_rpcedge_cache_max_entry_check },

    { ngx_string("rpcedge_cache_max_batch"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_cache_conf_t, max_batch),
      &ngx_http_rpcedge_cache_max_batch_check },

    { ngx_string("rpcedge_cache_lock_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_cache_conf_t, lock_timeout),
      &ngx_http_rpcedge_cache_lock_timeout_check },

    { ngx_string("rpcedge_cache_chain_ttl"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_sec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_cache_conf_t, chain_ttl),
      &ngx_http_rpcedge_cache_chain_ttl_check },

      ngx_null_command
};


static ngx_http_rpcedge_cache_orphan_t
    ngx_http_rpcedge_cache_orphans[NGX_HTTP_RPCEDGE_CACHE_ORPHANS];
static ngx_uint_t  ngx_http_rpcedge_cache_norphans;


static ngx_http_module_t  ngx_http_rpcedge_cache_module_ctx = {
    ngx_http_rpcedge_cache_add_variables,  /* preconfiguration */
    ngx_http_rpcedge_cache_init,           /* postconfiguration */

    NULL,                                  /* create main configuration */
    NULL,                                  /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_rpcedge_cache_create_conf,    /* create location configuration */
    ngx_http_rpcedge_cache_merge_conf      /* merge location configuration */
};


ngx_module_t  ngx_http_rpcedge_cache_module = {
    NGX_MODULE_V1,
    &ngx_http_rpcedge_cache_module_ctx,    /* module context */
    ngx_http_rpcedge_cache_commands,       /* module directives */
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


static ngx_http_variable_t  ngx_http_rpcedge_cache_vars[] = {

    { ngx_string("rpcedge_cache_status"), NULL,
      ngx_http_rpcedge_cache_status_variable, 0, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    /* for rpcedge_cache_pass locations: which daemon holds the key */
    { ngx_string("rpcedge_cache_shard"), NULL,
      ngx_http_rpcedge_cache_shard_variable, 0, NGX_HTTP_VAR_NOCACHEABLE, 0 },

      ngx_http_null_variable
};



static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;


static ngx_int_t
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
    ngx_http_rpcedge_cache_conf_t  *conf;

    conf = ngx_http_get_module_loc_conf(r, ngx_http_rpcedge_cache_module);

    ctx->state = ngx_http_rpcedge_cache_pass_on;

    ngx_http_rpcedge_cache_new(r, ctx, ngx_http_rpcedge_request_body(r));

    if (ctx->cache == NULL) {
        return;
    }

    ngx_http_rpcedge_cache_release_orphans(r);

    if (conf->hot && ngx_http_rpcedge_cache_find_hot(r, ctx, conf->hot)) {
        ctx->state = ngx_http_rpcedge_cache_hit;
        return;
    }

    if (ngx_http_rpcedge_cache_ask(r, ctx) == NGX_ERROR) {
        rpcedge_cache_failed(ctx->cache);
    }

    if (ctx->state == ngx_http_rpcedge_cache_pass_on
        && ngx_http_rpcedge_cache_forward(r, ctx) != NGX_OK)
    {
        ctx->state = ngx_http_rpcedge_cache_failed_on;
    }
}


/* the next lookup the core asks for, a subrequest that waits as long as the
 * core says (rpcedge_cache_timeout, or the lock's time for a miss that waits
 * for another's answer); NGX_DECLINED when there is none */

static ngx_int_t
ngx_http_rpcedge_cache_ask(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx)
{
    ngx_http_request_t          *sr;
    rpcedge_daemon_call_t        lookup;
    ngx_http_post_subrequest_t  *ps;

    if (!rpcedge_cache_next_lookup(ctx->cache, &lookup)) {
        return NGX_DECLINED;
    }

    ps = ngx_palloc(r->pool, sizeof(ngx_http_post_subrequest_t));
    if (ps == NULL) {
        return NGX_ERROR;
    }

    ps->handler = ngx_http_rpcedge_cache_looked_up;
    ps->data = ctx;

    sr = ngx_http_rpcedge_cache_call(r, &lookup, ps, 1);
    if (sr == NULL) {
        return NGX_ERROR;
    }

    ctx->call = sr;
    ctx->timer.handler = ngx_http_rpcedge_cache_timed_out;

    ngx_add_timer(&ctx->timer, (ngx_msec_t) lookup.timeout_ms);

    ctx->state = ngx_http_rpcedge_cache_looking;

    return NGX_OK;
}


/* the lookups are over: the node gets the body the core gives (a batch less
 * the calls the cache answered), if any, in place of the client's */

static ngx_int_t
ngx_http_rpcedge_cache_forward(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx)
{
    u_char         *p;
    ngx_buf_t      *b;
    ngx_chain_t    *cl;
    rpcedge_str_t   body;

    if (ctx->cache == NULL || !rpcedge_cache_node_request(ctx->cache, &body)) {
        return NGX_OK;
    }

    /* the core merges the node's answer as if it had the smaller batch */

    b = ngx_calloc_buf(r->pool);
    cl = ngx_alloc_chain_link(r->pool);

    if (b == NULL || cl == NULL || r->request_body == NULL) {
        return NGX_ERROR;
    }

    /* the body stays in ctx->cache until the request's pool goes */

    b->start = (u_char *) body.data;
    b->pos = b->start;
    b->last = b->start + body.len;
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


/* a hit from the hot tier: the entry is copied out under the zone's lock,
 * and the hit put together after it is released */

static ngx_uint_t
ngx_http_rpcedge_cache_find_hot(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx, ngx_shm_zone_t *zone)
{
    uint64_t                       min_length;
    ngx_uint_t                     found;
    ngx_http_rpcedge_cache_hot_t  *hot = zone->data;

    min_length = ngx_http_rpcedge_min_length(r);

    /* a call's hit is made under the lock: the entry is copied once, into it */

    ngx_shmtx_lock(&hot->shpool->mutex);
    found = rpcedge_cache_hot_find(ctx->cache, hot->region, hot->len,
                                   ngx_time(), min_length);
    ngx_shmtx_unlock(&hot->shpool->mutex);

    return found && rpcedge_cache_hot_hit(ctx->cache, min_length);
}


static void
ngx_http_rpcedge_cache_keep_hot(ngx_http_rpcedge_cache_ctx_t *ctx,
    ngx_shm_zone_t *zone, ngx_http_rpcedge_cache_call_t *call)
{
    ngx_http_rpcedge_cache_hot_t  *hot = zone->data;

    ngx_shmtx_lock(&hot->shpool->mutex);
    rpcedge_cache_hot_keep(ctx->cache, hot->region, hot->len,
                           call->answer.data, call->answer.len, ngx_time());
    ngx_shmtx_unlock(&hot->shpool->mutex);
}


static ngx_int_t
ngx_http_rpcedge_cache_looked_up(ngx_http_request_t *r, void *data,
    ngx_int_t rc)
{
    ngx_http_rpcedge_cache_ctx_t   *ctx = data;

    int32_t                         hit;
    ngx_http_request_t             *mr;
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
        && call->status != 0)
    {
        hit = rpcedge_cache_answered(ctx->cache, (uint16_t) call->status,
                                     call->headers, call->nheaders,
                                     call->answer.data, call->answer.len,
                                     ngx_http_rpcedge_min_length(mr));

        /* what it found: a call's hit, a batch's entries */

        conf = ngx_http_get_module_loc_conf(mr, ngx_http_rpcedge_cache_module);

        if (conf->hot) {
            ngx_http_rpcedge_cache_keep_hot(ctx, conf->hot, call);
        }

        if (hit) {
            ctx->state = ngx_http_rpcedge_cache_hit;

        } else {
            /* a batch's keys on another shard, or the wait for the answer
             * another request for the key is getting */

            switch (ngx_http_rpcedge_cache_ask(mr, ctx)) {

            case NGX_OK:
                return NGX_OK;

            case NGX_ERROR:
                rpcedge_cache_failed(ctx->cache);
                /* fall through */

            default:
                ctx->state = ngx_http_rpcedge_cache_pass_on;
            }
        }

    } else {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "rpcedge cache: lookup failed (%i, status %ui)",
                      rc, call ? call->status : 0);

        rpcedge_cache_failed(ctx->cache);
        ctx->state = ngx_http_rpcedge_cache_pass_on;
    }

    if (ctx->state == ngx_http_rpcedge_cache_pass_on
        && ngx_http_rpcedge_cache_forward(mr, ctx) != NGX_OK)
    {
        ctx->state = ngx_http_rpcedge_cache_failed_on;
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

    ngx_connection_t    *c;
    ngx_http_upstream_t *u;
    ngx_http_request_t  *r;

    r = ctx->request;
    c = r->connection;

    ngx_log_error(NGX_LOG_INFO, c->log, 0,
                  "rpcedge cache: no answer from the daemon in time");

    rpcedge_cache_failed(ctx->cache);
    ctx->state = ngx_http_rpcedge_cache_pass_on;

    if (ngx_http_rpcedge_cache_forward(r, ctx) != NGX_OK) {
        ctx->state = ngx_http_rpcedge_cache_failed_on;
    }

    /*
     * end the lookup now: a background subrequest holds the client's
     * connection (keepalive, an HTTP/2 stream) until it ends
     */

    u = ctx->call->upstream;

    if (u && u->cleanup && *u->cleanup) {
        (*u->cleanup)(ctx->call);
    }

    r->write_event_handler(r);
    ngx_http_run_posted_requests(c);
}


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


static ngx_int_t
ngx_http_rpcedge_cache_send_hit(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx)
{
    u_char           *data, *v, *p;
    size_t            i;
    uint16_t          status;
    ngx_int_t         rc, gzip;
    ngx_buf_t        *b;
    ngx_chain_t       out;
    rpcedge_str_t     body, name, value;
    ngx_table_elt_t  *h;

    ctx->state = ngx_http_rpcedge_cache_answered;

    if (ngx_http_rpcedge_answer_from_cache(r) != NGX_OK) {
        return NGX_ERROR;
    }

    gzip = rpcedge_cache_hit(ctx->cache, &status, &body);

    r->headers_out.status = status;

    /* the core's headers: Content-Type, Content-Encoding, Vary, the node's */

    for (i = 0; rpcedge_cache_hit_header(ctx->cache, i, &name, &value); i++) {
        data = ngx_pnalloc(r->pool, name.len + 1 + value.len);
        if (data == NULL) {
            return NGX_ERROR;
        }

        ngx_cpystrn(data, (u_char *) name.data, name.len + 1);
        ngx_memcpy(data + name.len + 1, value.data, value.len);

        if (name.len == sizeof("content-type") - 1
            && ngx_strncmp(data, "content-type", name.len) == 0)
        {
            /* the type alone, as nginx's charset filter wants it */

            v = data + name.len + 1;
            p = ngx_strlchr(v, v + value.len, ';');

            r->headers_out.content_type.data = v;
            r->headers_out.content_type.len = value.len;
            r->headers_out.content_type_len = p ? (size_t) (p - v) : value.len;
            r->headers_out.content_type_lowcase = NULL;

            continue;
        }

        h = ngx_http_rpcedge_push_header(&r->headers_out.headers,
                                         (char *) data, data + name.len + 1,
                                         value.len);
        if (h == NULL) {
            return NGX_ERROR;
        }

        if (gzip && name.len == sizeof("content-encoding") - 1
            && ngx_strncmp(data, "content-encoding", name.len) == 0)
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


static void
ngx_http_rpcedge_cache_store(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx)
{
    rpcedge_daemon_call_t  put;

    if (!rpcedge_cache_store(ctx->cache, ctx->held.data, ctx->held.len,
                             &put))
    {
        return;
    }

    if (ctx->held.data) {
        ngx_pfree(r->pool, ctx->held.data);
        ngx_memzero(&ctx->held, sizeof(ngx_http_rpcedge_cache_bytes_t));
    }

    ngx_http_rpcedge_cache_put(r, ctx, &put);
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

static ngx_http_request_t *
ngx_http_rpcedge_cache_call(ngx_http_request_t *r, rpcedge_daemon_call_t *dc,
    ngx_http_post_subrequest_t *ps, ngx_uint_t lookup)
{
    u_char                         *p;
    size_t                          i;
    ngx_str_t                       uri;
    ngx_http_request_t             *sr;
    const rpcedge_header_t         *header;
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
        header = &dc->headers[i];

        p = ngx_pnalloc(r->pool, header->name_len + 1 + header->value_len);
        if (p == NULL) {
            return NULL;
        }

        ngx_cpystrn(p, (u_char *) header->name, header->name_len + 1);
        ngx_memcpy(p + header->name_len + 1, header->value,
                   header->value_len);

        if (ngx_http_rpcedge_push_header(&sr->headers_in.headers, (char *) p,
                                         p + header->name_len + 1,
                                         header->value_len)
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

    call->shard = dc->shard;
    call->lookup = lookup;

    ngx_http_set_ctx(sr, call, ngx_http_rpcedge_cache_module);

    return sr;
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

        call->headers = ngx_http_rpcedge_cache_headers(r->pool,
                                                       &r->headers_out.headers,
                                                       NULL, NULL,
                                                       &call->nheaders);
        if (call->headers == NULL) {
            call->status = 0;
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

            length = r->headers_out.content_length_n;

            if (length > 0) {
                ctx->held.data = ngx_pnalloc(r->pool, length);
                if (ctx->held.data == NULL) {
                    return NGX_ERROR;
                }

                ctx->held.size = length;
            }
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

        if (ctx->holding
            && (ngx_http_rpcedge_cache_hold(r->pool, &ctx->held, cl->buf,
                                            (size_t) -1)
                != NGX_OK
                || !rpcedge_cache_keep_holding(ctx->cache, ctx->held.len)))
        {
            ctx->holding = 0;
        }

        last |= cl->buf->last_buf;
    }

    rc = ngx_http_next_body_filter(r, in);

    if (last) {
        ngx_http_rpcedge_cache_ended(r, ctx, rc);
    }

    return rc;
}


/* the node's answer to a split batch: held whole (its buffers consumed), then
 * the merged answer goes out with its headers and exact length; past what is
 * held, the cache's answers go first and the rest of the node's after them */

static ngx_int_t
ngx_http_rpcedge_cache_replace(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx, ngx_chain_t *in)
{
    ngx_int_t       rc;
    ngx_uint_t      last;
    ngx_buf_t      *b;
    ngx_chain_t    *cl, out;
    rpcedge_str_t   answer;

    last = 0;

    for (cl = in; cl; cl = cl->next) {

        if (ngx_http_rpcedge_cache_hold(r->pool, &ctx->held, cl->buf,
                                        (size_t) -1)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        last |= cl->buf->last_buf;

        cl->buf->pos = cl->buf->last;
        cl->buf->file_pos = cl->buf->file_last;
    }

    if (!last && rpcedge_cache_keep_holding(ctx->cache, ctx->held.len)) {
        return NGX_OK;
    }

    rpcedge_cache_batch_answer(ctx->cache, ctx->held.data, ctx->held.len,
                               (int32_t) last, &answer);

    ctx->replacing = 0;
    ctx->holding = last;

    r->headers_out.content_length_n = last ? (off_t) answer.len : -1;

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
    b->last_buf = last;
    b->flush = !last;

    out.buf = b;
    out.next = NULL;

    rc = ngx_http_next_body_filter(r, &out);

    if (last) {
        ngx_http_rpcedge_cache_ended(r, ctx, rc);
    }

    return rc;
}


/* the client has the whole answer on its way: store it behind it, or count
 * why the core would not keep it */

static void
ngx_http_rpcedge_cache_ended(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx, ngx_int_t rc)
{
    size_t                 n;
    rpcedge_count_t        counts[RPCEDGE_COUNTS_MAX];
    rpcedge_daemon_call_t  release;

    ctx->ended = 1;

    if (ctx->holding && rc != NGX_ERROR) {
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
        (void) ngx_http_rpcedge_cache_call(r, &release, NULL, 0);
    }
}


/* a key r held and can no longer release itself (it is being freed): kept
 * for the worker's next lookup to release */

static void
ngx_http_rpcedge_cache_orphan(ngx_http_request_t *r,
    rpcedge_daemon_call_t *release)
{
    ngx_http_rpcedge_cache_conf_t    *conf;
    ngx_http_rpcedge_cache_orphan_t  *orphan;

    /* an orphan keeps a method and a path, all a release has */

    if (ngx_http_rpcedge_cache_norphans == NGX_HTTP_RPCEDGE_CACHE_ORPHANS
        || release->method.len > sizeof(orphan->method)
        || release->path.len > sizeof(orphan->path)
        || release->headers_len || release->body.data)
    {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "rpcedge cache: a held key is left to the daemon's "
                      "lock time");
        return;
    }

    conf = ngx_http_get_module_loc_conf(r, ngx_http_rpcedge_cache_module);

    orphan = &ngx_http_rpcedge_cache_orphans[ngx_http_rpcedge_cache_norphans++];

    orphan->server = ngx_http_get_module_srv_conf(r, ngx_http_core_module);
    orphan->pass = conf->pass;
    orphan->shard = release->shard;
    orphan->method_len = release->method.len;
    ngx_memcpy(orphan->method, release->method.data, release->method.len);
    orphan->path_len = release->path.len;
    ngx_memcpy(orphan->path, release->path.data, release->path.len);
}


/* the keys of ended requests that r can reach: those of its own server and
 * rpcedge_cache_pass */

static void
ngx_http_rpcedge_cache_release_orphans(ngx_http_request_t *r)
{
    ngx_uint_t                        i, n;
    rpcedge_daemon_call_t             release;
    ngx_http_core_srv_conf_t         *server;
    ngx_http_rpcedge_cache_conf_t    *conf;
    ngx_http_rpcedge_cache_orphan_t  *orphan;

    conf = ngx_http_get_module_loc_conf(r, ngx_http_rpcedge_cache_module);
    server = ngx_http_get_module_srv_conf(r, ngx_http_core_module);

    n = 0;

    for (i = 0; i < ngx_http_rpcedge_cache_norphans; i++) {
        orphan = &ngx_http_rpcedge_cache_orphans[i];

        if (orphan->server != server
            || orphan->pass.len != conf->pass.len
            || ngx_strncmp(orphan->pass.data, conf->pass.data, conf->pass.len)
               != 0)
        {
            ngx_http_rpcedge_cache_orphans[n++] = *orphan;
            continue;
        }

        ngx_memzero(&release, sizeof(rpcedge_daemon_call_t));

        release.shard = orphan->shard;
        release.method.data = orphan->method;
        release.method.len = orphan->method_len;
        release.path.data = orphan->path;
        release.path.len = orphan->path_len;

        (void) ngx_http_rpcedge_cache_call(r, &release, NULL, 0);
    }

    ngx_http_rpcedge_cache_norphans = n;
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

static rpcedge_header_t *
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


static void
ngx_http_rpcedge_cache_cleanup(void *data)
{
    ngx_http_rpcedge_cache_ctx_t  *ctx = data;

    rpcedge_daemon_call_t  release;

    ngx_http_rpcedge_cache_stop_timer(ctx);

    if (ctx->cache && rpcedge_cache_release(ctx->cache, &release)) {
        ngx_http_rpcedge_cache_orphan(ctx->request, &release);
    }

    rpcedge_cache_free(ctx->cache);
    ctx->cache = NULL;
}


static void
ngx_http_rpcedge_cache_stop_timer(void *data)
{
    ngx_http_rpcedge_cache_ctx_t  *ctx = data;

    if (ctx->timer.timer_set) {
        ngx_del_timer(&ctx->timer);
    }
}


static ngx_int_t
ngx_http_rpcedge_cache_status_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    rpcedge_str_t                  status;
    ngx_http_rpcedge_cache_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r->main, ngx_http_rpcedge_cache_module);

    if (ctx == NULL) {
        v->not_found = 1;
        return NGX_OK;
    }

    status = rpcedge_cache_status(ctx->cache, 0);

    v->data = (u_char *) status.data;
    v->len = status.len;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;

    return NGX_OK;
}


static ngx_int_t
ngx_http_rpcedge_cache_shard_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_http_rpcedge_cache_call_t  *call;

    /* r is this module's subrequest to the daemon */

    call = (r == r->main) ? NULL
                          : ngx_http_get_module_ctx(r,
                                                    ngx_http_rpcedge_cache_module);

    if (call == NULL) {
        v->not_found = 1;
        return NGX_OK;
    }

    v->data = ngx_pnalloc(r->pool, NGX_INT_T_LEN);
    if (v->data == NULL) {
        return NGX_ERROR;
    }

    v->len = ngx_sprintf(v->data, "%ui", call->shard) - v->data;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;

    return NGX_OK;
}


static char *
ngx_http_rpcedge_cache_check_pass(ngx_conf_t *cf, void *post, void *data)
{
    ngx_str_t  *pass = data;

    if (pass->len == 0 || pass->data[0] != '/') {
        return "must be the URI of an internal location, such as "
               "/_rpcedge_cache";
    }

    /* the daemon's paths begin with a slash */

    if (pass->data[pass->len - 1] == '/') {
        pass->len--;
    }

    return NGX_CONF_OK;
}


/*
 * a namespace is configuration: a variable would let what the client sends
 * choose where answers are kept, for every other client
 */

static char *
ngx_http_rpcedge_cache_check_ns(ngx_conf_t *cf, void *post, void *data)
{
    ngx_str_t  *ns = data;

    if (ns->len == 0) {
        return "must not be empty";
    }

    if (ngx_strlchr(ns->data, ns->data + ns->len, '$') != NULL) {
        return "takes a plain string, not variables: the namespace must "
               "name where nginx routed the request, never what the client "
               "sent";
    }

    return NGX_CONF_OK;
}


/* rpcedge_cache_hot name:size | off; one zone may serve many locations */

static char *
ngx_http_rpcedge_cache_hot(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_rpcedge_cache_conf_t *rccf = conf;

    u_char                        *p;
    ssize_t                        size;
    ngx_str_t                     *value, name, s;
    ngx_http_rpcedge_cache_hot_t  *hot;

    if (rccf->hot != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "off") == 0) {
        rccf->hot = NULL;
        return NGX_CONF_OK;
    }

    p = (u_char *) ngx_strchr(value[1].data, ':');

    if (p == NULL || p == value[1].data) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" must be name:size, such as rpcedge_hot:16m, "
                           "or off", &value[1]);
        return NGX_CONF_ERROR;
    }

    name.data = value[1].data;
    name.len = p - value[1].data;

    s.data = p + 1;
    s.len = value[1].data + value[1].len - s.data;

    size = ngx_parse_size(&s);

    /* the core's smallest region, and the slab pool's own pages */

    if (size == NGX_ERROR
        || (size_t) size < rpcedge_cache_hot_min_region() + 8 * ngx_pagesize)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "rpcedge_cache_hot zone \"%V\" is too small or not "
                           "a size: \"%V\" (at least %uzk)", &name, &s,
                           (rpcedge_cache_hot_min_region() + 8 * ngx_pagesize)
                           / 1024);
        return NGX_CONF_ERROR;
    }

    rccf->hot = ngx_shared_memory_add(cf, &name, size,
                                      &ngx_http_rpcedge_cache_module);
    if (rccf->hot == NULL) {
        return NGX_CONF_ERROR;
    }

    if (rccf->hot->data == NULL) {
        hot = ngx_pcalloc(cf->pool, sizeof(ngx_http_rpcedge_cache_hot_t));
        if (hot == NULL) {
            return NGX_CONF_ERROR;
        }

        rccf->hot->init = ngx_http_rpcedge_cache_init_hot;
        rccf->hot->data = hot;
    }

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_rpcedge_cache_init_hot(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_http_rpcedge_cache_hot_t  *ohot = data;

    size_t                         len;
    ngx_http_rpcedge_cache_hot_t  *hot;

    hot = shm_zone->data;

    /* a reload: the zone and its entries carry over */

    if (ohot) {
        *hot = *ohot;
        return NGX_OK;
    }

    hot->shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    /* all the pool's free pages, in one piece, as the region */

    len = hot->shpool->pfree * ngx_pagesize;

    hot->region = ngx_slab_alloc(hot->shpool, len);

    if (hot->region == NULL || !rpcedge_cache_hot_init(hot->region, len)) {
        ngx_log_error(NGX_LOG_EMERG, shm_zone->shm.log, 0,
                      "rpcedge_cache_hot zone \"%V\" has no room for the "
                      "hot tier", &shm_zone->shm.name);
        return NGX_ERROR;
    }

    hot->len = len;

    return NGX_OK;
}


static ngx_int_t
ngx_http_rpcedge_cache_add_variables(ngx_conf_t *cf)
{
    return ngx_http_rpcedge_add_variables_of(cf, ngx_http_rpcedge_cache_vars);
}


static void *
ngx_http_rpcedge_cache_create_conf(ngx_conf_t *cf)
{
    ngx_http_rpcedge_cache_conf_t  *conf;

    conf = ngx_pcalloc(cf->pool, sizeof(ngx_http_rpcedge_cache_conf_t));
    if (conf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     conf->pass = { 0, NULL };
     *     conf->ns = { 0, NULL };
     *     conf->default_ns = { 0, NULL };
     *     conf->settings = NULL;
     */

    conf->enable = NGX_CONF_UNSET;
    conf->hot = NGX_CONF_UNSET_PTR;
    conf->timeout = NGX_CONF_UNSET_MSEC;
    conf->status_header = NGX_CONF_UNSET;
    conf->status_reason = NGX_CONF_UNSET;
    conf->shards = NGX_CONF_UNSET;
    conf->store_timeout = NGX_CONF_UNSET;
    conf->max_request = NGX_CONF_UNSET_SIZE;
    conf->max_entry = NGX_CONF_UNSET_SIZE;
    conf->chain_ttl = NGX_CONF_UNSET;
    conf->max_batch = NGX_CONF_UNSET_UINT;
    conf->lock_timeout = NGX_CONF_UNSET_MSEC;

    return conf;
}


static char *
ngx_http_rpcedge_cache_merge_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_rpcedge_cache_conf_t *prev = parent;
    ngx_http_rpcedge_cache_conf_t *conf = child;

    rpcedge_config_t  config;

    /* the core's defaults, as every host has them */

    config = rpcedge_config_default();

    ngx_conf_merge_value(conf->enable, prev->enable, 0);
    ngx_conf_merge_str_value(conf->pass, prev->pass, "/_rpcedge_cache");
    ngx_conf_merge_ptr_value(conf->hot, prev->hot, NULL);
    ngx_conf_merge_str_value(conf->ns, prev->ns, "");
    ngx_conf_merge_msec_value(conf->timeout, prev->timeout,
                              config.cache_timeout_ms);
    ngx_conf_merge_value(conf->status_header, prev->status_header, 1);
    ngx_conf_merge_value(conf->status_reason, prev->status_reason, 0);
    ngx_conf_merge_value(conf->shards, prev->shards, 1);
    ngx_conf_merge_sec_value(conf->store_timeout, prev->store_timeout,
                             (time_t) config.cache_store_timeout_s);
    ngx_conf_merge_size_value(conf->max_request, prev->max_request,
                              config.cache_max_request);
    ngx_conf_merge_size_value(conf->max_entry, prev->max_entry,
                              config.cache_max_entry);
    ngx_conf_merge_sec_value(conf->chain_ttl, prev->chain_ttl,
                             (time_t) config.cache_chain_ttl_s);
    ngx_conf_merge_uint_value(conf->max_batch, prev->max_batch,
                              config.cache_max_batch);
    ngx_conf_merge_msec_value(conf->lock_timeout, prev->lock_timeout,
                              config.cache_lock_timeout_ms);

    if (conf->enable) {
        config.cache_timeout_ms = conf->timeout;
        config.cache_store_timeout_s = conf->store_timeout;
        config.cache_max_request = conf->max_request;
        config.cache_max_entry = conf->max_entry;
        config.cache_chain_ttl_s = conf->chain_ttl;
        config.cache_max_batch = conf->max_batch;
        config.cache_shards = conf->shards;
        config.cache_lock_timeout_ms = conf->lock_timeout;

        conf->settings = ngx_http_rpcedge_settings(cf, &config);
        if (conf->settings == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    return ngx_http_rpcedge_cache_default_ns(cf, conf);
}


/*
 * Without rpcedge_cache_namespace, a location's namespace is its server's
 * first server_name and its own name: both configuration, so two networks
 * behind two locations or two servers never share entries.  A server without
 * server_name, or with the first server_name of another server block (one
 * name on two ports, say), has no namespace: its requests bypass the cache.
 */

static char *
ngx_http_rpcedge_cache_default_ns(ngx_conf_t *cf,
    ngx_http_rpcedge_cache_conf_t *conf)
{
    u_char                     *p;
    ngx_uint_t                  s, shared;
    ngx_http_core_srv_conf_t   *cscf, **cscfp;
    ngx_http_core_loc_conf_t   *clcf;
    ngx_http_core_main_conf_t  *cmcf;

    if (conf->ns.len) {
        return NGX_CONF_OK;
    }

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);
    cscf = ngx_http_conf_get_module_srv_conf(cf, ngx_http_core_module);
    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    shared = 0;
    cscfp = cmcf->servers.elts;

    for (s = 0; cscf && s < cmcf->servers.nelts; s++) {
        if (cscfp[s] != cscf
            && cscfp[s]->server_name.len == cscf->server_name.len
            && ngx_strncmp(cscfp[s]->server_name.data, cscf->server_name.data,
                           cscf->server_name.len) == 0)
        {
            shared = 1;
        }
    }

    if (cscf == NULL || cscf->server_name.len == 0 || shared) {

        /* the server block's own configuration serves no request itself */

        if (conf->enable == 1 && clcf->name.len) {
            ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                               "rpcedge_cache is on in location \"%V\" "
                               "without rpcedge_cache_namespace, in a server "
                               "whose server_name is %s: its requests bypass "
                               "the cache", &clcf->name,
                               cscf->server_name.len ? "another server's too"
                                                     : "empty");
        }

        return NGX_CONF_OK;
    }

    conf->default_ns.len = cscf->server_name.len + clcf->name.len;
    conf->default_ns.data = ngx_pnalloc(cf->pool, conf->default_ns.len);
    if (conf->default_ns.data == NULL) {
        return NGX_CONF_ERROR;
    }

    p = ngx_cpymem(conf->default_ns.data, cscf->server_name.data,
                   cscf->server_name.len);
    ngx_memcpy(p, clcf->name.data, clcf->name.len);

    return NGX_CONF_OK;
}


ngx_uint_t
ngx_http_rpcedge_cache_keeps(ngx_http_request_t *r)
{
    ngx_http_rpcedge_cache_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r->main, ngx_http_rpcedge_cache_module);

    return ctx != NULL && ctx->state == ngx_http_rpcedge_cache_pass_on;
}


static ngx_int_t
ngx_http_rpcedge_cache_init(ngx_conf_t *cf)
{
    ngx_http_handler_pt        *h;
    ngx_http_core_main_conf_t  *cmcf;

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_PRECONTENT_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_rpcedge_cache_handler;

    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_rpcedge_cache_header_filter;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_rpcedge_cache_body_filter;

    return NGX_OK;
}
