/*
 * One source, many fake plugins for the loader tests. Each build picks a failure mode with -D:
 *   FAKE_NAME        plugin name (must match the file name unless testing the mismatch)
 *   FAKE_ABI         abi_version to claim (default: this header's)
 *   FAKE_SYMBOL      exported symbol name (default ferry_plugin_v1); FAKE_NO_SYMBOL exports none
 *   FAKE_UNAVAILABLE probe says unavailable
 *   FAKE_EXTRA       a struct from a newer minor: extra fields appended
 *   FAKE_STRUCT_SIZE struct_size to claim
 *   FAKE_NEEDS_DEP   calls into a library that the tests do not put on the loader's path
 *   FAKE_VERSION     version string (the variant tests tell copies apart by it)
 *   FAKE_OPTIONS     publishes an option table (ABI 1.2) with entries larger than this header's
 * The transport functions are real enough to create and destroy an instance.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/plugin.h"

#ifndef FAKE_ABI
#define FAKE_ABI FERRY_PLUGIN_ABI_VERSION
#endif
#ifndef FAKE_SYMBOL
#define FAKE_SYMBOL ferry_plugin_v1
#endif
#ifndef FAKE_VERSION
#define FAKE_VERSION "0.0.1"
#endif

#ifdef FAKE_NEEDS_DEP
int ferry_fake_dep_value(void);
#endif

struct ferry_transport {
    int unused;
};

static int fake_probe(const ferry_kv_t *o, size_t n, ferry_probe_result_t *r) {
    (void)o;
    (void)n;
#ifdef FAKE_UNAVAILABLE
    r->available = 0;
    snprintf(r->reason, sizeof r->reason, "no fake device: /dev/fake0 does not exist");
#else
    r->available = 1;
#ifdef FAKE_NEEDS_DEP
    snprintf(r->reason, sizeof r->reason, "dep says %d", ferry_fake_dep_value());
#else
    snprintf(r->reason, sizeof r->reason, "fake device present");
#endif
#endif
    return 0;
}

static int fake_create(const ferry_kv_t *o, size_t n, const ferry_host_api_t *h, ferry_transport_t **out,
                       ferry_error_t *e) {
    (void)o;
    (void)n;
    (void)h;
    (void)e;
    *out = calloc(1, sizeof **out);
    return *out ? 0 : -ENOMEM;
}
static void fake_destroy(ferry_transport_t *t) { free(t); }
static int fake_export(ferry_transport_t *t, void *b, size_t *l, ferry_error_t *e) {
    (void)t;
    (void)b;
    (void)e;
    *l = 0;
    return 0;
}
static int fake_register(ferry_transport_t *t, const ferry_mem_region_t *r, uint64_t *h, ferry_error_t *e) {
    (void)t;
    (void)e;
    *h = r->addr;
    return 0;
}
static int fake_deregister(ferry_transport_t *t, uint64_t h, ferry_error_t *e) {
    (void)t;
    (void)h;
    (void)e;
    return 0;
}
static int fake_export_mem(ferry_transport_t *t, uint64_t h, void *b, size_t *l, ferry_error_t *e) {
    (void)t;
    (void)h;
    (void)b;
    (void)e;
    *l = 0;
    return 0;
}
static int fake_connect(ferry_transport_t *t, const void *ep, size_t l, uint64_t *p, ferry_error_t *e) {
    (void)t;
    (void)ep;
    (void)l;
    (void)p;
    snprintf(e->message, sizeof e->message, "fake transports connect nowhere");
    return -EHOSTUNREACH;
}
static int fake_disconnect(ferry_transport_t *t, uint64_t p, ferry_error_t *e) {
    (void)t;
    (void)p;
    (void)e;
    return 0;
}
static int fake_import(ferry_transport_t *t, uint64_t p, const ferry_mem_region_t *r, const void *d, size_t l,
                       uint64_t *h, ferry_error_t *e) {
    (void)t;
    (void)p;
    (void)r;
    (void)d;
    (void)l;
    (void)h;
    (void)e;
    return -ENOTSUP;
}
static int fake_release(ferry_transport_t *t, uint64_t p, uint64_t h, ferry_error_t *e) {
    (void)t;
    (void)p;
    (void)h;
    (void)e;
    return 0;
}
static int fake_submit(ferry_transport_t *t, uint64_t p, const ferry_xfer_op_t *o, size_t n, ferry_error_t *e) {
    (void)t;
    (void)p;
    (void)o;
    (void)n;
    (void)e;
    return -ENOTSUP;
}
static int fake_poll(ferry_transport_t *t, ferry_completion_t *o, size_t m, ferry_error_t *e) {
    (void)t;
    (void)o;
    (void)m;
    (void)e;
    return 0;
}

#ifdef FAKE_EXTRA
/* What a plugin built against a newer 1.x header looks like: v1.0 fields, then more. */
typedef struct {
    ferry_plugin_v1_t base;
    int (*future_call)(void);
    uint64_t future_flags;
} plugin_struct_t;
static int future(void) { return 42; }
#define INIT_EXTRA , future, 7
#define BASE(...) \
    { __VA_ARGS__ }
#else
typedef ferry_plugin_v1_t plugin_struct_t;
#define INIT_EXTRA
#define BASE(...) __VA_ARGS__
#endif

#ifdef FAKE_OPTIONS
/* An option table (ABI 1.2) from a newer header: each entry carries a field this host does not
 * know, so the host must step by option_desc_size. FAKE_N_OPTIONS: the count to claim. */
typedef struct {
    ferry_option_desc_t d;
    uint64_t future;
} fake_desc_t;
static const fake_desc_t fake_options[] = {
    {{"depth", FERRY_OPTION_UINT, 0, "8", 1, 64, NULL, NULL, "queue depth"}, 1},
    {{"mode", FERRY_OPTION_ENUM, 0, "fast", 0, 0, "fast|safe", NULL, "how to go"}, 2},
};
#ifndef FAKE_N_OPTIONS
#define FAKE_N_OPTIONS 2
#endif
#define INIT_OPTIONS , &fake_options[0].d, FAKE_N_OPTIONS, sizeof(fake_desc_t)
#else
#define INIT_OPTIONS
#endif

#ifndef FAKE_STRUCT_SIZE
#define FAKE_STRUCT_SIZE sizeof(plugin_struct_t)
#endif

#ifndef FAKE_NO_SYMBOL
FERRY_PLUGIN_EXPORT const plugin_struct_t FAKE_SYMBOL = {
    BASE(FAKE_ABI, FAKE_STRUCT_SIZE, FAKE_NAME, FAKE_VERSION, FERRY_CAP_MEM_HOST | FERRY_CAP_INTRA_NODE, fake_probe,
         fake_create, fake_destroy, fake_export, fake_register, fake_deregister, fake_export_mem, fake_connect,
         fake_disconnect, fake_import, fake_release, fake_submit, fake_poll, NULL INIT_OPTIONS) INIT_EXTRA};
#else
FERRY_PLUGIN_EXPORT int ferry_something_else = 1;
#endif
