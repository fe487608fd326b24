
/*
 * rpcedge cache: what its files share (ngx_http_rpcedge_cache_*.c).
 */


#ifndef _NGX_HTTP_RPCEDGE_CACHE_H_INCLUDED_
#define _NGX_HTTP_RPCEDGE_CACHE_H_INCLUDED_


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
    /* the looking-up location's rpcedge_cache_pass: its stores and its
     * release go there, in whatever location the request ends (an
     * error_page's) */
    ngx_str_t                   pass;
    ngx_http_rpcedge_cache_state_e  state;
    /* the lookup, then the store: ended if it outlives its timeout */
    ngx_http_request_t         *call;
    ngx_event_t                 timer;
    /* the node's answer is passed through the core, which holds it for the
     * store */
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
    ngx_uint_t                  status;
    /* the daemon's answer: its headers, as the core reads them */
    rpcedge_header_t           *headers;
    size_t                      nheaders;
    ngx_http_rpcedge_cache_bytes_t  answer;
    /* the daemon that answered a lookup, where it can be reached again
     * without its location (0: not known) */
    ngx_sockaddr_t              daemon;
    socklen_t                   daemon_len;
    unsigned                    lookup:1;
    unsigned                    complete:1;
    unsigned                    too_large:1;
} ngx_http_rpcedge_cache_call_t;


extern ngx_module_t  ngx_http_rpcedge_cache_module;


/* ngx_http_rpcedge_cache_lookup.c */
ngx_int_t ngx_http_rpcedge_cache_handler(ngx_http_request_t *r);

/* ngx_http_rpcedge_cache_call.c */
ngx_http_request_t *ngx_http_rpcedge_cache_call(ngx_http_request_t *r,
    ngx_str_t *pass, rpcedge_daemon_call_t *dc, ngx_http_post_subrequest_t *ps,
    ngx_uint_t lookup);

/* ngx_http_rpcedge_cache_store.c */
void ngx_http_rpcedge_cache_ended(ngx_http_request_t *r,
    ngx_http_rpcedge_cache_ctx_t *ctx, ngx_int_t rc);
void ngx_http_rpcedge_cache_cleanup(void *data);
void ngx_http_rpcedge_cache_stop_timer(void *data);

/* ngx_http_rpcedge_cache_release.c */
void ngx_http_rpcedge_cache_let_go(ngx_http_rpcedge_cache_ctx_t *ctx,
    rpcedge_daemon_call_t *release);
void ngx_http_rpcedge_cache_release_orphans(ngx_http_request_t *r,
    ngx_str_t *pass);
ngx_int_t ngx_http_rpcedge_cache_orphans_init(ngx_conf_t *cf);

/* ngx_http_rpcedge_cache_filter.c */
ngx_int_t ngx_http_rpcedge_cache_filter_init(ngx_conf_t *cf);
rpcedge_header_t *ngx_http_rpcedge_cache_headers(ngx_pool_t *pool,
    ngx_list_t *list, ngx_str_t *content_type, ngx_hash_t *hide, size_t *n);

/* ngx_http_rpcedge_cache_hot.c */
rpcedge_hot_tier_t *ngx_http_rpcedge_cache_lend_hot(ngx_shm_zone_t *zone,
    rpcedge_hot_tier_t *tier);
char *ngx_http_rpcedge_cache_hot(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

#endif /* _NGX_HTTP_RPCEDGE_CACHE_H_INCLUDED_ */
