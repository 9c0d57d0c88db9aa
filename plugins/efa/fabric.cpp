#include "fabric.hpp"

#include "plugin_util.hpp"

#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>

#include "fabric_api.hpp"

#include <cerrno>
#include <cstring>

namespace ferry_efa {

namespace {

constexpr uint32_t kApiVersion = FI_VERSION(1, 9);

fi_info *make_hints(const Config &cfg, bool hmem, bool thread_safe) {
    fi_info *h = fabric::dupinfo(nullptr);  // fi_allocinfo()
    if (h == nullptr) return nullptr;
    h->ep_attr->type = FI_EP_RDM;
    h->caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | (hmem ? FI_HMEM : 0);
    h->mode = FI_CONTEXT | FI_CONTEXT2;
    // Every mode we can follow; the provider returns the subset it needs, and that is what the
    // rest of the plugin obeys.
    h->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT | (hmem ? FI_MR_HMEM : 0);
    h->domain_attr->threading = thread_safe ? FI_THREAD_SAFE : FI_THREAD_DOMAIN;
    h->fabric_attr->prov_name = strdup(cfg.provider.c_str());
    return h;
}

std::string mr_mode_string(int m) {
    std::string s;
    const std::pair<int, const char *> bits[] = {{FI_MR_LOCAL, "local"},
                                                 {FI_MR_VIRT_ADDR, "virt_addr"},
                                                 {FI_MR_ALLOCATED, "allocated"},
                                                 {FI_MR_PROV_KEY, "prov_key"},
                                                 {FI_MR_ENDPOINT, "endpoint"},
                                                 {FI_MR_HMEM, "hmem"},
                                                 {FI_MR_RAW, "raw"}};
    for (auto [bit, name] : bits)
        if (m & bit) {
            if (!s.empty()) s += '|';
            s += name;
        }
    return s.empty() ? "0 (offsets, application keys)" : s;
}

}  // namespace

int get_info(const Config &cfg, fi_info **out, std::string *why) {
    if (!fabric::load(why)) return -FI_ENODATA;
    int last = -FI_ENODATA;
    for (bool hmem : {true, false})
        for (bool safe : {true, false}) {
            fi_info *hints = make_hints(cfg, hmem, safe);
            if (hints == nullptr) return -FI_ENOMEM;
            fi_info *info = nullptr;
            const char *node = cfg.node.empty() ? nullptr : cfg.node.c_str();
            int rc = fabric::getinfo(kApiVersion, node, nullptr, node ? FI_SOURCE : 0, hints, &info);
            fabric::freeinfo(hints);
            if (rc == 0 && info != nullptr) {
                if (info->domain_attr->mr_mode & FI_MR_RAW) {
                    fabric::freeinfo(info);
                    *why = "provider " + cfg.provider + " needs raw (FI_MR_RAW) keys, which efa.so does not handle";
                    return -FI_ENOSYS;
                }
                *out = info;
                return 0;
            }
            last = rc;
        }
    *why = strprintf("libfabric has no usable '%s' provider for RDM endpoints with RMA%s: fi_getinfo: %s%s",
                     cfg.provider.c_str(), cfg.node.empty() ? "" : (" on " + cfg.node).c_str(),
                     fi_error_string(last).c_str(),
                     cfg.provider == "efa" ? " (no EFA device? efa.provider or FERRY_EFA_PROVIDER picks another, "
                                             "e.g. tcp)"
                                           : "");
    return last;
}

std::string describe(const fi_info *info) {
    return strprintf("provider %s %u.%u, fabric %s, domain %s, mr_mode %s, %zu-byte keys, %s%s",
                     info->fabric_attr->prov_name, FI_MAJOR(info->fabric_attr->prov_version),
                     FI_MINOR(info->fabric_attr->prov_version), info->fabric_attr->name, info->domain_attr->name,
                     mr_mode_string(info->domain_attr->mr_mode).c_str(), info->domain_attr->mr_key_size,
                     (info->caps & FI_HMEM) ? "FI_HMEM (device memory)" : "host memory only",
                     info->domain_attr->data_progress == FI_PROGRESS_MANUAL ? ", manual progress" : "");
}

Fabric::~Fabric() {
    if (ep) fi_close(&ep->fid);
    if (av) fi_close(&av->fid);
    if (cq) fi_close(&cq->fid);
    if (domain) fi_close(&domain->fid);
    if (fabric) fi_close(&fabric->fid);
    if (info) fabric::freeinfo(info);
}

int Fabric::open(const Config &cfg, std::string *why) {
    int rc = get_info(cfg, &info, why);
    if (rc != 0) return rc < 0 ? rc : -rc;
    mr_mode = info->domain_attr->mr_mode;
    mr_key_size = info->domain_attr->mr_key_size ? info->domain_attr->mr_key_size : 8;
    max_msg_size = info->ep_attr->max_msg_size ? info->ep_attr->max_msg_size : (1ull << 30);
    hmem = (info->caps & FI_HMEM) != 0;
    thread_safe = info->domain_attr->threading == FI_THREAD_SAFE;
    auto fail = [&](const char *call, int r) {
        *why = strprintf("%s (%s): %s", call, info->fabric_attr->prov_name, fi_error_string(r).c_str());
        return r < 0 ? r : -r;
    };
    if ((rc = fabric::open_fabric(info->fabric_attr, &fabric, nullptr))) return fail("fi_fabric", rc);
    if ((rc = fi_domain(fabric, info, &domain, nullptr))) return fail("fi_domain", rc);
    fi_av_attr av_attr{};
    av_attr.type = info->domain_attr->av_type != FI_AV_UNSPEC ? info->domain_attr->av_type : FI_AV_TABLE;
    if ((rc = fi_av_open(domain, &av_attr, &av, nullptr))) return fail("fi_av_open", rc);
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_MSG;
    cq_attr.wait_obj = FI_WAIT_FD;
    if (fi_cq_open(domain, &cq_attr, &cq, nullptr) == 0) {
        if (fi_control(&cq->fid, FI_GETWAIT, &wait_fd) != 0) wait_fd = -1;
    } else {
        cq_attr.wait_obj = FI_WAIT_NONE;
        if ((rc = fi_cq_open(domain, &cq_attr, &cq, nullptr))) return fail("fi_cq_open", rc);
    }
    if ((rc = fi_endpoint(domain, info, &ep, nullptr))) return fail("fi_endpoint", rc);
    if ((rc = fi_ep_bind(ep, &av->fid, 0))) return fail("fi_ep_bind(av)", rc);
    if ((rc = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV))) return fail("fi_ep_bind(cq)", rc);
    if ((rc = fi_enable(ep))) return fail("fi_enable", rc);
    size_t len = 0;
    fi_getname(&ep->fid, nullptr, &len);
    name.resize(len ? len : 64);
    len = name.size();
    if ((rc = fi_getname(&ep->fid, name.data(), &len))) return fail("fi_getname", rc);
    name.resize(len);
    name_str = addr_string(name.data());
    return 0;
}

std::string Fabric::addr_string(const void *addr) const {
    char buf[256];
    size_t len = sizeof buf;
    if (av == nullptr || fi_av_straddr(av, addr, buf, &len) == nullptr) return "?";
    buf[sizeof buf - 1] = '\0';
    return buf;
}

}  // namespace ferry_efa
