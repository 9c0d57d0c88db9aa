// Transports the conformance suite runs against. To add one, build its .so, pass its path
// from meson (-DFERRY_TEST_<NAME>_PLUGIN="...") and add an INSTANTIATE_TEST_SUITE_P below.
// FERRY_TEST_<NAME>_PLUGIN in the environment overrides the built-in path.
#include "conformance.hpp"

#include <cerrno>
#include <cstdlib>

namespace ferry_test {

namespace {

std::string plugin_path(const char *env, const char *built) {
    const char *e = std::getenv(env);
    return e != nullptr && *e != '\0' ? e : built;
}

std::string param_name(const ::testing::TestParamInfo<TransportParam> &info) {
    std::string n = info.param.name + "_" + std::to_string(info.index);
    for (char &c : n)
        if (!isalnum(static_cast<unsigned char>(c))) c = '_';
    return n;
}

#ifdef FERRY_TEST_TCP_PLUGIN
// tcp endpoint bytes: "FRTE", version, family, reserved, port (LE, bytes 8-9), address.
Options tcp_same_endpoint(const std::vector<uint8_t> &ep) {
    if (ep.size() < 10) return {};
    unsigned port = ep[8] | (ep[9] << 8);
    return {{"port", std::to_string(port)}};
}

std::vector<TransportParam> tcp_params() {
    const std::string so = plugin_path("FERRY_TEST_TCP_PLUGIN", FERRY_TEST_TCP_PLUGIN);
    TransportParam base;
    base.name = "tcp";
    base.path = so;
    base.bad_option = {{"lanes", "zero"}};
    base.same_endpoint_options = tcp_same_endpoint;
    base.peer_in_messages = "127.0.0.1:";
    base.refuse_range_code = -EFAULT;
    base.refuse_access_code = -EACCES;
    // Small slices and three lanes on two I/O threads: every multi-slice path is exercised.
    TransportParam sliced = base;
    sliced.options = {{"lanes", "3"}, {"io_threads", "2"}, {"slice_size", "64k"}};
    sliced.slice = 64 * 1024;
    // Defaults (default lanes, I/O threads and slice size; payloads copied at send time).
    TransportParam defaults = base;
    defaults.slice = 1 << 20;
    // One lane, large payloads spliced by reference.
    TransportParam splicing = base;
    splicing.options = {{"lanes", "1"}, {"zerocopy", "1"}};
    splicing.slice = 1 << 20;
    return {sliced, defaults, splicing};
}
#endif

#ifdef FERRY_TEST_EXAMPLE_PLUGIN
// plugins/example/example.c, the template for plugin authors: same-process memcpy, no options.
std::vector<TransportParam> example_params() {
    TransportParam p;
    p.name = "example";
    p.path = plugin_path("FERRY_TEST_EXAMPLE_PLUGIN", FERRY_TEST_EXAMPLE_PLUGIN);
    p.bad_option = {{"lanes", "zero"}};  // unknown to it: refused naming the key
    p.refuse_range_code = -EFAULT;
    p.refuse_access_code = -EACCES;
    p.same_process_only = true;
    return {p};
}
#endif

}  // namespace

#ifdef FERRY_TEST_EXAMPLE_PLUGIN
INSTANTIATE_TEST_SUITE_P(Example, TransportConformance, ::testing::ValuesIn(example_params()), param_name);
#endif

#ifdef FERRY_TEST_TCP_PLUGIN
INSTANTIATE_TEST_SUITE_P(Tcp, TransportConformance, ::testing::ValuesIn(tcp_params()), param_name);
#endif

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TransportConformance);

}  // namespace ferry_test
