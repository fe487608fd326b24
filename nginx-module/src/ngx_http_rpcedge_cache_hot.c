
/*
 * rpcedge cache: the hot tier (rpcedge_cache_hot), a shared memory zone laid
 * out by the core that answers the daemon's hits again without the trip.
 * The zone's lock is held only while an entry is copied in or out.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_rpcedge_cache.h"


static void ngx_http_rpcedge_cache_lock_hot(void *data);
static void ngx_http_rpcedge_cache_unlock_hot(void *data);
static ngx_int_t ngx_http_rpcedge_cache_init_hot(ngx_shm_zone_t *shm_zone,
    void *data);


/* the zone as the core takes it (NULL without one): the core holds its lock
 * only while an entry is copied out or in */

rpcedge_hot_tier_t *
ngx_http_rpcedge_cache_lend_hot(ngx_shm_zone_t *zone, rpcedge_hot_tier_t *tier)
{
    ngx_http_rpcedge_cache_hot_t  *hot;

    if (zone == NULL) {
        return NULL;
    }

    hot = zone->data;

    tier->region = hot->region;
    tier->len = hot->len;
    tier->lock = ngx_http_rpcedge_cache_lock_hot;
    tier->unlock = ngx_http_rpcedge_cache_unlock_hot;
    tier->data = hot;

    return tier;
}


static void
ngx_http_rpcedge_cache_lock_hot(void *data)
{
    ngx_http_rpcedge_cache_hot_t  *hot = data;

    ngx_shmtx_lock(&hot->shpool->mutex);
}


static void
ngx_http_rpcedge_cache_unlock_hot(void *data)
{
    ngx_http_rpcedge_cache_hot_t  *hot = data;

    ngx_shmtx_unlock(&hot->shpool->mutex);
}


/* rpcedge_cache_hot name:size | off; one zone may serve many locations */

char *
ngx_http_rpcedge_cache_hot(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_rpcedge_cache_conf_t *rccf = conf;

    u_char                        *p;
    ssize_t                        size;
    ngx_str_t                     *value, name, s;
    ngx_http_rpcedge_cache_hot_t  *hot;

    if (rccf->hot != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "off") == 0) {
        rccf->hot = NULL;
        return NGX_CONF_OK;
    }

    p = (u_char *) ngx_strchr(value[1].data, ':');

    if (p == NULL || p == value[1].data) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" must be name:size, such as rpcedge_hot:16m, "
                           "or off", &value[1]);
        return NGX_CONF_ERROR;
    }

    name.data = value[1].data;
    name.len = p - value[1].data;

    s.data = p + 1;
    s.len = value[1].data + value[1].len - s.data;

    size = ngx_parse_size(&s);

    /* the core's smallest region, and the slab pool's own pages */

    if (size == NGX_ERROR
        || (size_t) size < rpcedge_cache_hot_min_region() + 8 * ngx_pagesize)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "rpcedge_cache_hot zone \"%V\" is too small or not "
                           "a size: \"%V\" (at least %uzk)", &name, &s,
                           (rpcedge_cache_hot_min_region() + 8 * ngx_pagesize)
                           / 1024);
        return NGX_CONF_ERROR;
    }

    rccf->hot = ngx_shared_memory_add(cf, &name, size,
                                      &ngx_http_rpcedge_cache_module);
    if (rccf->hot == NULL) {
        return NGX_CONF_ERROR;
    }

    if (rccf->hot->data == NULL) {
        hot = ngx_pcalloc(cf->pool, sizeof(ngx_http_rpcedge_cache_hot_t));
        if (hot == NULL) {
            return NGX_CONF_ERROR;
        }

        rccf->hot->init = ngx_http_rpcedge_cache_init_hot;
        rccf->hot->data = hot;
    }

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_rpcedge_cache_init_hot(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_http_rpcedge_cache_hot_t  *ohot = data;

    size_t                         len;
    ngx_http_rpcedge_cache_hot_t  *hot;

    hot = shm_zone->data;

    /* a reload: the zone and its entries carry over */

    if (ohot) {
        *hot = *ohot;
        return NGX_OK;
    }

    hot->shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    /* all the pool's free pages, in one piece, as the region */

    len = hot->shpool->pfree * ngx_pagesize;

    hot->region = ngx_slab_alloc(hot->shpool, len);

    if (hot->region == NULL || !rpcedge_cache_hot_init(hot->region, len)) {
        ngx_log_error(NGX_LOG_EMERG, shm_zone->shm.log, 0,
                      "rpcedge_cache_hot zone \"%V\" has no room for the "
                      "hot tier", &shm_zone->shm.name);
        return NGX_ERROR;
    }

    hot->len = len;

    return NGX_OK;
}
