// rdma.so against the transport conformance suite tcp.so, shm.so and efa.so pass
// (tests/transport/conformance_test.cpp), end to end over a real RDMA NIC. It switches itself on
// when rdma.so's probe finds a usable device; otherwise nothing runs, the output says why
// ("SKIPPED: no RDMA device (<probe reason>)") and the binary exits 77, meson's SKIP. This file
// is also the binary's main, because the child peers re-execute it with --ferry-transport-peer.
#include "conformance.hpp"

#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ferry_test {
namespace {

std::string rdma_path() {
    const char *e = std::getenv("FERRY_TEST_RDMA_PLUGIN");
    return e != nullptr && *e != '\0' ? e : FERRY_TEST_RDMA_PLUGIN;
}

// Options for every instance: $FERRY_TEST_RDMA_OPTIONS ("devices=mlx5_0,gid_index=3") picks
// NICs on multi-NIC test hosts; the control server stays on 127.0.0.1.
Options env_options() {
    Options o;
    const char *e = std::getenv("FERRY_TEST_RDMA_OPTIONS");
    if (e == nullptr) return o;
    std::string s = e;
    size_t start = 0;
    while (start < s.size()) {
        size_t end = s.find(';', start);
        if (end == std::string::npos) end = s.size();
        std::string kv = s.substr(start, end - start);
        if (size_t eq = kv.find('='); eq != std::string::npos) o.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
        start = end + 1;
    }
    return o;
}

std::string param_name(const ::testing::TestParamInfo<TransportParam> &info) {
    std::string n = info.param.name + "_" + std::to_string(info.index);
    for (char &c : n)
        if (!isalnum(static_cast<unsigned char>(c))) c = '_';
    return n;
}

std::vector<TransportParam> rdma_params() {
    TransportParam base;
    base.name = "rdma";
    base.path = rdma_path();
    base.options = env_options();
    base.bad_option = {{"max_wr", "zero"}};
    base.peer_in_messages = "127.0.0.1:";  // messages name the peer's control address
    base.refuse_range_code = -EFAULT;      // refused by the initiator from the descriptor
    base.refuse_access_code = -EACCES;
    // Registrations split at 1 MiB and small work requests: ops cross MRs on both sides.
    TransportParam split = base;
    split.options.emplace_back("max_mr_size", "1m");
    split.options.emplace_back("max_wr_size", "64k");
    split.options.emplace_back("signal_interval", "4");
    split.slice = 1 << 20;
    TransportParam defaults = base;
    defaults.slice = 4 << 20;
    return {split, defaults};
}

}  // namespace

// rdma.so's probe on this host: 1 usable, 0 not (reason printed), -1 the plugin did not load.
int rdma_device_gate() {
    void *h = dlopen(rdma_path().c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
        fprintf(stderr, "cannot load rdma.so: %s\n", dlerror());
        return -1;
    }
    auto *api = static_cast<const ferry_plugin_v1_t *>(dlsym(h, FERRY_PLUGIN_SYMBOL_V1));
    if (api == nullptr) {
        fprintf(stderr, "rdma.so exports no %s\n", FERRY_PLUGIN_SYMBOL_V1);
        return -1;
    }
    Options o = env_options();
    std::vector<ferry_kv_t> kv;
    for (auto &[k, v] : o) kv.push_back({k.c_str(), v.c_str()});
    ferry_probe_result_t r{};
    if (api->probe(kv.data(), kv.size(), &r) != 0) {
        fprintf(stderr, "rdma.so probe failed: %s\n", r.reason);
        return -1;
    }
    printf(r.available ? "rdma.so end-to-end on: %s\n" : "SKIPPED: no RDMA device (%s)\n", r.reason);
    fflush(stdout);
    return r.available ? 1 : 0;
}

INSTANTIATE_TEST_SUITE_P(Rdma, TransportConformance, ::testing::ValuesIn(rdma_params()), param_name);

}  // namespace ferry_test

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], ferry_test::kPeerFlag) == 0) return ferry_test::peer_main(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    ::testing::InitGoogleTest(&argc, argv);
    // Without a usable device every test would fail at create(): report the whole binary as
    // skipped (exit 77, meson's SKIP) with the probe's reason printed above.
    switch (ferry_test::rdma_device_gate()) {
        case 0: return 77;
        case -1: return 1;
        default: return RUN_ALL_TESTS();
    }
}
