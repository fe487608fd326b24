
/*
 * rpcedge cache: the key of a request that went away, released.
 *
 * nginx ends a request whose client went away with its subrequests unrun,
 * so such a request cannot release the key it held with one.  The worker
 * sends the release at once on a connection of its own, with no request
 * behind it, to the daemon that answered the request's lookup, at the
 * daemon's own path (the location rpcedge_cache_pass names must pass paths
 * on unchanged, as configs/nginx/rpcedge-cache.conf does).  Where it has no
 * such address (the request went before its lookup's answer, or the lookup
 * went over TLS), or the daemon does not take the release, the key is kept
 * for the worker's next lookup to release with a subrequest.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>
#include <ngx_http.h>

#include "ngx_http_rpcedge_cache.h"


/* a release, kept whole: a method, a path and the one header (the holder it
 * names: its name static, its value in `value`) */
typedef struct {
    ngx_http_core_srv_conf_t   *server;
    ngx_str_t                   pass;
    size_t                      method_len;
    u_char                      method[16];
    size_t                      path_len;
    u_char                      path[128];
    rpcedge_header_t            header;
    u_char                      value[32];
} ngx_http_rpcedge_cache_orphan_t;


typedef struct {
    ngx_http_rpcedge_cache_orphan_t  orphan;
    ngx_peer_connection_t       peer;
    ngx_sockaddr_t              sockaddr;
    ngx_str_t                   name;
    ngx_buf_t                  *request;
    /* "HTTP/1.1 204", as much of it as has come */
    u_char                      status[12];
    size_t                      status_len;
    ngx_pool_t                 *pool;
} ngx_http_rpcedge_cache_release_t;


/* past this many, the daemon lets a key go at the lock's time */
#define NGX_HTTP_RPCEDGE_CACHE_ORPHANS  16


static ngx_int_t ngx_http_rpcedge_cache_orphan_init(
    ngx_http_rpcedge_cache_orphan_t *orphan, ngx_http_rpcedge_cache_ctx_t *ctx,
    rpcedge_daemon_call_t *release);
static void ngx_http_rpcedge_cache_orphan_keep(
    ngx_http_rpcedge_cache_orphan_t *orphan, ngx_log_t *log);
static ngx_int_t ngx_http_rpcedge_cache_release_now(
    ngx_http_rpcedge_cache_ctx_t *ctx, ngx_http_rpcedge_cache_orphan_t *orphan,
    ngx_msec_t timeout);
static ngx_buf_t *ngx_http_rpcedge_cache_release_request(ngx_pool_t *pool,
    ngx_http_rpcedge_cache_orphan_t *orphan);
static void ngx_http_rpcedge_cache_release_send(ngx_event_t *wev);
static void ngx_http_rpcedge_cache_release_sent(ngx_event_t *wev);
static void ngx_http_rpcedge_cache_release_read(ngx_event_t *rev);
static void ngx_http_rpcedge_cache_release_close(
    ngx_http_rpcedge_cache_release_t *rel, ngx_uint_t taken);
static void ngx_http_rpcedge_cache_orphans_forget(void *data);


static ngx_http_rpcedge_cache_orphan_t
    ngx_http_rpcedge_cache_orphans[NGX_HTTP_RPCEDGE_CACHE_ORPHANS];
static ngx_uint_t  ngx_http_rpcedge_cache_norphans;


/*
 * An orphan points into its configuration (its server, its pass), which goes
 * with the cycle: after a reload of a worker that is its own master
 * (master_process off), the old cycle's pool is destroyed in the process that
 * keeps the orphans.  Its orphans go first; their keys are let go at the
 * daemon's lock time.
 */

ngx_int_t
ngx_http_rpcedge_cache_orphans_init(ngx_conf_t *cf)
{
    ngx_pool_cleanup_t  *cln;

    cln = ngx_pool_cleanup_add(cf->pool, 0);
    if (cln == NULL) {
        return NGX_ERROR;
    }

    cln->handler = ngx_http_rpcedge_cache_orphans_forget;
    cln->data = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    return NGX_OK;
}


static void
ngx_http_rpcedge_cache_orphans_forget(void *data)
{
    ngx_uint_t                  i, s, n;
    ngx_http_core_srv_conf_t  **servers;
    ngx_http_core_main_conf_t  *cmcf;

    cmcf = data;
    servers = cmcf->servers.elts;
    n = 0;

    for (i = 0; i < ngx_http_rpcedge_cache_norphans; i++) {

        for (s = 0; s < cmcf->servers.nelts; s++) {
            if (ngx_http_rpcedge_cache_orphans[i].server == servers[s]) {
                break;
            }
        }

        if (s == cmcf->servers.nelts) {
            ngx_http_rpcedge_cache_orphans[n++] =
                ngx_http_rpcedge_cache_orphans[i];
        }
    }

    ngx_http_rpcedge_cache_norphans = n;
}


/* a key the request held and can no longer release with a subrequest */

void
ngx_http_rpcedge_cache_let_go(ngx_http_rpcedge_cache_ctx_t *ctx,
    rpcedge_daemon_call_t *release)
{
    ngx_log_t                        *log;
    ngx_http_rpcedge_cache_orphan_t   orphan;

    log = ctx->request->connection->log;

    if (ngx_http_rpcedge_cache_orphan_init(&orphan, ctx, release)
        != NGX_OK)
    {
        ngx_log_error(NGX_LOG_INFO, log, 0,
                      "rpcedge cache: a held key is left to the daemon's "
                      "lock time");
        return;
    }

    /* a worker shutting down (closing its connections) opens none */

    if (ctx->request->connection->close
        || ngx_http_rpcedge_cache_release_now(ctx, &orphan,
                                              (ngx_msec_t) release->timeout_ms)
           != NGX_OK)
    {
        ngx_http_rpcedge_cache_orphan_keep(&orphan, log);
    }
}


/* the keys of ended requests that r, looking up through `pass`, can reach:
 * those of its own server and rpcedge_cache_pass */

void
ngx_http_rpcedge_cache_release_orphans(ngx_http_request_t *r, ngx_str_t *pass)
{
    ngx_uint_t                        i, n;
    rpcedge_header_t                  header;
    rpcedge_daemon_call_t             release;
    ngx_http_core_srv_conf_t         *server;
    ngx_http_rpcedge_cache_orphan_t  *orphan;

    server = ngx_http_get_module_srv_conf(r, ngx_http_core_module);

    n = 0;

    for (i = 0; i < ngx_http_rpcedge_cache_norphans; i++) {
        orphan = &ngx_http_rpcedge_cache_orphans[i];

        if (orphan->server != server
            || orphan->pass.len != pass->len
            || ngx_strncmp(orphan->pass.data, pass->data, pass->len) != 0)
        {
            ngx_http_rpcedge_cache_orphans[n++] = *orphan;
            continue;
        }

        ngx_memzero(&release, sizeof(rpcedge_daemon_call_t));

        release.method.data = orphan->method;
        release.method.len = orphan->method_len;
        release.path.data = orphan->path;
        release.path.len = orphan->path_len;

        /* the value is the orphan's own, wherever the orphan was copied */

        header = orphan->header;
        header.value = orphan->value;

        if (header.name_len) {
            release.headers = &header;
            release.headers_len = 1;
        }

        (void) ngx_http_rpcedge_cache_call(r, pass, &release, NULL, 0);
    }

    ngx_http_rpcedge_cache_norphans = n;
}


/* the release copied out of the core's handle, which is freed after this */

static ngx_int_t
ngx_http_rpcedge_cache_orphan_init(ngx_http_rpcedge_cache_orphan_t *orphan,
    ngx_http_rpcedge_cache_ctx_t *ctx, rpcedge_daemon_call_t *release)
{
    if (release->method.len > sizeof(orphan->method)
        || release->path.len > sizeof(orphan->path)
        || release->headers_len > 1
        || (release->headers_len
            && release->headers[0].value_len > sizeof(orphan->value))
        || release->body.data)
    {
        return NGX_DECLINED;
    }

    ngx_memzero(orphan, sizeof(ngx_http_rpcedge_cache_orphan_t));

    /* a request keeps its server through an error_page, not its location */

    orphan->server = ngx_http_get_module_srv_conf(ctx->request,
                                                  ngx_http_core_module);
    orphan->pass = ctx->pass;
    orphan->method_len = release->method.len;
    ngx_memcpy(orphan->method, release->method.data, release->method.len);
    orphan->path_len = release->path.len;
    ngx_memcpy(orphan->path, release->path.data, release->path.len);

    /* the header's value is copied into the orphan: its own pointer is not
     * used */

    if (release->headers_len) {
        orphan->header = release->headers[0];
        orphan->header.value = NULL;
        ngx_memcpy(orphan->value, release->headers[0].value,
                   release->headers[0].value_len);
    }

    return NGX_OK;
}


static void
ngx_http_rpcedge_cache_orphan_keep(ngx_http_rpcedge_cache_orphan_t *orphan,
    ngx_log_t *log)
{
    ngx_http_rpcedge_cache_orphan_t  *kept;

    if (ngx_http_rpcedge_cache_norphans == NGX_HTTP_RPCEDGE_CACHE_ORPHANS) {
        ngx_log_error(NGX_LOG_INFO, log, 0,
                      "rpcedge cache: a held key is left to the daemon's "
                      "lock time");
        return;
    }

    kept = &ngx_http_rpcedge_cache_orphans[ngx_http_rpcedge_cache_norphans++];

    *kept = *orphan;
}


static ngx_int_t
ngx_http_rpcedge_cache_release_now(ngx_http_rpcedge_cache_ctx_t *ctx,
    ngx_http_rpcedge_cache_orphan_t *orphan, ngx_msec_t timeout)
{
    ngx_int_t                          rc;
    ngx_pool_t                        *pool;
    ngx_connection_t                  *c;
    ngx_http_rpcedge_cache_call_t     *call;
    ngx_http_rpcedge_cache_release_t  *rel;

    /* the daemon that answered the lookup: the one that holds the key */

    call = NULL;

    if (ctx->call) {
        call = ngx_http_get_module_ctx(ctx->call,
                                       ngx_http_rpcedge_cache_module);
    }

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
    rel->orphan = *orphan;

    rel->request = ngx_http_rpcedge_cache_release_request(pool, orphan);
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

    /* it closes a connection it could not make */

    if (rc != NGX_OK && rc != NGX_AGAIN) {
        goto failed;
    }

    c = rel->peer.connection;
    c->data = rel;
    c->pool = pool;
    c->write->handler = ngx_http_rpcedge_cache_release_send;
    c->read->handler = ngx_http_rpcedge_cache_release_read;

    /* one bound on the whole exchange, the core's for the release; the
     * connection closed in time is how it ends */

    ngx_add_timer(c->read, timeout);

    if (rc == NGX_OK) {
        ngx_http_rpcedge_cache_release_send(c->write);
    }

    return NGX_OK;

failed:

    ngx_destroy_pool(pool);

    return NGX_ERROR;
}


/* the release as HTTP/1.1 on a connection that ends with its answer */

static ngx_buf_t *
ngx_http_rpcedge_cache_release_request(ngx_pool_t *pool,
    ngx_http_rpcedge_cache_orphan_t *orphan)
{
    size_t      len;
    ngx_buf_t  *b;

    static u_char  tail[] = " HTTP/1.1" CRLF
                            "Host: rpcedge-cached" CRLF
                            "Connection: close" CRLF;

    len = orphan->method_len + 1 + orphan->path_len + sizeof(tail) - 1
          + sizeof(CRLF) - 1;

    if (orphan->header.name_len) {
        len += orphan->header.name_len + sizeof(": ") - 1
               + orphan->header.value_len + sizeof(CRLF) - 1;
    }

    b = ngx_create_temp_buf(pool, len);
    if (b == NULL) {
        return NULL;
    }

    b->last = ngx_cpymem(b->last, orphan->method, orphan->method_len);
    *b->last++ = ' ';
    b->last = ngx_cpymem(b->last, orphan->path, orphan->path_len);
    b->last = ngx_cpymem(b->last, tail, sizeof(tail) - 1);

    if (orphan->header.name_len) {
        b->last = ngx_cpymem(b->last, orphan->header.name,
                             orphan->header.name_len);
        *b->last++ = ':';
        *b->last++ = ' ';
        b->last = ngx_cpymem(b->last, orphan->value, orphan->header.value_len);
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

    /* a worker shutting down closes what it still has */

    if (c->close) {
        ngx_http_rpcedge_cache_release_close(rel, 1);
        return;
    }

    while (b->pos < b->last) {
        n = c->send(c, b->pos, b->last - b->pos);

        if (n == NGX_AGAIN) {
            if (ngx_handle_write_event(wev, 0) != NGX_OK) {
                ngx_http_rpcedge_cache_release_close(rel, 0);
            }

            return;
        }

        if (n == NGX_ERROR) {
            ngx_http_rpcedge_cache_release_close(rel, 0);
            return;
        }

        b->pos += n;
    }

    /* sent: the daemon answers and closes; a level-triggered write event is
     * let go of */

    wev->handler = ngx_http_rpcedge_cache_release_sent;

    if (ngx_handle_write_event(wev, 0) != NGX_OK
        || ngx_handle_read_event(c->read, 0) != NGX_OK)
    {
        ngx_http_rpcedge_cache_release_close(rel, 0);
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


/* the answer's status line says whether the daemon took it; the rest is read
 * to the daemon's close */

static void
ngx_http_rpcedge_cache_release_read(ngx_event_t *rev)
{
    u_char                             buf[512];
    size_t                             copy;
    ssize_t                            n;
    ngx_connection_t                  *c;
    ngx_http_rpcedge_cache_release_t  *rel;

    c = rev->data;
    rel = c->data;

    if (c->close) {
        ngx_http_rpcedge_cache_release_close(rel, 1);
        return;
    }

    if (rev->timedout) {
        ngx_log_error(NGX_LOG_INFO, c->log, NGX_ETIMEDOUT,
                      "rpcedge cache: the daemon %V did not answer a release "
                      "in time", &rel->name);
        ngx_http_rpcedge_cache_release_close(rel, 0);
        return;
    }

    for ( ;; ) {
        n = c->recv(c, buf, sizeof(buf));

        if (n == NGX_AGAIN) {
            if (ngx_handle_read_event(rev, 0) != NGX_OK) {
                ngx_http_rpcedge_cache_release_close(rel, 0);
            }

            return;
        }

        if (n == 0 || n == NGX_ERROR) {
            /* "HTTP/1.1 2xx" */
            ngx_http_rpcedge_cache_release_close(rel,
                rel->status_len == sizeof(rel->status)
                && ngx_strncmp(rel->status, "HTTP/1.", 7) == 0
                && rel->status[9] == '2');
            return;
        }

        copy = ngx_min((size_t) n, sizeof(rel->status) - rel->status_len);
        rel->status_len += copy;
        ngx_memcpy(rel->status + rel->status_len - copy, buf, copy);
    }
}


/* a release the daemon did not take is left to the worker's next lookup */

static void
ngx_http_rpcedge_cache_release_close(ngx_http_rpcedge_cache_release_t *rel,
    ngx_uint_t taken)
{
    ngx_pool_t  *pool;

    if (!taken) {
        ngx_http_rpcedge_cache_orphan_keep(&rel->orphan,
                                           rel->peer.connection->log);
    }

    pool = rel->pool;

    ngx_close_connection(rel->peer.connection);
    ngx_destroy_pool(pool);
}
