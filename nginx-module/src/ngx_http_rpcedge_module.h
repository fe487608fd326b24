
/*
 * What the two rpcedge modules of the one .so ask of each other.
 */


#ifndef _NGX_HTTP_RPCEDGE_MODULE_H_INCLUDED_
#define _NGX_HTTP_RPCEDGE_MODULE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/* rpcedge_min_length where r is: below it a cache hit goes out plain */
size_t ngx_http_rpcedge_min_length(ngx_http_request_t *r);

/* whether r is being answered from the cache, which costs no compression */
ngx_uint_t ngx_http_rpcedge_cache_answering(ngx_http_request_t *r);


#endif /* _NGX_HTTP_RPCEDGE_MODULE_H_INCLUDED_ */
