
/*
 * The thread offload: a whole-body compression the core hands out as a job
 * (RPCEDGE_OUT_WORK) runs in the location's thread pool ("aio threads"),
 * which sees the job alone, never the request.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_rpcedge_filter.h"


#if (NGX_THREADS)

/* what a thread sees of an exchange: its job alone, never the request */
typedef struct {
    rpcedge_job_t             *job;
    /* how long the job ran, for compress_time_us */
    uint64_t                   ns;
} ngx_http_rpcedge_thread_ctx_t;


static void ngx_http_rpcedge_thread_handler(void *data, ngx_log_t *log);


ngx_int_t
ngx_http_rpcedge_thread_post(ngx_http_request_t *r,
    ngx_http_rpcedge_ctx_t *ctx, ngx_event_handler_pt done)
{
    ngx_str_t                  name;
    ngx_thread_pool_t         *tp;
    ngx_thread_task_t         *task;
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);
    tp = clcf->thread_pool;

    if (tp == NULL) {
        if (ngx_http_complex_value(r, clcf->thread_pool_value, &name)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        tp = ngx_thread_pool_get((ngx_cycle_t *) ngx_cycle, &name);

        if (tp == NULL) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "thread pool \"%V\" not found", &name);
            return NGX_ERROR;
        }
    }

    task = ctx->task;

    if (task == NULL) {
        task = ngx_thread_task_alloc(r->pool,
                                     sizeof(ngx_http_rpcedge_thread_ctx_t));
        if (task == NULL) {
            return NGX_ERROR;
        }

        task->handler = ngx_http_rpcedge_thread_handler;
        ctx->task = task;
    }

    /* the thread sees the job alone, never the request */

    ((ngx_http_rpcedge_thread_ctx_t *) task->ctx)->job = ctx->job;

    /* what the completion needs: r->ctx may be cleared by then (a redirect) */

    task->event.data = ctx;
    task->event.handler = done;

    if (ngx_thread_task_post(tp, task) != NGX_OK) {
        return NGX_ERROR;
    }

    /* the request may be finalized meanwhile, but is not freed */

    r->main->blocked++;
    ctx->offloaded = 1;

    return NGX_OK;
}


static void
ngx_http_rpcedge_thread_handler(void *data, ngx_log_t *log)
{
    ngx_http_rpcedge_thread_ctx_t  *tctx = data;

    uint64_t  started;

    ngx_log_debug0(NGX_LOG_DEBUG_CORE, log, 0, "rpcedge thread handler");

    started = ngx_http_rpcedge_now_ns();
    rpcedge_job_run(tctx->job);
    tctx->ns = ngx_http_rpcedge_now_ns() - started;
}


uint64_t
ngx_http_rpcedge_thread_ns(ngx_thread_task_t *task)
{
    return ((ngx_http_rpcedge_thread_ctx_t *) task->ctx)->ns;
}

#endif
