#include "fabric_api.hpp"

#include <dlfcn.h>

#include <cstring>

#include <mutex>

namespace ferry_efa::fabric {

#ifdef FERRY_EFA_LINKED_FABRIC

bool load(std::string *) { return true; }
int getinfo(uint32_t v, const char *n, const char *s, uint64_t f, const fi_info *h, fi_info **i) {
    return fi_getinfo(v, n, s, f, h, i);
}
void freeinfo(fi_info *info) { fi_freeinfo(info); }
fi_info *dupinfo(const fi_info *info) { return fi_dupinfo(info); }
int open_fabric(fi_fabric_attr *attr, fid_fabric **fabric, void *context) { return fi_fabric(attr, fabric, context); }
const char *strerror(int code) { return fi_strerror(code); }
uint32_t version() { return fi_version(); }

#else

namespace {

struct Api {
    decltype(&::fi_getinfo) getinfo = nullptr;
    decltype(&::fi_freeinfo) freeinfo = nullptr;
    decltype(&::fi_dupinfo) dupinfo = nullptr;
    decltype(&::fi_fabric) fabric = nullptr;
    decltype(&::fi_strerror) strerror = nullptr;
    decltype(&::fi_version) version = nullptr;
    bool ok = false;
    std::string failure;
};

Api &api() {
    static Api a;
    return a;
}

std::once_flag once;

template <class F>
bool bind(void *lib, const char *name, const char *version, F &out, std::string &failure) {
    out = reinterpret_cast<F>(dlvsym(lib, name, version));
    if (out == nullptr)
        failure = std::string(FERRY_EFA_FABRIC_SONAME " has no ") + name + "@" + version +
                  " (efa.so was built against another libfabric: rebuild it against this one)";
    return out != nullptr;
}

}  // namespace

bool load(std::string *why) {
    std::call_once(once, [] {
        Api &a = api();
        // Never closed: libfabric is not made to be initialised twice in a process (meson.build).
        void *lib = dlopen(FERRY_EFA_FABRIC_SONAME, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        if (lib == nullptr) {
            const char *e = dlerror();
            a.failure = std::string("cannot load libfabric: ") + (e ? e : FERRY_EFA_FABRIC_SONAME);
            return;
        }
        a.ok = bind(lib, "fi_getinfo", FERRY_EFA_V_fi_getinfo, a.getinfo, a.failure) &&
               bind(lib, "fi_freeinfo", FERRY_EFA_V_fi_freeinfo, a.freeinfo, a.failure) &&
               bind(lib, "fi_dupinfo", FERRY_EFA_V_fi_dupinfo, a.dupinfo, a.failure) &&
               bind(lib, "fi_fabric", FERRY_EFA_V_fi_fabric, a.fabric, a.failure) &&
               bind(lib, "fi_strerror", FERRY_EFA_V_fi_strerror, a.strerror, a.failure) &&
               bind(lib, "fi_version", FERRY_EFA_V_fi_version, a.version, a.failure);
    });
    if (!api().ok && why != nullptr) *why = api().failure;
    return api().ok;
}

int getinfo(uint32_t v, const char *n, const char *s, uint64_t f, const fi_info *h, fi_info **i) {
    return api().getinfo(v, n, s, f, h, i);
}
void freeinfo(fi_info *info) { api().freeinfo(info); }
fi_info *dupinfo(const fi_info *info) { return api().dupinfo(info); }
int open_fabric(fi_fabric_attr *attr, fid_fabric **fabric, void *context) {
    return api().fabric(attr, fabric, context);
}
const char *strerror(int code) { return api().strerror(code); }
uint32_t version() { return api().version(); }

#endif

}  // namespace ferry_efa::fabric

std::string ferry_efa::fi_error_string(int code) {
    code = code < 0 ? -code : code;
    return fabric::load(nullptr) ? fabric::strerror(code) : std::strerror(code);
}
