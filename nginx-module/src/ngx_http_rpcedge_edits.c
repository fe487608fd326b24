
/*
 * The core's edits of a response's head, as nginx keeps it: the operations
 * every host applies in the core's order (rpcedge_exchange_header_ops), on
 * the typed slots nginx's header filter writes from where there is one.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_rpcedge_filter.h"


typedef ngx_int_t (*ngx_http_rpcedge_edit_pt)(ngx_http_request_t *r,
    ngx_str_t *value);


typedef struct {
    ngx_str_t                  name;
    ngx_uint_t                 op;
    ngx_http_rpcedge_edit_pt   handler;
} ngx_http_rpcedge_edit_t;


static ngx_int_t ngx_http_rpcedge_set_content_type(ngx_http_request_t *r,
    ngx_str_t *value);
static ngx_int_t ngx_http_rpcedge_set_content_encoding(ngx_http_request_t *r,
    ngx_str_t *value);
static ngx_int_t ngx_http_rpcedge_remove_content_encoding(
    ngx_http_request_t *r, ngx_str_t *value);
static ngx_int_t ngx_http_rpcedge_set_content_length(ngx_http_request_t *r,
    ngx_str_t *value);
static ngx_int_t ngx_http_rpcedge_remove_content_length(
    ngx_http_request_t *r, ngx_str_t *value);
static ngx_int_t ngx_http_rpcedge_set_etag(ngx_http_request_t *r,
    ngx_str_t *value);
static ngx_int_t ngx_http_rpcedge_remove_etag(ngx_http_request_t *r,
    ngx_str_t *value);
static ngx_int_t ngx_http_rpcedge_remove_accept_ranges(ngx_http_request_t *r,
    ngx_str_t *value);
static ngx_int_t ngx_http_rpcedge_append_vary(ngx_http_request_t *r,
    ngx_str_t *value);
static ngx_int_t ngx_http_rpcedge_edit_header(ngx_http_request_t *r,
    ngx_uint_t op, ngx_str_t *name, ngx_str_t *value);
static ngx_int_t ngx_http_rpcedge_keep(ngx_http_request_t *r,
    ngx_str_t *value);


/* the core names these in lower case */

static ngx_http_rpcedge_edit_t  ngx_http_rpcedge_edits[] = {

    { ngx_string("content-type"), RPCEDGE_EDIT_SET,
      ngx_http_rpcedge_set_content_type },

    { ngx_string("content-encoding"), RPCEDGE_EDIT_SET,
      ngx_http_rpcedge_set_content_encoding },

    { ngx_string("content-encoding"), RPCEDGE_EDIT_REMOVE,
      ngx_http_rpcedge_remove_content_encoding },

    { ngx_string("content-length"), RPCEDGE_EDIT_SET,
      ngx_http_rpcedge_set_content_length },

    { ngx_string("content-length"), RPCEDGE_EDIT_REMOVE,
      ngx_http_rpcedge_remove_content_length },

    { ngx_string("etag"), RPCEDGE_EDIT_SET,
      ngx_http_rpcedge_set_etag },

    { ngx_string("etag"), RPCEDGE_EDIT_REMOVE,
      ngx_http_rpcedge_remove_etag },

    { ngx_string("accept-ranges"), RPCEDGE_EDIT_REMOVE,
      ngx_http_rpcedge_remove_accept_ranges },

    { ngx_string("vary"), RPCEDGE_EDIT_APPEND,
      ngx_http_rpcedge_append_vary },

    { ngx_null_string, 0, NULL }
};


ngx_int_t
ngx_http_rpcedge_apply_edits(ngx_http_request_t *r, rpcedge_exchange_t *ex)
{
    size_t                      i, n;
    uint8_t                     vary;
    ngx_str_t                   name, value;
    ngx_http_rpcedge_edit_t    *edit;
    const rpcedge_header_op_t  *ops;
#if (NGX_HTTP_GZIP)
    ngx_http_core_loc_conf_t   *clcf;
#endif

    vary = RPCEDGE_VARY_IN_LINE;

#if (NGX_HTTP_GZIP)
    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    if (clcf->gzip_vary) {
        /* nginx's header filter says it once for every module, below */
        vary = RPCEDGE_VARY_ENCODING_OWN_LINE;
    }
#endif

    n = rpcedge_exchange_header_ops(ex, vary, &ops);

    for (i = 0; i < n; i++) {

        /*
         * the core's strings live only until its next call: what is kept is
         * copied
         */

        name.len = ops[i].name.len;
        name.data = (u_char *) ops[i].name.data;
        value.len = ops[i].value.len;
        value.data = (u_char *) ops[i].value.data;

        for (edit = ngx_http_rpcedge_edits; edit->name.len; edit++) {
            if (edit->op == ops[i].op && edit->name.len == name.len
                && ngx_strncmp(edit->name.data, name.data, name.len) == 0)
            {
                break;
            }
        }

        if (edit->handler) {
            if (edit->handler(r, &value) != NGX_OK) {
                return NGX_ERROR;
            }

            continue;
        }

        if (ngx_http_rpcedge_edit_header(r, ops[i].op, &name, &value)
            != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_rpcedge_set_content_type(ngx_http_request_t *r, ngx_str_t *value)
{
    if (ngx_http_rpcedge_keep(r, value) != NGX_OK) {
        return NGX_ERROR;
    }

    r->headers_out.content_type = *value;
    r->headers_out.content_type_len = value->len;
    r->headers_out.content_type_lowcase = NULL;
    r->headers_out.charset.len = 0;

    return NGX_OK;
}


static ngx_int_t
ngx_http_rpcedge_set_content_encoding(ngx_http_request_t *r,
    ngx_str_t *value)
{
    ngx_table_elt_t  *h;

    if (ngx_http_rpcedge_keep(r, value) != NGX_OK) {
        return NGX_ERROR;
    }

    /* set: the node's, where a decoded body left one, goes */

    ngx_http_rpcedge_remove_content_encoding(r, value);

    h = ngx_http_rpcedge_push_header(&r->headers_out.headers,
                                     "Content-Encoding",
                                     value->data, value->len);
    if (h == NULL) {
        return NGX_ERROR;
    }

    r->headers_out.content_encoding = h;

    return NGX_OK;
}


static ngx_int_t
ngx_http_rpcedge_remove_content_encoding(ngx_http_request_t *r,
    ngx_str_t *value)
{
    if (r->headers_out.content_encoding) {
        r->headers_out.content_encoding->hash = 0;
        r->headers_out.content_encoding = NULL;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_rpcedge_set_content_length(ngx_http_request_t *r, ngx_str_t *value)
{
    off_t  length;

    length = ngx_atoof(value->data, value->len);
    if (length == NGX_ERROR) {
        return NGX_ERROR;
    }

    ngx_http_clear_content_length(r);
    r->headers_out.content_length_n = length;

    return NGX_OK;
}


static ngx_int_t
ngx_http_rpcedge_remove_content_length(ngx_http_request_t *r,
    ngx_str_t *value)
{
    ngx_http_clear_content_length(r);

    return NGX_OK;
}


/* the core weakens the ETag the response has */

static ngx_int_t
ngx_http_rpcedge_set_etag(ngx_http_request_t *r, ngx_str_t *value)
{
    if (r->headers_out.etag == NULL) {
        return NGX_OK;
    }

    if (ngx_http_rpcedge_keep(r, value) != NGX_OK) {
        return NGX_ERROR;
    }

    r->headers_out.etag->value = *value;

    return NGX_OK;
}


static ngx_int_t
ngx_http_rpcedge_remove_etag(ngx_http_request_t *r, ngx_str_t *value)
{
    ngx_http_clear_etag(r);

    return NGX_OK;
}


static ngx_int_t
ngx_http_rpcedge_remove_accept_ranges(ngx_http_request_t *r,
    ngx_str_t *value)
{
    ngx_http_clear_accept_ranges(r);

    return NGX_OK;
}


static ngx_int_t
ngx_http_rpcedge_append_vary(ngx_http_request_t *r, ngx_str_t *value)
{
#if (NGX_HTTP_GZIP)
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    /* gzip_vary: the core gave Accept-Encoding a line of its own for this */

    if (clcf->gzip_vary
        && value->len == sizeof("Accept-Encoding") - 1
        && ngx_strncmp(value->data, "Accept-Encoding", value->len) == 0)
    {
        r->gzip_vary = 1;
        return NGX_OK;
    }
#endif

    if (ngx_http_rpcedge_keep(r, value) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_http_rpcedge_push_header(&r->headers_out.headers, "Vary",
                                     value->data, value->len)
        == NULL)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* a header nginx has no slot for: set replaces any of that name */

static ngx_int_t
ngx_http_rpcedge_edit_header(ngx_http_request_t *r, ngx_uint_t op,
    ngx_str_t *name, ngx_str_t *value)
{
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;
    rpcedge_header_t  header;

    if (op != RPCEDGE_EDIT_APPEND) {
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

            if (h[i].hash && h[i].key.len == name->len
                && ngx_strncasecmp(h[i].key.data, name->data, name->len) == 0)
            {
                h[i].hash = 0;
            }
        }

        if (op == RPCEDGE_EDIT_REMOVE) {
            return NGX_OK;
        }
    }

    header.name = name->data;
    header.name_len = name->len;
    header.value = value->data;
    header.value_len = value->len;

    if (ngx_http_rpcedge_push_copy(r->pool, &r->headers_out.headers, &header)
        == NULL)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_rpcedge_keep(ngx_http_request_t *r, ngx_str_t *value)
{
    u_char  *p;

    p = ngx_pnalloc(r->pool, value->len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(p, value->data, value->len);
    value->data = p;

    return NGX_OK;
}
