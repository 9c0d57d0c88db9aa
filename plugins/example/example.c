/*
 * example.so: the smallest complete Ferry transport, in plain C, to copy when writing a new one.
 *
 * It moves bytes between engines of the SAME PROCESS with memcpy, which keeps the code about the
 * ABI rather than about a network. Everything a real transport needs is here: a probe, options,
 * registration with access rights checked on the serving side, endpoints, peers, imported
 * regions, an asynchronous completion queue with an eventfd, and errors as negative codes plus a
 * message. It builds against plugin.h alone and is not installed.
 *
 * Endpoint bytes: { pid, instance id }. Instances live in a process-wide table so a peer that has
 * been destroyed is detected instead of dereferenced.
 *
 * Build it out of tree with one line against the installed headers (README.md in this directory
 * shows it). A new transport must pass the conformance suite, tests/transport/conformance_test.cpp
 * (this plugin's instance is in tests/transport/transport_params.cpp). Writing in C++? Start from
 * the kit in plugins/common/ instead (plugin_entry.hpp: the entry table and its guard;
 * plugin_util.hpp: the logger, set_error, the completion queue, byte order), as every bundled
 * transport does.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "ferry/plugin.h"

#define MAX_INSTANCES 64
#define MAX_REGIONS 256

typedef struct region {
    ferry_mem_region_t r;
    int used;
} region_t;

struct ferry_transport {
    uint64_t id;
    const ferry_host_api_t *host;
    uint64_t max_regions; /* option max_regions */
    pthread_mutex_t lock; /* guards regions and the completion queue */
    region_t regions[MAX_REGIONS];
    ferry_completion_t *done; /* completion queue (grown as needed) */
    size_t done_len, done_cap;
    int event_fd;
};

typedef struct endpoint {
    uint64_t pid;
    uint64_t instance_id;
} endpoint_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static ferry_transport_t *g_instances[MAX_INSTANCES];
static uint64_t g_next_id = 1;

static int fail(ferry_error_t *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* Fields of the host table are read only when its struct_size covers them; the level may change
 * while we run (the host sets it from another thread), hence the atomic load. */
static void log_line(ferry_transport_t *t, int level, const char *message) {
    const ferry_host_api_t *h = t->host;
    if (!h || h->struct_size < FERRY_HOST_API_SIZE_UNTIL(log_level) || !h->log) return;
    if (level <= __atomic_load_n(&h->log_level, __ATOMIC_RELAXED)) h->log(h->ctx, level, "example", message);
}

/* The options this transport accepts, published in ferry_plugin_v1 (plugin ABI 1.2) so that
 * `ferry-info --options example` lists them with default, range and help. create() parses
 * against the same table, so the documentation cannot drift from the parser. */
static const ferry_option_desc_t example_options[] = {
    {.name = "max_regions",
     .type = FERRY_OPTION_UINT,
     .default_text = "256",
     .min = 1,
     .max = MAX_REGIONS,
     .help = "regions one instance may have registered at once"},
};
#define N_OPTIONS (sizeof example_options / sizeof example_options[0])

/* Unknown keys and bad values fail with -EINVAL and a message naming the key and what is accepted. */
static int parse_options(const ferry_kv_t *options, size_t n, ferry_transport_t *t, ferry_error_t *err) {
    t->max_regions = MAX_REGIONS;
    for (size_t i = 0; i < n; ++i) {
        const char *key = options[i].key ? options[i].key : "(null)", *value = options[i].value;
        const ferry_option_desc_t *d = NULL;
        for (size_t k = 0; k < N_OPTIONS; ++k)
            if (strcmp(key, example_options[k].name) == 0) d = &example_options[k];
        if (!d)
            return fail(err, -EINVAL,
                        "example: unknown option '%.64s'; known: max_regions (ferry-info --options example)", key);
        char *end = NULL;
        errno = 0;
        unsigned long long v = value && *value >= '0' && *value <= '9' ? strtoull(value, &end, 10) : 0;
        if (!end || *end != '\0' || errno || v < d->min || v > d->max)
            return fail(err, -EINVAL,
                        "example: invalid value '%.40s%s' for option '%s': expected an integer from %" PRIu64
                        " to %" PRIu64 " (default %s)", /* a long value is cut: the key must fit */
                        value ? value : "(null)", value && strlen(value) > 40 ? "..." : "", d->name, d->min, d->max,
                        d->default_text);
        t->max_regions = v; /* the table's only option */
    }
    return 0;
}

static int example_probe(const ferry_kv_t *options, size_t n, ferry_probe_result_t *result) {
    (void)options;
    (void)n;
    result->available = 1;
    snprintf(result->reason, sizeof result->reason, "in-process memcpy transport (example for plugin authors)");
    return 0;
}

static int example_create(const ferry_kv_t *options, size_t n, const ferry_host_api_t *host, ferry_transport_t **out,
                          ferry_error_t *err) {
    ferry_transport_t *t = calloc(1, sizeof *t);
    if (!t) return fail(err, -ENOMEM, "out of memory");
    int rc = parse_options(options, n, t, err);
    if (rc) {
        free(t);
        return rc;
    }
    t->host = host;
    pthread_mutex_init(&t->lock, NULL);
    t->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (t->event_fd < 0) {
        int e = errno;
        free(t);
        return fail(err, -e, "eventfd: %s", strerror(e));
    }
    pthread_mutex_lock(&g_lock);
    int slot = -1;
    for (int i = 0; i < MAX_INSTANCES; ++i)
        if (!g_instances[i]) {
            slot = i;
            break;
        }
    if (slot >= 0) {
        t->id = g_next_id++;
        g_instances[slot] = t;
    }
    pthread_mutex_unlock(&g_lock);
    if (slot < 0) {
        close(t->event_fd);
        free(t);
        return fail(err, -EMFILE, "more than %d example instances in one process", MAX_INSTANCES);
    }
    *out = t;
    return 0;
}

static void example_destroy(ferry_transport_t *t) {
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < MAX_INSTANCES; ++i)
        if (g_instances[i] == t) g_instances[i] = NULL;
    pthread_mutex_unlock(&g_lock);
    close(t->event_fd);
    free(t->done);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

static int export_bytes(const void *src, size_t size, void *buf, size_t *len, ferry_error_t *err) {
    if (*len < size) {
        *len = size;
        return fail(err, -ENOSPC, "need %zu bytes", size);
    }
    memcpy(buf, src, size);
    *len = size;
    return 0;
}

static int example_export_endpoint(ferry_transport_t *t, void *buf, size_t *len, ferry_error_t *err) {
    endpoint_t ep = {(uint64_t)getpid(), t->id};
    return export_bytes(&ep, sizeof ep, buf, len, err);
}

static int example_register(ferry_transport_t *t, const ferry_mem_region_t *r, uint64_t *handle, ferry_error_t *err) {
    if (r->kind != FERRY_MEM_HOST) return fail(err, -ENOTSUP, "only host memory");
    pthread_mutex_lock(&t->lock);
    for (uint64_t i = 0; i < t->max_regions; ++i) {
        if (t->regions[i].used) continue;
        t->regions[i].r = *r;
        t->regions[i].used = 1;
        pthread_mutex_unlock(&t->lock);
        *handle = i;
        return 0;
    }
    pthread_mutex_unlock(&t->lock);
    return fail(err, -ENOSPC, "more than %" PRIu64 " regions registered (option max_regions)", t->max_regions);
}

static int example_deregister(ferry_transport_t *t, uint64_t handle, ferry_error_t *err) {
    if (handle >= MAX_REGIONS) return fail(err, -ENOENT, "no region with handle %" PRIu64, handle);
    /* `used` is read under the lock too: two deregisters of one handle, or one racing a register
     * that reuses the slot, must see each other. Copies hold this lock, so none is running once
     * we have it. */
    pthread_mutex_lock(&t->lock);
    int was_used = t->regions[handle].used;
    t->regions[handle].used = 0;
    pthread_mutex_unlock(&t->lock);
    if (!was_used) return fail(err, -ENOENT, "no region with handle %" PRIu64, handle);
    return 0;
}

static int example_export_mem(ferry_transport_t *t, uint64_t handle, void *buf, size_t *len, ferry_error_t *err) {
    (void)t;
    (void)handle;
    (void)buf;
    (void)err;
    *len = 0; /* nothing beyond the address: the target checks ranges itself */
    return 0;
}

static int instance_exists(uint64_t id) { /* under g_lock */
    for (int i = 0; i < MAX_INSTANCES; ++i)
        if (g_instances[i] && g_instances[i]->id == id) return 1;
    return 0;
}

static int example_connect(ferry_transport_t *t, const void *endpoint, size_t len, uint64_t *peer, ferry_error_t *err) {
    (void)t;
    endpoint_t ep;
    if (len != sizeof ep) return fail(err, -EPROTO, "endpoint is %zu bytes, expected %zu", len, sizeof ep);
    memcpy(&ep, endpoint, sizeof ep);
    if (ep.pid != (uint64_t)getpid())
        return fail(err, -EHOSTUNREACH,
                    "peer is process %" PRIu64 "; the example transport reaches only its own process", ep.pid);
    pthread_mutex_lock(&g_lock);
    int exists = instance_exists(ep.instance_id);
    pthread_mutex_unlock(&g_lock);
    if (!exists)
        return fail(err, -ECONNREFUSED, "peer instance %" PRIu64 " does not exist (destroyed?)", ep.instance_id);
    *peer = ep.instance_id;
    return 0;
}

static int example_disconnect(ferry_transport_t *t, uint64_t peer, ferry_error_t *err) {
    (void)t;
    (void)peer;
    (void)err;
    return 0; /* copies finish inside submit, so nothing is ever in flight */
}

static int example_import(ferry_transport_t *t, uint64_t peer, const ferry_mem_region_t *region, const void *desc,
                          size_t len, uint64_t *remote_mem, ferry_error_t *err) {
    (void)t;
    (void)peer;
    (void)desc;
    (void)len;
    (void)err;
    *remote_mem = region->addr;
    return 0;
}

static int example_release(ferry_transport_t *t, uint64_t peer, uint64_t remote_mem, ferry_error_t *err) {
    (void)t;
    (void)peer;
    (void)remote_mem;
    (void)err;
    return 0;
}

/* The serving side's check: the whole range inside one region with the needed right. */
static int target_allows(ferry_transport_t *target, uint64_t addr, uint64_t length, uint32_t need) {
    for (int i = 0; i < MAX_REGIONS; ++i) {
        const region_t *g = &target->regions[i];
        if (g->used && addr >= g->r.addr && length <= g->r.length && addr - g->r.addr <= g->r.length - length)
            return (g->r.access & need) ? 0 : -EACCES;
    }
    return -EFAULT;
}

/* The initiator's check, before anything starts: the local range inside the registered region
 * the op names (under t->lock). */
static int local_ok(const ferry_transport_t *t, const ferry_xfer_op_t *op) {
    if (op->local_mem >= MAX_REGIONS || !t->regions[op->local_mem].used) return 0;
    const ferry_mem_region_t *r = &t->regions[op->local_mem].r;
    return op->local_addr >= r->addr && op->length <= r->length && op->local_addr - r->addr <= r->length - op->length;
}

static int push_completion(ferry_transport_t *t, uint64_t user_data, int status, const char *message) {
    if (t->done_len == t->done_cap) {
        size_t cap = t->done_cap ? t->done_cap * 2 : 64;
        ferry_completion_t *grown = realloc(t->done, cap * sizeof *grown);
        if (!grown) return -ENOMEM;
        t->done = grown;
        t->done_cap = cap;
    }
    ferry_completion_t *c = &t->done[t->done_len++];
    memset(c, 0, sizeof *c);
    c->user_data = user_data;
    c->status = status;
    if (message) snprintf(c->message, sizeof c->message, "%s", message);
    return 0;
}

static int example_submit(ferry_transport_t *t, uint64_t peer, const ferry_xfer_op_t *ops, size_t n,
                          ferry_error_t *err) {
    pthread_mutex_lock(&g_lock); /* keeps the target alive while we copy */
    ferry_transport_t *target = NULL;
    for (int i = 0; i < MAX_INSTANCES; ++i)
        if (g_instances[i] && g_instances[i]->id == peer) target = g_instances[i];
    if (!target) {
        pthread_mutex_unlock(&g_lock);
        return fail(err, -ECONNRESET, "peer instance %" PRIu64 " no longer exists", peer);
    }
    pthread_mutex_lock(&t->lock);
    for (size_t i = 0; i < n; ++i) { /* check every op first: submit is all-or-nothing */
        if (ops[i].opcode != FERRY_OP_READ && ops[i].opcode != FERRY_OP_WRITE) {
            pthread_mutex_unlock(&t->lock);
            pthread_mutex_unlock(&g_lock);
            return fail(err, -EINVAL, "op %zu: opcode %u is neither READ nor WRITE", i, (unsigned)ops[i].opcode);
        }
        if (!local_ok(t, &ops[i])) {
            pthread_mutex_unlock(&t->lock);
            pthread_mutex_unlock(&g_lock);
            return fail(err, -EINVAL,
                        "op %zu: local [0x%" PRIx64 ", +%" PRIu64 ") is not inside the region with handle %" PRIu64, i,
                        ops[i].local_addr, ops[i].length, ops[i].local_mem);
        }
    }
    if (t->done_cap - t->done_len < n) { /* reserve too: no op may start unless all can complete */
        size_t cap = t->done_len + n;
        ferry_completion_t *grown = realloc(t->done, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&t->lock);
            pthread_mutex_unlock(&g_lock);
            return fail(err, -ENOMEM, "out of memory for %zu completions", n);
        }
        t->done = grown;
        t->done_cap = cap;
    }
    if (target != t) pthread_mutex_lock(&target->lock);
    int was_empty = t->done_len == 0;
    for (size_t i = 0; i < n; ++i) {
        const ferry_xfer_op_t *op = &ops[i];
        uint32_t need = op->opcode == FERRY_OP_READ ? FERRY_ACCESS_REMOTE_READ : FERRY_ACCESS_REMOTE_WRITE;
        int rc = target_allows(target, op->remote_addr, op->length, need);
        char message[FERRY_MESSAGE_MAX] = "";
        if (rc == 0) {
            if (op->opcode == FERRY_OP_READ)
                memcpy((void *)(uintptr_t)op->local_addr, (const void *)(uintptr_t)op->remote_addr, op->length);
            else memcpy((void *)(uintptr_t)op->remote_addr, (const void *)(uintptr_t)op->local_addr, op->length);
        } else {
            snprintf(message, sizeof message, "peer refused [0x%" PRIx64 ", +%" PRIu64 "): %s", op->remote_addr,
                     op->length, rc == -EACCES ? "region lacks that access right" : "not inside a registered region");
        }
        push_completion(t, op->user_data, rc, rc ? message : NULL);
    }
    if (target != t) pthread_mutex_unlock(&target->lock);
    /* The eventfd changes under the same lock as the queue, so it is readable exactly while
     * completions wait (a poll between our unlock and a late write would leave it readable). */
    if (was_empty) {
        uint64_t one = 1;
        if (write(t->event_fd, &one, sizeof one) < 0) log_line(t, FERRY_LOG_WARN, "eventfd write failed");
    }
    pthread_mutex_unlock(&t->lock);
    pthread_mutex_unlock(&g_lock);
    return 0;
}

static int example_poll(ferry_transport_t *t, ferry_completion_t *out, size_t max, ferry_error_t *err) {
    (void)err;
    pthread_mutex_lock(&t->lock);
    size_t n = t->done_len < max ? t->done_len : max;
    if (n > 0) { /* t->done is NULL until the first completion: memcpy from NULL is undefined */
        memcpy(out, t->done, n * sizeof *out);
        memmove(t->done, t->done + n, (t->done_len - n) * sizeof *out);
        t->done_len -= n;
        if (t->done_len == 0) { /* empty now: clear the eventfd (submit set it when it filled) */
            uint64_t v;
            if (read(t->event_fd, &v, sizeof v) < 0 && errno != EAGAIN)
                log_line(t, FERRY_LOG_WARN, "eventfd read failed");
        }
    }
    pthread_mutex_unlock(&t->lock);
    return (int)n;
}

static int example_completion_fd(ferry_transport_t *t, int *fd, ferry_error_t *err) {
    (void)err;
    *fd = t->event_fd;
    return 0;
}

FERRY_PLUGIN_EXPORT const ferry_plugin_v1_t ferry_plugin_v1 = {
    .abi_version = FERRY_PLUGIN_ABI_VERSION,
    .struct_size = sizeof(ferry_plugin_v1_t),
    .name = "example",
    .version = "1.0.0",
    .caps = FERRY_CAP_MEM_HOST | FERRY_CAP_INTRA_NODE,
    .probe = example_probe,
    .create = example_create,
    .destroy = example_destroy,
    .export_endpoint = example_export_endpoint,
    .register_mem = example_register,
    .deregister_mem = example_deregister,
    .export_mem = example_export_mem,
    .connect = example_connect,
    .disconnect = example_disconnect,
    .import_mem = example_import,
    .release_mem = example_release,
    .submit = example_submit,
    .poll = example_poll,
    .completion_fd = example_completion_fd,
    .options = example_options,
    .n_options = N_OPTIONS,
    .option_desc_size = sizeof(ferry_option_desc_t),
};
