// The YAML configuration (core/config.cpp: load_yaml_config, then parse_engine_settings), as
// Engine::create_from_file reads it. The input is written to a memfd and loaded through its
// /proc/self/fd path, so the real file loader runs without touching the disk. Invariants: no
// exception escapes (the C++ API promises none), a refusal carries a code and a message, and
// settings are only accepted when every key is one the engine knows (an empty key is not).
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "config.hpp"
#include "fuzz_check.hpp"
#include "log.hpp"

using namespace ferry;

namespace {
int g_fd = -1;
std::string g_path;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    log::set_level(log::Level::Error);
    g_fd = memfd_create("ferry-config-fuzz", MFD_CLOEXEC);
    FUZZ_CHECK(g_fd >= 0, "memfd_create");
    g_path = "/proc/self/fd/" + std::to_string(g_fd);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FUZZ_CHECK(ftruncate(g_fd, 0) == 0, "ftruncate");
    for (size_t done = 0; done < size;) {
        ssize_t n = pwrite(g_fd, data + done, size - done, static_cast<off_t>(done));
        FUZZ_CHECK(n > 0, "pwrite");
        done += static_cast<size_t>(n);
    }
    auto config = load_yaml_config(g_path);
    if (!config) {
        FUZZ_CHECK(config.error().code < 0 && !config.error().message.empty(), "refusal without code or message");
        return 0;
    }
    bool empty_key = config->count("") > 0;
    auto settings = parse_engine_settings(*config);
    FUZZ_CHECK(!empty_key || !settings, "an empty key was accepted");
    if (!settings)
        FUZZ_CHECK(settings.error().code < 0 && !settings.error().message.empty(), "refusal without code or message");
    else FUZZ_CHECK(!settings->protocols.empty(), "accepted settings without a transport priority");
    return 0;
}
