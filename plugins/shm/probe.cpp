// shm.so's probe: can this process use cross-memory attach at all? It checks what the kernel
// decides before any peer is involved (seccomp filters, Yama's ptrace scope, capabilities);
// whether a given peer may be accessed is checked per connection (connect()).
#include "transport.hpp"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace ferry_shm {

int yama_ptrace_scope() {
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
    if (f == nullptr) return -1;
    int v = -1;
    if (fscanf(f, "%d", &v) != 1) v = -1;
    fclose(f);
    return v;
}

namespace {

bool has_cap_sys_ptrace() {
    FILE *f = fopen("/proc/self/status", "re");
    if (f == nullptr) return false;
    char line[256];
    unsigned long long caps = 0;
    bool found = false;
    while (fgets(line, sizeof line, f) != nullptr)
        if (sscanf(line, "CapEff: %llx", &caps) == 1) {
            found = true;
            break;
        }
    fclose(f);
    return found && (caps & (1ull << 19));  // CAP_SYS_PTRACE
}

}  // namespace

int Transport::probe(const ferry_kv_t *options, size_t n, ferry_probe_result_t *result) {
    Config cfg;
    ferry_error_t ignored{};
    (void)parse_config(options, n, &cfg, &ignored);  // create() reports bad options
    // process_vm_readv on ourselves is always allowed by ptrace rules, so a failure here is a
    // seccomp filter (a container's default profile) or a kernel without the syscall.
    uint64_t src = 0x5eed, dst = 0;
    iovec l{&dst, sizeof dst}, r{&src, sizeof src};
    if (process_vm_readv(getpid(), &l, 1, &r, 1, 0) != static_cast<ssize_t>(sizeof dst) || dst != src) {
        int e = errno;
        result->available = 0;
        snprintf(result->reason, sizeof result->reason,
                 "process_vm_readv fails even within this process (%s): blocked by a seccomp filter (e.g. a "
                 "container's default profile) or missing from the kernel",
                 strerror(e));
        return 0;
    }
    const int scope = yama_ptrace_scope();
    const bool cap = has_cap_sys_ptrace();
    result->available = 1;
    if (scope == 3) {
        result->available = 0;
        snprintf(result->reason, sizeof result->reason,
                 "Yama ptrace_scope=3 forbids all ptrace access, which process_vm_readv/writev need");
    } else if (scope == 2 && !cap) {
        result->available = 0;
        snprintf(result->reason, sizeof result->reason,
                 "Yama ptrace_scope=2 allows process_vm_readv/writev only with CAP_SYS_PTRACE, which this process "
                 "lacks");
    } else if (scope == 1 && !cap && !cfg.ptracer_any) {
        result->available = 0;
        snprintf(result->reason, sizeof result->reason,
                 "Yama ptrace_scope=1 allows process_vm_readv/writev only towards descendants: set "
                 "shm.ptracer_any=true (same-user processes may then access this one) or kernel.yama.ptrace_scope=0");
    } else {
        snprintf(result->reason, sizeof result->reason,
                 "cross-memory attach (process_vm_readv/writev), one copy between processes of this host; %s%s",
                 scope < 0    ? "no Yama"
                 : scope == 0 ? "Yama ptrace_scope=0"
                 : scope == 1 ? "Yama ptrace_scope=1"
                              : "Yama ptrace_scope=2",
                 cap          ? ", CAP_SYS_PTRACE"
                 : scope == 1 ? ", shm.ptracer_any=true"
                              : "");
    }
    return 0;
}

}  // namespace ferry_shm
