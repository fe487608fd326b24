
/*
 * rpcedge_status: the counters of every worker, kept in a shared memory
 * zone, in Prometheus' text format.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <rpcedge.h>

#include "ngx_http_rpcedge_module.h"


typedef struct {
    /* exchanges by the mode they ended in (rpcedge_exchange_mode_code) */
    ngx_atomic_t               responses[RPCEDGE_MODES];
    /* exchanges still under way when their request ended (the client left) */
    ngx_atomic_t               aborted;
    ngx_atomic_t               bytes_in;
    ngx_atomic_t               bytes_out;
    ngx_atomic_t               offloads;
    /* compressions meant for the thread pool that ran inline (queue full) */
    ngx_atomic_t               inline_fallbacks;
    /* bodies sent as SSZ, and bodies that could not be (sent as they came) */
    ngx_atomic_t               transcoded;
    ngx_atomic_t               transcode_refused;
} ngx_http_rpcedge_counters_t;


static ngx_int_t ngx_http_rpcedge_init_counters(ngx_shm_zone_t *shm_zone,
    void *data);
static ngx_int_t ngx_http_rpcedge_status_handler(ngx_http_request_t *r);


static ngx_str_t  ngx_http_rpcedge_zone_name = ngx_string("rpcedge_counters");

/* set in every worker once the shared zone is mapped */
static ngx_http_rpcedge_counters_t  *ngx_http_rpcedge_counters;


void
ngx_http_rpcedge_count_exchange(rpcedge_exchange_t *ex, ngx_uint_t done,
    ngx_uint_t transcode)
{
    uint64_t                      in, out;
    ngx_http_rpcedge_counters_t  *counters;

    counters = ngx_http_rpcedge_counters;

    if (counters == NULL) {
        return;
    }

    switch (transcode) {

    case RPCEDGE_TRANSCODE_DONE:
        (void) ngx_atomic_fetch_add(&counters->transcoded, 1);
        break;

    case RPCEDGE_TRANSCODE_REFUSED:
        (void) ngx_atomic_fetch_add(&counters->transcode_refused, 1);
        break;
    }

    if (done) {
        (void) ngx_atomic_fetch_add(
                 &counters->responses[rpcedge_exchange_mode_code(ex)], 1);

    } else {
        (void) ngx_atomic_fetch_add(&counters->aborted, 1);
    }

    rpcedge_exchange_counts(ex, &in, &out);

    (void) ngx_atomic_fetch_add(&counters->bytes_in, in);
    (void) ngx_atomic_fetch_add(&counters->bytes_out, out);
}


void
ngx_http_rpcedge_count_offload(ngx_uint_t posted)
{
    if (ngx_http_rpcedge_counters == NULL) {
        return;
    }

    (void) ngx_atomic_fetch_add(posted
                                ? &ngx_http_rpcedge_counters->offloads
                                : &ngx_http_rpcedge_counters->inline_fallbacks,
                                1);
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
    ngx_slab_pool_t  *shpool;

    if (data) {
        /* a reload: the counters go on */
        shm_zone->data = data;
        ngx_http_rpcedge_counters = data;
        return NGX_OK;
    }

    shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    if (shm_zone->shm.exists) {
        shm_zone->data = shpool->data;
        ngx_http_rpcedge_counters = shpool->data;
        return NGX_OK;
    }

    ngx_http_rpcedge_counters = ngx_slab_calloc(shpool,
                                           sizeof(ngx_http_rpcedge_counters_t));
    if (ngx_http_rpcedge_counters == NULL) {
        return NGX_ERROR;
    }

    shpool->data = ngx_http_rpcedge_counters;
    shm_zone->data = ngx_http_rpcedge_counters;

    return NGX_OK;
}


/* the counters in Prometheus' text format */

static ngx_int_t
ngx_http_rpcedge_status_handler(ngx_http_request_t *r)
{
    u_char                       *name;
    size_t                        size;
    ngx_int_t                     rc;
    ngx_buf_t                    *b;
    ngx_uint_t                    i;
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

    size = sizeof("# TYPE rpcedge_responses_total counter\n") - 1
           + RPCEDGE_MODES * (sizeof("rpcedge_responses_total{mode=\"\"} \n")
                              - 1 + 32 + NGX_ATOMIC_T_LEN)
           + 7 * (2 * sizeof("# TYPE rpcedge_transcode_refused_total counter\n")
                  + NGX_ATOMIC_T_LEN);

    b = ngx_create_temp_buf(r->pool, size);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->last = ngx_cpymem(b->last, "# TYPE rpcedge_responses_total counter\n",
                         sizeof("# TYPE rpcedge_responses_total counter\n") - 1);

    for (i = 0; i < RPCEDGE_MODES; i++) {
        name = (u_char *) rpcedge_mode_name((uint8_t) i);

        b->last = ngx_sprintf(b->last,
                              "rpcedge_responses_total{mode=\"%s\"} %uA\n",
                              name, counters->responses[i]);
    }

    b->last = ngx_sprintf(b->last,
                          "# TYPE rpcedge_aborted_total counter\n"
                          "rpcedge_aborted_total %uA\n"
                          "# TYPE rpcedge_body_bytes_in_total counter\n"
                          "rpcedge_body_bytes_in_total %uA\n"
                          "# TYPE rpcedge_body_bytes_out_total counter\n"
                          "rpcedge_body_bytes_out_total %uA\n"
                          "# TYPE rpcedge_offloads_total counter\n"
                          "rpcedge_offloads_total %uA\n"
                          "# TYPE rpcedge_inline_fallbacks_total counter\n"
                          "rpcedge_inline_fallbacks_total %uA\n"
                          "# TYPE rpcedge_transcoded_total counter\n"
                          "rpcedge_transcoded_total %uA\n"
                          "# TYPE rpcedge_transcode_refused_total counter\n"
                          "rpcedge_transcode_refused_total %uA\n",
                          counters->aborted, counters->bytes_in,
                          counters->bytes_out, counters->offloads,
                          counters->inline_fallbacks, counters->transcoded,
                          counters->transcode_refused);

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
