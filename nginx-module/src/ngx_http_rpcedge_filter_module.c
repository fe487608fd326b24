
/*
 * rpcedge: size-gated and streaming compression of JSON-RPC responses, and
 * their transcoding to SSZ for clients that ask for it.
 *
 * Thin glue over rpcedge-core (shared-core/): every decision is the core's.
 * This file is the module: its directives, their configuration (the core's
 * settings, checked and made once per location) and its variables. A
 * precontent handler makes a response's exchange from the request, to ask
 * the node for identity (and with rpcedge_transcode_upstream_ssz for SSZ)
 * where the core says so (ngx_http_rpcedge_request.c); the header filter
 * feeds it the response's head and gets a plan, the body filter feeds it the
 * body and sends what the core returns, holding the headers while the core
 * buffers (ngx_http_rpcedge_response.c). With "aio threads", the core hands
 * large whole-body compressions out as jobs, run in the thread pool
 * (ngx_http_rpcedge_offload.c).
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_rpcedge_filter.h"


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

    ngx_http_rpcedge_install_filters();

    return NGX_OK;
}
