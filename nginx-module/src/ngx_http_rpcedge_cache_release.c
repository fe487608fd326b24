
/*
 * rpcedge cache: a key held by a request that went away, released at once.
 *
 * nginx drops the subrequests of a request it terminates (its client left
 * while the node answered), so the request cannot release its key itself.
 * The worker sends the release on a connection of its own, with no request
 * behind it, to the daemon that answered the request's lookup; the answer is
 * read and dropped.  Where there is no such daemon address (the request went
 * before its lookup's answer, or the lookup went over TLS) the caller leaves
 * the key to the worker's next lookup.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>
#include <ngx_event_connect.h>
#include <ngx_http.h>

#include "ngx_http_rpcedge_cache.h"


typedef struct {
    ngx_peer_connection_t       peer;
    ngx_sockaddr_t              sockaddr;
    ngx_str_t                   name;
    ngx_buf_t                  *request;
    ngx_pool_t                 *pool;
    /* to send the release, then again to have its answer */
    ngx_msec_t                  timeout;
} ngx_http_rpcedge_cache_release_t;


static ngx_buf_t *ngx_http_rpcedge_cache_release_request(ngx_pool_t *pool,
    rpcedge_daemon_call_t *release);
static void ngx_http_rpcedge_cache_release_send(ngx_event_t *wev);
static void ngx_http_rpcedge_cache_release_sent(ngx_event_t *wev);
static void ngx_http_rpcedge_cache_release_read(ngx_event_t *rev);
static void ngx_http_rpcedge_cache_release_timed_out(
    ngx_http_rpcedge_cache_release_t *rel);
static void ngx_http_rpcedge_cache_release_close(
    ngx_http_rpcedge_cache_release_t *rel);


ngx_int_t
ngx_http_rpcedge_cache_release_now(ngx_http_rpcedge_cache_ctx_t *ctx,
    rpcedge_daemon_call_t *release)
{
    ngx_int_t                          rc;
    ngx_pool_t                        *pool;
    ngx_connection_t                  *c;
    ngx_http_rpcedge_cache_call_t     *call;
    ngx_http_rpcedge_cache_release_t  *rel;

    /* the daemon that answered the lookup: the one that holds the key */

    call = ctx->call ? ngx_http_get_module_ctx(ctx->call,
                                               ngx_http_rpcedge_cache_module)
                     : NULL;

    if (call == NULL || call->daemon_len == 0) {
        return NGX_DECLINED;
    }

    pool = ngx_create_pool(1024, ngx_cycle->log);
    if (pool == NULL) {
        return NGX_ERROR;
    }

    rel = ngx_pcalloc(pool, sizeof(ngx_http_rpcedge_cache_release_t));
    if (rel == NULL) {
        goto failed;
    }

    rel->pool = pool;

    /* the call's bytes live in the core's handle, freed after this */

    rel->request = ngx_http_rpcedge_cache_release_request(pool, release);
    if (rel->request == NULL) {
        goto failed;
    }

    ngx_memcpy(&rel->sockaddr, &call->daemon, call->daemon_len);

    rel->name.data = ngx_pnalloc(pool, NGX_SOCKADDR_STRLEN);
    if (rel->name.data == NULL) {
        goto failed;
    }

    rel->name.len = ngx_sock_ntop(&rel->sockaddr.sockaddr, call->daemon_len,
                                  rel->name.data, NGX_SOCKADDR_STRLEN, 1);

    rel->peer.sockaddr = &rel->sockaddr.sockaddr;
    rel->peer.socklen = call->daemon_len;
    rel->peer.name = &rel->name;
    rel->peer.get = ngx_event_get_peer;
    rel->peer.log = ngx_cycle->log;
    rel->peer.log_error = NGX_ERROR_INFO;

    rc = ngx_event_connect_peer(&rel->peer);

    if (rc == NGX_ERROR || rc == NGX_BUSY || rc == NGX_DECLINED) {
        if (rel->peer.connection) {
            ngx_close_connection(rel->peer.connection);
        }

        goto failed;
    }

    c = rel->peer.connection;
    c->data = rel;
    c->pool = pool;
    c->write->handler = ngx_http_rpcedge_cache_release_send;
    c->read->handler = ngx_http_rpcedge_cache_release_read;

    rel->timeout = release->timeout_ms ? (ngx_msec_t) release->timeout_ms
                                       : 1000;

    ngx_add_timer(c->write, rel->timeout);

    if (rc == NGX_OK) {
        ngx_http_rpcedge_cache_release_send(c->write);
    }

    return NGX_OK;

failed:

    ngx_destroy_pool(pool);

    return NGX_ERROR;
}


/* the call as HTTP/1.1 on a connection that ends with its answer */

static ngx_buf_t *
ngx_http_rpcedge_cache_release_request(ngx_pool_t *pool,
    rpcedge_daemon_call_t *release)
{
    size_t      len, i;
    ngx_buf_t  *b;

    static u_char  tail[] = " HTTP/1.1" CRLF
                            "Host: rpcedge-cached" CRLF
                            "Connection: close" CRLF;

    if (release->body.data != NULL) {
        return NULL;
    }

    len = release->method.len + 1 + release->path.len + sizeof(tail) - 1
          + sizeof(CRLF) - 1;

    for (i = 0; i < release->headers_len; i++) {
        len += release->headers[i].name_len + sizeof(": ") - 1
               + release->headers[i].value_len + sizeof(CRLF) - 1;
    }

    b = ngx_create_temp_buf(pool, len);
    if (b == NULL) {
        return NULL;
    }

    b->last = ngx_cpymem(b->last, release->method.data, release->method.len);
    *b->last++ = ' ';
    b->last = ngx_cpymem(b->last, release->path.data, release->path.len);
    b->last = ngx_cpymem(b->last, tail, sizeof(tail) - 1);

    for (i = 0; i < release->headers_len; i++) {
        b->last = ngx_cpymem(b->last, release->headers[i].name,
                             release->headers[i].name_len);
        *b->last++ = ':';
        *b->last++ = ' ';
        b->last = ngx_cpymem(b->last, release->headers[i].value,
                             release->headers[i].value_len);
        *b->last++ = CR;
        *b->last++ = LF;
    }

    *b->last++ = CR;
    *b->last++ = LF;

    return b;
}


static void
ngx_http_rpcedge_cache_release_send(ngx_event_t *wev)
{
    ssize_t                            n;
    ngx_buf_t                         *b;
    ngx_connection_t                  *c;
    ngx_http_rpcedge_cache_release_t  *rel;

    c = wev->data;
    rel = c->data;
    b = rel->request;

    if (wev->timedout) {
        ngx_http_rpcedge_cache_release_timed_out(rel);
        return;
    }

    while (b->pos < b->last) {
        n = c->send(c, b->pos, b->last - b->pos);

        if (n == NGX_AGAIN) {
            if (ngx_handle_write_event(wev, 0) != NGX_OK) {
                ngx_http_rpcedge_cache_release_close(rel);
            }

            return;
        }

        if (n == NGX_ERROR) {
            ngx_http_rpcedge_cache_release_close(rel);
            return;
        }

        b->pos += n;
    }

    /* sent: the daemon answers and closes */

    if (wev->timer_set) {
        ngx_del_timer(wev);
    }

    wev->handler = ngx_http_rpcedge_cache_release_sent;

    ngx_add_timer(c->read, rel->timeout);

    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        ngx_http_rpcedge_cache_release_close(rel);
        return;
    }

    if (c->read->ready) {
        ngx_http_rpcedge_cache_release_read(c->read);
    }
}


static void
ngx_http_rpcedge_cache_release_sent(ngx_event_t *wev)
{
    ngx_log_debug0(NGX_LOG_DEBUG_HTTP, wev->log, 0,
                   "rpcedge cache: release sent");
}


/* the answer is not needed: read to the daemon's close */

static void
ngx_http_rpcedge_cache_release_read(ngx_event_t *rev)
{
    u_char                             buf[512];
    ssize_t                            n;
    ngx_connection_t                  *c;
    ngx_http_rpcedge_cache_release_t  *rel;

    c = rev->data;
    rel = c->data;

    if (rev->timedout) {
        ngx_http_rpcedge_cache_release_timed_out(rel);
        return;
    }

    for ( ;; ) {
        n = c->recv(c, buf, sizeof(buf));

        if (n == NGX_AGAIN) {
            if (ngx_handle_read_event(rev, 0) != NGX_OK) {
                ngx_http_rpcedge_cache_release_close(rel);
            }

            return;
        }

        if (n == 0 || n == NGX_ERROR) {
            ngx_http_rpcedge_cache_release_close(rel);
            return;
        }
    }
}


static void
ngx_http_rpcedge_cache_release_timed_out(ngx_http_rpcedge_cache_release_t *rel)
{
    ngx_log_error(NGX_LOG_INFO, rel->peer.connection->log, NGX_ETIMEDOUT,
                  "rpcedge cache: the daemon %V did not take a release in "
                  "time: it lets the key go at the lock's time", &rel->name);

    ngx_http_rpcedge_cache_release_close(rel);
}


static void
ngx_http_rpcedge_cache_release_close(ngx_http_rpcedge_cache_release_t *rel)
{
    ngx_pool_t  *pool;

    pool = rel->pool;

    ngx_close_connection(rel->peer.connection);
    ngx_destroy_pool(pool);
}
