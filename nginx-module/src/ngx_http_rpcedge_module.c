
/*
 * What the compression filter and the cache of the one .so share: the
 * directives both read, the counters zone (ngx_http_rpcedge_status.c), what
 * one tells the other about a request, and helpers. Neither module's file
 * knows the other's; both know this one, as nginx's gzip filter and
 * gzip_static both read the gzip_vary of ngx_http_core_module.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <rpcedge.h>

#include "ngx_http_rpcedge_module.h"


typedef struct {
    /* compression's thresholds, which a cache hit follows too */
    size_t                     min_length;
    size_t                     dictionary_min_length;
    /* the codings made, which a cache hit is sent in too */
    ngx_array_t               *encodings;
    /* rpcedge_dictionary's, in its own location only (not merged) */
    rpcedge_dictionary_t      *dictionary;
} ngx_http_rpcedge_loc_conf_t;


/* what one module tells the other about a request, in r->main's ctx */
typedef struct {
    unsigned                   cache_answering:1;
} ngx_http_rpcedge_request_t;


static void ngx_http_rpcedge_settings_cleanup(void *data);
static ngx_uint_t ngx_http_rpcedge_listed(ngx_array_t *list, ngx_str_t *value);
static void *ngx_http_rpcedge_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_rpcedge_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child);


static ngx_http_rpcedge_check_t  ngx_http_rpcedge_min_length_check =
    { ngx_http_rpcedge_check, "min_length", NGX_HTTP_RPCEDGE_SIZE_SLOT };

static ngx_http_rpcedge_check_t  ngx_http_rpcedge_dictionary_min_length_check =
    { ngx_http_rpcedge_check, "dictionary_min_length",
      NGX_HTTP_RPCEDGE_SIZE_SLOT };

static ngx_http_rpcedge_list_check_t  ngx_http_rpcedge_encoding_check =
    { rpcedge_check_encoding, 1 };


static ngx_command_t  ngx_http_rpcedge_commands[] = {

    { ngx_string("rpcedge_min_length"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_loc_conf_t, min_length),
      &ngx_http_rpcedge_min_length_check },

    { ngx_string("rpcedge_dictionary_min_length"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_loc_conf_t, dictionary_min_length),
      &ngx_http_rpcedge_dictionary_min_length_check },

    { ngx_string("rpcedge_encodings"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_rpcedge_list_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_loc_conf_t, encodings),
      &ngx_http_rpcedge_encoding_check },

    { ngx_string("rpcedge_dictionary"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS|NGX_CONF_TAKE1,
      ngx_http_rpcedge_dictionary,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_rpcedge_loc_conf_t, dictionary),
      NULL },

    { ngx_string("rpcedge_status"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_rpcedge_status,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_rpcedge_module_ctx = {
    NULL,                                  /* preconfiguration */
    ngx_http_rpcedge_status_init,          /* postconfiguration */

    NULL,                                  /* create main configuration */
    NULL,                                  /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_rpcedge_create_loc_conf,      /* create location configuration */
    ngx_http_rpcedge_merge_loc_conf        /* merge location configuration */
};


ngx_module_t  ngx_http_rpcedge_module = {
    NGX_MODULE_V1,
    &ngx_http_rpcedge_module_ctx,          /* module context */
    ngx_http_rpcedge_commands,             /* module directives */
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



/* the core's work is timed finer than nginx's cached milliseconds */

uint64_t
ngx_http_rpcedge_now_ns(void)
{
    struct timespec  ts;

    (void) clock_gettime(CLOCK_MONOTONIC, &ts);

    return (uint64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}


size_t
ngx_http_rpcedge_min_length(ngx_http_request_t *r)
{
    ngx_http_rpcedge_loc_conf_t  *lcf;

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_rpcedge_module);

    return lcf->min_length;
}


const rpcedge_dictionary_t *
ngx_http_rpcedge_dictionary_of(ngx_http_request_t *r)
{
    ngx_http_rpcedge_loc_conf_t  *lcf;

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_rpcedge_module);

    return lcf->dictionary;
}


size_t
ngx_http_rpcedge_conf_min_length(ngx_conf_t *cf)
{
    ngx_http_rpcedge_loc_conf_t  *lcf;

    lcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_rpcedge_module);

    return lcf->min_length;
}


char *
ngx_http_rpcedge_list_slot(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    char  *p = conf;

    ngx_str_t                      *value, *item;
    ngx_uint_t                      i;
    ngx_array_t                   **list;
    rpcedge_error_t                 err;
    ngx_http_rpcedge_list_check_t  *check;

    list = (ngx_array_t **) (p + cmd->offset);

    if (*list != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;
    check = cmd->post;

    *list = ngx_array_create(cf->pool, cf->args->nelts - 1, sizeof(ngx_str_t));
    if (*list == NULL) {
        return NGX_CONF_ERROR;
    }

    for (i = 1; i < cf->args->nelts; i++) {

        if (check->check(value[i].data, value[i].len, &err) != 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid value \"%V\" in \"%V\": %s",
                               &value[i], &cmd->name, err.message);
            return NGX_CONF_ERROR;
        }

        if (check->unique && ngx_http_rpcedge_listed(*list, &value[i])) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"%V\" is listed twice in \"%V\"",
                               &value[i], &cmd->name);
            return NGX_CONF_ERROR;
        }

        item = ngx_array_push(*list);
        if (item == NULL) {
            return NGX_CONF_ERROR;
        }

        *item = value[i];
    }

    return NGX_CONF_OK;
}


/* a list directive's values as the C ABI takes them; none set: none given */

ngx_int_t
ngx_http_rpcedge_strs(ngx_conf_t *cf, ngx_array_t *list,
    const rpcedge_str_t **strs, size_t *len)
{
    ngx_str_t      *item;
    ngx_uint_t      i;
    rpcedge_str_t  *out;

    if (list == NULL) {
        return NGX_OK;
    }

    out = ngx_palloc(cf->pool, list->nelts * sizeof(rpcedge_str_t));
    if (out == NULL) {
        return NGX_ERROR;
    }

    item = list->elts;

    for (i = 0; i < list->nelts; i++) {
        out[i].data = item[i].data;
        out[i].len = item[i].len;
    }

    *strs = out;
    *len = list->nelts;

    return NGX_OK;
}


static ngx_uint_t
ngx_http_rpcedge_listed(ngx_array_t *list, ngx_str_t *value)
{
    ngx_str_t   *item;
    ngx_uint_t   i;

    item = list->elts;

    for (i = 0; i < list->nelts; i++) {
        if (item[i].len == value->len
            && ngx_strncasecmp(item[i].data, value->data, value->len) == 0)
        {
            return 1;
        }
    }

    return 0;
}


ngx_int_t
ngx_http_rpcedge_conf_encodings(ngx_conf_t *cf, rpcedge_config_t *config)
{
    ngx_http_rpcedge_loc_conf_t  *lcf;

    lcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_rpcedge_module);

    config->dictionary_min_length = lcf->dictionary_min_length;

    return ngx_http_rpcedge_strs(cf, lcf->encodings, &config->encodings,
                                 &config->encodings_len);
}


ngx_int_t
ngx_http_rpcedge_answer_from_cache(ngx_http_request_t *r)
{
    ngx_http_rpcedge_request_t  *rr;

    rr = ngx_pcalloc(r->pool, sizeof(ngx_http_rpcedge_request_t));
    if (rr == NULL) {
        return NGX_ERROR;
    }

    rr->cache_answering = 1;

    ngx_http_set_ctx(r->main, rr, ngx_http_rpcedge_module);

    return NGX_OK;
}


ngx_uint_t
ngx_http_rpcedge_cache_answering(ngx_http_request_t *r)
{
    ngx_http_rpcedge_request_t  *rr;

    rr = ngx_http_get_module_ctx(r->main, ngx_http_rpcedge_module);

    return rr && rr->cache_answering;
}


char *
ngx_http_rpcedge_check(ngx_conf_t *cf, void *post, void *data)
{
    ngx_http_rpcedge_check_t  *check = post;

    uint64_t          value;
    rpcedge_error_t   err;

    switch (check->slot) {

    case NGX_HTTP_RPCEDGE_NUM_SLOT:
        value = *(ngx_int_t *) data;
        break;

    case NGX_HTTP_RPCEDGE_MSEC_SLOT:
        value = *(ngx_msec_t *) data;
        break;

    case NGX_HTTP_RPCEDGE_SEC_SLOT:
        value = *(time_t *) data;
        break;

    default: /* NGX_HTTP_RPCEDGE_SIZE_SLOT */
        value = *(size_t *) data;
    }

    if (rpcedge_check_field(check->field, value, &err) == 0) {
        return NGX_CONF_OK;
    }

    return ngx_http_rpcedge_conf_error(cf, &err);
}


rpcedge_settings_t *
ngx_http_rpcedge_settings(ngx_conf_t *cf, rpcedge_config_t *config)
{
    rpcedge_error_t      err;
    rpcedge_settings_t  *settings;
    ngx_pool_cleanup_t  *cln;

    settings = rpcedge_settings_new(config, &err);
    if (settings == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"rpcedge_%s\" %s", err.field, err.message);
        return NULL;
    }

    cln = ngx_pool_cleanup_add(cf->pool, 0);
    if (cln == NULL) {
        rpcedge_settings_free(settings);
        return NULL;
    }

    cln->handler = ngx_http_rpcedge_settings_cleanup;
    cln->data = settings;

    return settings;
}


static void
ngx_http_rpcedge_settings_cleanup(void *data)
{
    rpcedge_settings_free(data);
}


/* the core's message, which nginx prints after the directive's name */

char *
ngx_http_rpcedge_conf_error(ngx_conf_t *cf, rpcedge_error_t *err)
{
    u_char  *msg;
    size_t   len;

    len = ngx_strlen(err->message) + 1;

    msg = ngx_pnalloc(cf->pool, len);
    if (msg == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_cpystrn(msg, (u_char *) err->message, len);

    return (char *) msg;
}


ngx_table_elt_t *
ngx_http_rpcedge_push_header(ngx_list_t *headers, char *key, u_char *value,
    size_t len)
{
    ngx_table_elt_t  *h;

    h = ngx_list_push(headers);
    if (h == NULL) {
        return NULL;
    }

    h->hash = 1;
#if (nginx_version >= 1023000)
    h->next = NULL;
#endif
    h->key.data = (u_char *) key;
    h->key.len = ngx_strlen(key);
    h->value.data = value;
    h->value.len = len;
    h->lowcase_key = h->key.data;

    return h;
}


ngx_table_elt_t *
ngx_http_rpcedge_push_copy(ngx_pool_t *pool, ngx_list_t *headers,
    const rpcedge_header_t *header)
{
    u_char  *p;

    p = ngx_pnalloc(pool, header->name_len + 1 + header->value_len);
    if (p == NULL) {
        return NULL;
    }

    ngx_memcpy(p, header->name, header->name_len);
    p[header->name_len] = '\0';
    ngx_memcpy(p + header->name_len + 1, header->value, header->value_len);

    return ngx_http_rpcedge_push_header(headers, (char *) p,
                                        p + header->name_len + 1,
                                        header->value_len);
}


ngx_int_t
ngx_http_rpcedge_add_variables_of(ngx_conf_t *cf, ngx_http_variable_t *vars)
{
    ngx_http_variable_t  *var, *v;

    for (v = vars; v->name.len; v++) {
        var = ngx_http_add_variable(cf, &v->name, v->flags);
        if (var == NULL) {
            return NGX_ERROR;
        }

        var->get_handler = v->get_handler;
        var->data = v->data;
    }

    return NGX_OK;
}


/* the request body in one piece, or NULL data when nginx did not keep it
 * whole in memory (spilled to a file): the core then does without it */

rpcedge_str_t
ngx_http_rpcedge_request_body(ngx_http_request_t *r)
{
    size_t         len;
    u_char        *p;
    ngx_buf_t     *b;
    ngx_chain_t   *cl;
    rpcedge_str_t  body;

    ngx_memzero(&body, sizeof(rpcedge_str_t));

    if (r->request_body == NULL || r->request_body->temp_file) {
        return body;
    }

    len = 0;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        b = cl->buf;

        if (b->in_file || (ngx_buf_size(b) && !ngx_buf_in_memory(b))) {
            return body;
        }

        len += b->last - b->pos;
    }

    cl = r->request_body->bufs;

    if (cl && cl->next == NULL) {
        body.data = cl->buf->pos;
        body.len = len;
        return body;
    }

    /* an empty body is still a body, and bypasses as malformed */

    p = ngx_pnalloc(r->pool, len + 1);
    if (p == NULL) {
        return body;
    }

    body.data = p;
    body.len = len;

    for ( /* void */ ; cl; cl = cl->next) {
        p = ngx_cpymem(p, cl->buf->pos, cl->buf->last - cl->buf->pos);
    }

    return body;
}


static void *
ngx_http_rpcedge_create_loc_conf(ngx_conf_t *cf)
{
    ngx_http_rpcedge_loc_conf_t  *lcf;

    lcf = ngx_palloc(cf->pool, sizeof(ngx_http_rpcedge_loc_conf_t));
    if (lcf == NULL) {
        return NULL;
    }

    lcf->min_length = NGX_CONF_UNSET_SIZE;
    lcf->dictionary_min_length = NGX_CONF_UNSET_SIZE;
    lcf->encodings = NGX_CONF_UNSET_PTR;
    lcf->dictionary = NULL;

    return lcf;
}


static char *
ngx_http_rpcedge_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_rpcedge_loc_conf_t *prev = parent;
    ngx_http_rpcedge_loc_conf_t *conf = child;

    /* the core's defaults are the one source of defaults */

    ngx_conf_merge_size_value(conf->min_length, prev->min_length,
                              rpcedge_config_default().min_length);
    ngx_conf_merge_size_value(conf->dictionary_min_length,
                              prev->dictionary_min_length,
                              rpcedge_config_default().dictionary_min_length);
    ngx_conf_merge_ptr_value(conf->encodings, prev->encodings, NULL);

    return NGX_CONF_OK;
}
