// shm.so and efa.so instances of the conformance suite (conformance_test.cpp). Paths come from
// meson (-DFERRY_TEST_SHM_PLUGIN / -DFERRY_TEST_EFA_PLUGIN); FERRY_TEST_<NAME>_PLUGIN in the
// environment overrides them. efa.so runs over libfabric's tcp provider, bound to 127.0.0.1.
#include "conformance.hpp"

#include <cctype>
#include <cerrno>
#include <cstdlib>

namespace ferry_test {

namespace {

[[maybe_unused]] std::string plugin_path(const char *env, const char *built) {
    const char *e = std::getenv(env);
    return e != nullptr && *e != '\0' ? e : built;
}

[[maybe_unused]] std::string param_name(const ::testing::TestParamInfo<TransportParam> &info) {
    std::string n = info.param.name + "_" + std::to_string(info.index);
    for (char &c : n)
        if (!isalnum(static_cast<unsigned char>(c))) c = '_';
    return n;
}

#ifdef FERRY_TEST_SHM_PLUGIN
std::vector<TransportParam> shm_params() {
    TransportParam base;
    base.name = "shm";
    base.path = plugin_path("FERRY_TEST_SHM_PLUGIN", FERRY_TEST_SHM_PLUGIN);
    base.bad_option = {{"copy_threads", "zero"}};
    base.peer_in_messages = "pid ";  // every peer failure names the peer's pid
    base.refuse_range_code = -EFAULT;
    base.refuse_access_code = -EACCES;
    // Small pieces over three copy threads, nothing copied inline: every split path runs.
    TransportParam pieces = base;
    pieces.options = {{"copy_threads", "3"}, {"chunk_size", "64k"}, {"inline_size", "0"}};
    pieces.slice = 64 * 1024;
    TransportParam defaults = base;
    defaults.slice = 4 << 20;
    // Initiator regions moved into memfds: the serving side maps them and copies with memcpy.
    TransportParam memfd = base;
    memfd.options = {{"adopt_memfd", "true"}, {"chunk_size", "1m"}};
    memfd.slice = 1 << 20;
    return {pieces, defaults, memfd};
}
#endif

#ifdef FERRY_TEST_EFA_PLUGIN
std::vector<TransportParam> efa_params() {
    // probe() is called without options: the environment names the provider (no EFA here).
    setenv("FERRY_EFA_PROVIDER", "tcp", 0);
    TransportParam base;
    base.name = "efa";
    base.path = plugin_path("FERRY_TEST_EFA_PLUGIN", FERRY_TEST_EFA_PLUGIN);
    base.options = {{"provider", "tcp"}};
    base.bad_option = {{"op_timeout_ms", "soon"}};
    base.peer_in_messages = "127.0.0.1:";  // messages name the peer's address
    base.refuse_range_code = -EFAULT;
    base.refuse_access_code = -EACCES;
    // Registrations split at 1 MiB: ops cross MR boundaries on both sides.
    TransportParam split = base;
    split.options.emplace_back("max_mr_size", "1m");
    split.slice = 1 << 20;
    TransportParam defaults = base;
    return {split, defaults};
}
#endif

}  // namespace

#ifdef FERRY_TEST_EFA_PLUGIN
INSTANTIATE_TEST_SUITE_P(Efa, TransportConformance, ::testing::ValuesIn(efa_params()), param_name);
#endif

#ifdef FERRY_TEST_SHM_PLUGIN
INSTANTIATE_TEST_SUITE_P(Shm, TransportConformance, ::testing::ValuesIn(shm_params()), param_name);
#endif

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TransportConformance);

}  // namespace ferry_test
