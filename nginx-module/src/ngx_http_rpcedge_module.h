
/*
 * What the two rpcedge modules of the one .so ask of each other.
 */


#ifndef _NGX_HTTP_RPCEDGE_MODULE_H_INCLUDED_
#define _NGX_HTTP_RPCEDGE_MODULE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <rpcedge.h>


/* a numeric directive checked against the core's bounds for its field */
typedef struct {
    ngx_conf_post_handler_pt   post_handler;
    char                      *field;
    ngx_uint_t                 slot;
} ngx_http_rpcedge_check_t;

#define NGX_HTTP_RPCEDGE_SIZE_SLOT  0
#define NGX_HTTP_RPCEDGE_NUM_SLOT   1
#define NGX_HTTP_RPCEDGE_MSEC_SLOT  2

/* the post handler of ngx_http_rpcedge_check_t */
char *ngx_http_rpcedge_check(ngx_conf_t *cf, void *post, void *data);

/* a header (key a static string) at the end of a headers_in or headers_out list */
ngx_table_elt_t *ngx_http_rpcedge_push_header(ngx_list_t *headers, char *key,
    u_char *value, size_t len);

/* adds a module's variables (a list ended by ngx_http_null_variable) */
ngx_int_t ngx_http_rpcedge_add_variables_of(ngx_conf_t *cf,
    ngx_http_variable_t *vars);

/* the request body in one piece; NULL data when it is not whole in memory */
rpcedge_str_t ngx_http_rpcedge_request_body(ngx_http_request_t *r);

/* rpcedge_min_length where r is: below it a cache hit goes out plain */
size_t ngx_http_rpcedge_min_length(ngx_http_request_t *r);

/* whether r is being answered from the cache, which costs no compression */
ngx_uint_t ngx_http_rpcedge_cache_answering(ngx_http_request_t *r);


#endif /* _NGX_HTTP_RPCEDGE_MODULE_H_INCLUDED_ */
