

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
 * key by key in one multi-key lookup;
 * the node is sent the calls that missed, and its answer is held, merged with
 * the cache's in the client's order, and sent with its own length. A call's
 * miss holds its key in the daemon while the node answers (coalescing): a
 * concurrent miss of the same key waits, at most rpcedge_cache_lock_timeout,
 * for the answer the store hands over, and a holder with none to store
 * releases the key with one more background subrequest (a holder whose
 * client went away has the worker release it on a connection of its own).
 * With
 * rpcedge_cache_hot, the daemon's hits are also kept in a shared memory
 * zone (the core's hot tier), which answers them again without the trip.
 * The filter sits just above postpone, so that it sees the daemon's answers
 * before postpone would hold them, and the node's body before rpcedge
 * compresses it.
 *
 * This file: the directives, their configuration and the variables. The
 * lookup (ngx_http_rpcedge_cache_lookup.c), a call to the daemon
 * (ngx_http_rpcedge_cache_call.c), the stores
 * (ngx_http_rpcedge_cache_store.c), the filter over the answers
 * (ngx_http_rpcedge_cache_filter.c), the release of a key whose request
 * went away (ngx_http_rpcedge_cache_release.c) and the hot tier
 * (ngx_http_rpcedge_cache_hot.c) each have a file; what they share is in
 * ngx_http_rpcedge_cache.h.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_rpcedge_cache.h"


/* rpcedge_cache_pass's default: the location configs/nginx/rpcedge-cache.conf
 * makes */
#define NGX_HTTP_RPCEDGE_CACHE_PASS  "/_rpcedge_cache"


static ngx_int_t ngx_http_rpcedge_cache_status_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static char *ngx_http_rpcedge_cache_check_pass(ngx_conf_t *cf, void *post,
    void *data);
static char *ngx_http_rpcedge_cache_check_ns(ngx_conf_t *cf, void *post,
    void *data);
static ngx_int_t ngx_http_rpcedge_cache_add_variables(ngx_conf_t *cf);
static void *ngx_http_rpcedge_cache_create_conf(ngx_conf_t *cf);
static char *ngx_http_rpcedge_cache_merge_conf(ngx_conf_t *cf, void *parent,
    void *child);
static char *ngx_http_rpcedge_cache_default_ns(ngx_conf_t *cf,
    ngx_http_rpcedge_cache_conf_t *conf);
static ngx_int_t ngx_http_rpcedge_cache_init(ngx_conf_t *cf);


static ngx_conf_post_handler_pt  ngx_http_rpcedge_cache_pass_post =
    ngx_http_rpcedge_cache_check_pass;

static ngx_conf_post_handler_pt  ngx_http_rpcedge_cache_ns_post =
    ngx_http_rpcedge_cache_check_ns;

static ngx_http_rpcedge_check_t  ngx_http_rpcedge_cache_timeout_check =
    { ngx_http_rpcedge_check, "cache_timeout_ms", NGX_HTTP_RPCEDGE_MSEC_SLOT };

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

      ngx_http_null_variable
};


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


static char *
ngx_http_rpcedge_cache_check_pass(ngx_conf_t *cf, void *post, void *data)
{
    ngx_str_t  *pass = data;

    if (pass->len == 0 || pass->data[0] != '/') {
        return "must be the URI of an internal location, such as "
               NGX_HTTP_RPCEDGE_CACHE_PASS;
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
    ngx_conf_merge_str_value(conf->pass, prev->pass,
                             NGX_HTTP_RPCEDGE_CACHE_PASS);
    ngx_conf_merge_ptr_value(conf->hot, prev->hot, NULL);
    ngx_conf_merge_str_value(conf->ns, prev->ns, "");
    ngx_conf_merge_msec_value(conf->timeout, prev->timeout,
                              config.cache_timeout_ms);
    ngx_conf_merge_value(conf->status_header, prev->status_header,
                         config.cache_status_header);
    ngx_conf_merge_value(conf->status_reason, prev->status_reason,
                         config.cache_status_reason);
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
        config.cache_lock_timeout_ms = conf->lock_timeout;
        config.cache_status_header = conf->status_header;
        config.cache_status_reason = conf->status_reason;

        /* a hit goes out in a coding the location makes */
        if (ngx_http_rpcedge_conf_encodings(cf, &config) != NGX_OK) {
            return NGX_CONF_ERROR;
        }

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

    return ctx != NULL && ctx->state == ngx_http_rpcedge_cache_pass_on
           && rpcedge_cache_may_keep(ctx->cache);
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

    if (ngx_http_rpcedge_cache_orphans_init(cf) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_rpcedge_cache_filter_init(cf);
}
