// The YAML configuration (core/engine/config.cpp: parse_yaml_config, then parse_engine_settings), as
// Engine::create_from_file reads it once load_yaml_config has checked and read the file (the
// file's checks are tests/plugin_trust_test.cpp's). Invariants: no exception escapes (the C++
// API promises none), a refusal carries a code and a message, and settings are only accepted
// when every key is one the engine knows (an empty key is not).
#include <cerrno>
#include <string>
#include <string_view>

#include "engine/config.hpp"
#include "fuzz_check.hpp"
#include "util/log.hpp"

using namespace ferry;

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    log::set_level(log::Level::Error);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    auto config = parse_yaml_config(std::string_view(reinterpret_cast<const char *>(data), size), "fuzz input");
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
