
/*
 * What the compression filter and the cache share
 * (ngx_http_rpcedge_module.c, ngx_http_rpcedge_status.c).
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
#define NGX_HTTP_RPCEDGE_SEC_SLOT   3

extern ngx_module_t  ngx_http_rpcedge_module;


/* a list directive whose every value the core checks, each at most once
 * where unique */
typedef struct {
    int32_t                  (*check)(const uint8_t *value, size_t len,
                                      rpcedge_error_t *err);
    ngx_uint_t                 unique;
} ngx_http_rpcedge_list_check_t;

/* the set handler of a list directive (post: ngx_http_rpcedge_list_check_t) */
char *ngx_http_rpcedge_list_slot(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/* a list directive's values as the C ABI takes them; none set: none given */
ngx_int_t ngx_http_rpcedge_strs(ngx_conf_t *cf, ngx_array_t *list,
    const rpcedge_str_t **strs, size_t *len);

/* the post handler of ngx_http_rpcedge_check_t */
char *ngx_http_rpcedge_check(ngx_conf_t *cf, void *post, void *data);

/* the core's error as a directive's error, which nginx prints after its name */
char *ngx_http_rpcedge_conf_error(ngx_conf_t *cf, rpcedge_error_t *err);

/* the core's settings for a location's configuration, freed with the cycle's
 * pool; NULL when the core refuses it (the error logged) */
rpcedge_settings_t *ngx_http_rpcedge_settings(ngx_conf_t *cf,
    rpcedge_config_t *config);

/* a header (key a static string) at the end of a headers_in or headers_out list */
/* the node's request, and the client's back (ngx_http_rpcedge_node_request.c) */
ngx_int_t ngx_http_rpcedge_node_request(ngx_http_request_t *r,
    rpcedge_str_t accept);
void ngx_http_rpcedge_node_request_done(ngx_http_request_t *r);

ngx_table_elt_t *ngx_http_rpcedge_push_header(ngx_list_t *headers, char *key,
    u_char *value, size_t len);

/* a header the core gave, copied into pool (the core's strings live only as
 * long as its handle) and pushed at the end of headers */
ngx_table_elt_t *ngx_http_rpcedge_push_copy(ngx_pool_t *pool,
    ngx_list_t *headers, const rpcedge_header_t *header);

/* adds a module's variables (a list ended by ngx_http_null_variable) */
ngx_int_t ngx_http_rpcedge_add_variables_of(ngx_conf_t *cf,
    ngx_http_variable_t *vars);

/* the request body in one piece; NULL data when it is not whole in memory */
rpcedge_str_t ngx_http_rpcedge_request_body(ngx_http_request_t *r);

/* rpcedge_min_length where r is: below it a cache hit goes out plain */
size_t ngx_http_rpcedge_min_length(ngx_http_request_t *r);

/* rpcedge_min_length where cf is, merged: ngx_http_rpcedge_module merges
 * before the modules that read it (see config) */
size_t ngx_http_rpcedge_conf_min_length(ngx_conf_t *cf);

/* rpcedge_encodings and rpcedge_dictionary_min_length where cf is, merged (as
 * rpcedge_min_length), into config */
ngx_int_t ngx_http_rpcedge_conf_encodings(ngx_conf_t *cf,
    rpcedge_config_t *config);

/* r is being answered from the cache, which costs no compression */
ngx_int_t ngx_http_rpcedge_answer_from_cache(ngx_http_request_t *r);
ngx_uint_t ngx_http_rpcedge_cache_answering(ngx_http_request_t *r);

/* the cache looked r up, and may keep the node's answer (so it must be identity) */
ngx_uint_t ngx_http_rpcedge_cache_keeps(ngx_http_request_t *r);


/* ngx_http_rpcedge_dictionary.c: the location that serves the dcz dictionary */

char *ngx_http_rpcedge_dictionary(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/* the dictionary of r's location (rpcedge_dictionary) */
const rpcedge_dictionary_t *ngx_http_rpcedge_dictionary_of(
    ngx_http_request_t *r);


/* ngx_http_rpcedge_status.c: the counters zone and its page */

ngx_int_t ngx_http_rpcedge_status_init(ngx_conf_t *cf);
char *ngx_http_rpcedge_status(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);

/* a monotonic clock in nanoseconds, to time the core's work */
uint64_t ngx_http_rpcedge_now_ns(void);

/* adds what the core counts for an event (rpcedge_count_*) */
void ngx_http_rpcedge_count(rpcedge_count_t *counts, size_t n);


#endif /* _NGX_HTTP_RPCEDGE_MODULE_H_INCLUDED_ */
