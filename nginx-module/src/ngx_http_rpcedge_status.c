
/*
 * rpcedge_status: the counters of every worker, kept in a shared memory
 * zone, in Prometheus' text format.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <rpcedge.h>

#include "ngx_http_rpcedge_module.h"


/* one number per counter of the core, in its order (rpcedge_counter_name) */
typedef struct {
    /* rpcedge_counters() of the module that laid the zone out */
    ngx_uint_t                 n;
    ngx_atomic_t               counts[1];
} ngx_http_rpcedge_counters_t;


static ngx_int_t ngx_http_rpcedge_init_counters(ngx_shm_zone_t *shm_zone,
    void *data);
static ngx_int_t ngx_http_rpcedge_status_handler(ngx_http_request_t *r);


static ngx_str_t  ngx_http_rpcedge_zone_name = ngx_string("rpcedge_counters");

/* set in every worker once the shared zone is mapped */
static ngx_http_rpcedge_counters_t  *ngx_http_rpcedge_counters;


void
ngx_http_rpcedge_count(rpcedge_count_t *counts, size_t n)
{
    size_t                        i;
    ngx_http_rpcedge_counters_t  *counters;

    counters = ngx_http_rpcedge_counters;

    if (counters == NULL) {
        return;
    }

    for (i = 0; i < n; i++) {
        (void) ngx_atomic_fetch_add(&counters->counts[counts[i].index],
                                    counts[i].amount);
    }
}


ngx_int_t
ngx_http_rpcedge_status_init(ngx_conf_t *cf)
{
    ngx_shm_zone_t  *shm_zone;

    /* the smallest zone nginx gives a slab pool, tagged as this file's */

    shm_zone = ngx_shared_memory_add(cf, &ngx_http_rpcedge_zone_name,
                                     8 * ngx_pagesize,
                                     &ngx_http_rpcedge_zone_name);
    if (shm_zone == NULL) {
        return NGX_ERROR;
    }

    shm_zone->init = ngx_http_rpcedge_init_counters;

    return NGX_OK;
}


static ngx_int_t
ngx_http_rpcedge_init_counters(ngx_shm_zone_t *shm_zone, void *data)
{
    size_t                        n;
    ngx_slab_pool_t              *shpool;
    ngx_http_rpcedge_counters_t  *counters;

    n = rpcedge_counters();
    shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    /* a reload: the counters go on, unless the core now has others */

    counters = data ? data : (shm_zone->shm.exists ? shpool->data : NULL);

    if (counters == NULL || counters->n != n) {
        counters = ngx_slab_calloc(shpool, sizeof(ngx_http_rpcedge_counters_t)
                                           + (n - 1) * sizeof(ngx_atomic_t));
        if (counters == NULL) {
            return NGX_ERROR;
        }

        counters->n = n;
        shpool->data = counters;
    }

    shm_zone->data = counters;
    ngx_http_rpcedge_counters = counters;

    return NGX_OK;
}


/* every counter in Prometheus' text format, as Envoy prints its own */

static ngx_int_t
ngx_http_rpcedge_status_handler(ngx_http_request_t *r)
{
    size_t                        size;
    ngx_int_t                     rc;
    ngx_buf_t                    *b;
    ngx_uint_t                    i;
    const char                   *name;
    ngx_chain_t                   out;
    ngx_http_rpcedge_counters_t  *counters;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return NGX_HTTP_NOT_ALLOWED;
    }

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    counters = ngx_http_rpcedge_counters;

    if (counters == NULL) {
        return NGX_HTTP_SERVICE_UNAVAILABLE;
    }

    size = 0;

    for (i = 0; i < counters->n; i++) {
        size += sizeof("# TYPE  counter\n{} \n") - 1
                + 2 * ngx_strlen(rpcedge_counter_name(i)) + NGX_ATOMIC_T_LEN;
    }

    b = ngx_create_temp_buf(r->pool, size);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    for (i = 0; i < counters->n; i++) {
        name = rpcedge_counter_name(i);

        b->last = ngx_sprintf(b->last, "# TYPE %s counter\n%s{} %uA\n",
                              name, name, counters->counts[i]);
    }

    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_length_n = b->last - b->pos;
    ngx_str_set(&r->headers_out.content_type, "text/plain; version=0.0.4");
    r->headers_out.content_type_len = r->headers_out.content_type.len;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


char *
ngx_http_rpcedge_status(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_http_rpcedge_status_handler;

    return NGX_CONF_OK;
}
