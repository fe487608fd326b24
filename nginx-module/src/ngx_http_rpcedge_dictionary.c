
/*
 * rpcedge_dictionary: the location that serves the core's dcz dictionary
 * (RFC 9842), with Use-As-Dictionary naming the RPC paths it is for. What
 * the reply is (status, headers, body) is the core's; this file sends it.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <rpcedge.h>

#include "ngx_http_rpcedge_module.h"


static ngx_int_t ngx_http_rpcedge_dictionary_handler(ngx_http_request_t *r);
static void ngx_http_rpcedge_dictionary_cleanup(void *data);


static ngx_int_t
ngx_http_rpcedge_dictionary_handler(ngx_http_request_t *r)
{
    u_char                      *inm;
    size_t                       inm_len;
    ngx_buf_t                   *b;
    ngx_int_t                    rc;
    ngx_uint_t                   i;
    ngx_chain_t                  out;
    ngx_table_elt_t             *h;
    const rpcedge_header_t      *header;
    rpcedge_dictionary_reply_t   reply;

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    inm = NULL;
    inm_len = 0;

    if (r->headers_in.if_none_match) {
        inm = r->headers_in.if_none_match->value.data;
        inm_len = r->headers_in.if_none_match->value.len;
    }

    if (rpcedge_dictionary_reply(ngx_http_rpcedge_dictionary_of(r),
                                 r->method_name.data, r->method_name.len,
                                 inm, inm_len, &reply)
        != 0)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    r->headers_out.status = reply.status;
    r->headers_out.content_length_n = (reply.status == NGX_HTTP_NOT_MODIFIED)
                                      ? -1 : (off_t) reply.body_len;

    for (i = 0; i < reply.headers_len; i++) {
        header = &reply.headers[i];

        if (header->name_len == sizeof("content-type") - 1
            && ngx_strncmp(header->name, "content-type", header->name_len)
               == 0)
        {
            /* the core's, for the life of the configuration */
            r->headers_out.content_type.data = (u_char *) header->value;
            r->headers_out.content_type.len = header->value_len;
            r->headers_out.content_type_len = header->value_len;
            continue;
        }

        h = ngx_http_rpcedge_push_copy(r->pool, &r->headers_out.headers,
                                       header);
        if (h == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        /* nginx's filters read the tag here (If-Match, weakening) */

        if (header->name_len == sizeof("etag") - 1
            && ngx_strncmp(header->name, "etag", header->name_len) == 0)
        {
            r->headers_out.etag = h;
        }
    }

    if (reply.body_len == 0) {
        r->header_only = 1;
    }

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* the core's, for the life of the configuration */
    b->pos = (u_char *) reply.body;
    b->last = b->pos + reply.body_len;
    b->memory = 1;
    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


char *
ngx_http_rpcedge_dictionary(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    char  *p = conf;

    ngx_str_t                  *value, pattern;
    rpcedge_error_t             err;
    ngx_pool_cleanup_t         *cln;
    rpcedge_dictionary_t       *dictionary, **field;
    ngx_http_core_loc_conf_t   *clcf;

    field = (rpcedge_dictionary_t **) (p + cmd->offset);

    if (*field != NULL) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (cf->args->nelts == 2) {
        pattern = value[1];

    } else {
        ngx_str_set(&pattern, "/*");
    }

    dictionary = rpcedge_dictionary_new(pattern.data, pattern.len, &err);
    if (dictionary == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid value \"%V\" in \"%V\": %s",
                           &pattern, &cmd->name, err.message);
        return NGX_CONF_ERROR;
    }

    cln = ngx_pool_cleanup_add(cf->pool, 0);
    if (cln == NULL) {
        rpcedge_dictionary_free(dictionary);
        return NGX_CONF_ERROR;
    }

    cln->handler = ngx_http_rpcedge_dictionary_cleanup;
    cln->data = dictionary;

    *field = dictionary;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_http_rpcedge_dictionary_handler;

    return NGX_CONF_OK;
}


static void
ngx_http_rpcedge_dictionary_cleanup(void *data)
{
    rpcedge_dictionary_free(data);
}
