// libfabric objects of one efa.so instance: fabric, domain, address vector, one completion
// queue and one RDM endpoint, opened from fi_getinfo for the configured provider. Also the
// provider facts the rest of the plugin follows (mr_mode bits as RETURNED, key size, HMEM).
#pragma once

#include "options.hpp"

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <mutex>
#include <string>
#include <vector>

namespace ferry_efa {

// fi_getinfo for an RDM endpoint with RMA and messages on cfg.provider. Tries with FI_HMEM and
// FI_THREAD_SAFE first, then without. On failure returns the libfabric code and sets *why.
int get_info(const Config &cfg, fi_info **out, std::string *why);

// One-line description of an fi_info for logs and ferry-info.
std::string describe(const fi_info *info);

class Fabric {
public:
    Fabric() = default;
    ~Fabric();
    Fabric(const Fabric &) = delete;
    Fabric &operator=(const Fabric &) = delete;

    // Opens everything; on failure returns a negative errno and a message in *why.
    int open(const Config &cfg, std::string *why);

    fi_info *info = nullptr;
    fid_fabric *fabric = nullptr;
    fid_domain *domain = nullptr;
    fid_av *av = nullptr;
    fid_cq *cq = nullptr;
    fid_ep *ep = nullptr;
    int wait_fd = -1;  // the CQ's wait object, -1 when the provider has none

    int mr_mode = 0;            // as the provider returned it
    size_t mr_key_size = 8;     // bytes of a remote key
    size_t max_msg_size = 0;    // largest single RMA
    bool hmem = false;          // the provider registers device memory (FI_HMEM)
    bool thread_safe = false;   // FI_THREAD_SAFE: otherwise every call is serialized
    std::vector<uint8_t> name;  // fi_getname: our address, published in the endpoint bytes
    std::string name_str;       // printable form of name

    // Serializes libfabric calls when the provider is not FI_THREAD_SAFE.
    std::unique_lock<std::mutex> lock() {
        return thread_safe ? std::unique_lock<std::mutex>() : std::unique_lock<std::mutex>(mu_);
    }
    // Printable address (fi_av_straddr) of raw address bytes.
    std::string addr_string(const void *addr) const;

private:
    std::mutex mu_;
};

}  // namespace ferry_efa
