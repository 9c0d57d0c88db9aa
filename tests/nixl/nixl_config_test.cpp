// The FERRY NIXL backend's configuration when a host passes no parameters (vLLM's
// NixlConnector): host parameters > environment (FERRY_<KEY>) > the FERRY_CONFIG file >
// Ferry's defaults. Layered exactly as the backend's constructor does (config_sources.hpp),
// then given to a real Ferry engine whose segment name shows the address it bound. Needs no
// NIXL, so it runs in CI too.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <ferry/ferry.h>

#include "config_sources.hpp"

using ferry_nixl::key_for_env;
using ferry_nixl::layer_config;
using ferry_nixl::LayeredConfig;

namespace {

using Params = std::vector<std::pair<std::string, std::string>>;

struct Env {
    std::vector<std::string> entries;
    std::vector<const char *> pointers;
    explicit Env(std::vector<std::string> e) : entries(std::move(e)) {
        for (auto &s : entries) pointers.push_back(s.c_str());
        pointers.push_back(nullptr);
    }
    const char *const *get() const { return pointers.data(); }
};

class TempYaml {
public:
    explicit TempYaml(const std::string &text) {
        char tmpl[] = "/tmp/ferry-nixl-config-XXXXXX";
        int fd = mkstemp(tmpl);
        EXPECT_GE(fd, 0);
        close(fd);
        path_ = tmpl;
        std::ofstream(path_) << text;
    }
    ~TempYaml() { unlink(path_.c_str()); }
    const std::string &path() const { return path_; }

private:
    std::string path_;
};

// What the backend does with the layers: the file below, the keys over it.
std::string engine_segment(const LayeredConfig &cfg, std::string *error = nullptr) {
    std::vector<const char *> keys, values;
    for (const auto &[k, v] : cfg.values) {
        keys.push_back(k.c_str());
        values.push_back(v.c_str());
    }
    ferry_engine_t *engine = nullptr;
    int rc = cfg.config_file.empty() ? ferry_engine_create(keys.data(), values.data(), keys.size(), &engine)
                                     : ferry_engine_create_from_file(cfg.config_file.c_str(), keys.data(),
                                                                     values.data(), keys.size(), &engine);
    if (rc != 0) {
        if (error) *error = ferry_last_error();
        return {};
    }
    char name[256] = {};
    EXPECT_EQ(ferry_engine_segment_name(engine, name, sizeof name), 0);
    ferry_engine_destroy(engine);
    return name;
}

bool starts_with(const std::string &s, const std::string &prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

TEST(NixlConfig, EnvironmentNamesFollowTheKeys) {
    EXPECT_EQ(ferry_nixl::env_name("local_ip"), "FERRY_LOCAL_IP");
    EXPECT_EQ(ferry_nixl::env_name("tcp.lanes"), "FERRY_TCP__LANES");
    EXPECT_EQ(ferry_nixl::env_name("config_file"), "FERRY_CONFIG");
    EXPECT_EQ(key_for_env("FERRY_LOCAL_IP"), "local_ip");
    EXPECT_EQ(key_for_env("FERRY_METADATA"), "metadata");
    EXPECT_EQ(key_for_env("FERRY_PROTOCOLS"), "protocols");
    EXPECT_EQ(key_for_env("FERRY_TCP__LANES"), "tcp.lanes");
    EXPECT_EQ(key_for_env("FERRY_CUDA_IPC__CHUNK_BYTES"), "cuda_ipc.chunk_bytes");
    EXPECT_EQ(key_for_env("FERRY_REMOTE_ACCESS"), "remote_access");
    // Ferry reads these itself, in its own order; others are not configuration at all.
    EXPECT_FALSE(key_for_env("FERRY_PLUGIN_PATH"));
    EXPECT_FALSE(key_for_env("FERRY_PLUGINS"));
    EXPECT_FALSE(key_for_env("FERRY_LOG_LEVEL"));
    EXPECT_FALSE(key_for_env("FERRY_AUTH_SECRET"));
    EXPECT_FALSE(key_for_env("FERRY_LIBRARY"));
    EXPECT_FALSE(key_for_env("FERRY_TEST_WHEEL_DIR"));
    EXPECT_FALSE(key_for_env("FERRY___X"));
    EXPECT_FALSE(key_for_env("FERRY_TCP__"));
    EXPECT_FALSE(key_for_env("LOCAL_IP"));
}

TEST(NixlConfig, NoParametersNoEnvironmentGivesFerrysDefaults) {
    Env env({"PATH=/usr/bin", "FERRY_LIBRARY=/x/libferry.so"});
    auto cfg = layer_config({}, env.get());
    EXPECT_TRUE(cfg.values.empty());
    EXPECT_TRUE(cfg.config_file.empty());
    EXPECT_TRUE(starts_with(engine_segment(cfg), "127.0.0.1:")) << engine_segment(cfg);
}

TEST(NixlConfig, FileFromFerryConfig) {
    TempYaml yaml("local_ip: 127.0.0.3\nrpc_port: 0\n");
    Env env({"FERRY_CONFIG=" + yaml.path()});
    auto cfg = layer_config({}, env.get());
    EXPECT_EQ(cfg.config_file, yaml.path());
    EXPECT_TRUE(starts_with(engine_segment(cfg), "127.0.0.3:")) << engine_segment(cfg);
    EXPECT_NE(cfg.describe().find("FERRY_CONFIG"), std::string::npos) << cfg.describe();
}

TEST(NixlConfig, EnvironmentOverFile) {
    TempYaml yaml("local_ip: 127.0.0.3\n");
    Env env({"FERRY_CONFIG=" + yaml.path(), "FERRY_LOCAL_IP=127.0.0.4"});
    auto cfg = layer_config({}, env.get());
    EXPECT_TRUE(starts_with(engine_segment(cfg), "127.0.0.4:")) << engine_segment(cfg);
    EXPECT_EQ(cfg.origin.at("local_ip"), "FERRY_LOCAL_IP");
}

TEST(NixlConfig, HostParametersOverEnvironmentAndFile) {
    TempYaml yaml("local_ip: 127.0.0.3\n");
    TempYaml host_yaml("local_ip: 127.0.0.6\n");
    Env env({"FERRY_CONFIG=" + yaml.path(), "FERRY_LOCAL_IP=127.0.0.4"});
    auto cfg = layer_config({{"local_ip", "127.0.0.5"}}, env.get());
    EXPECT_TRUE(starts_with(engine_segment(cfg), "127.0.0.5:")) << engine_segment(cfg);
    EXPECT_EQ(cfg.origin.at("local_ip"), "parameter");
    // The host's config_file replaces FERRY_CONFIG's; the environment still wins over it.
    auto with_file = layer_config({{"config_file", host_yaml.path()}}, env.get());
    EXPECT_EQ(with_file.config_file, host_yaml.path());
    EXPECT_TRUE(starts_with(engine_segment(with_file), "127.0.0.4:"));
    auto file_only = layer_config({{"config_file", host_yaml.path()}}, Env({}).get());
    EXPECT_TRUE(starts_with(engine_segment(file_only), "127.0.0.6:"));
}

TEST(NixlConfig, EmptyHostValuesAreNotGiven) {
    // getPluginParams lists empty defaults and hosts pass them back: they must not hide the
    // environment.
    Env env({"FERRY_LOCAL_IP=127.0.0.4", "FERRY_METADATA=P2PHANDSHAKE"});
    auto cfg = layer_config({{"local_ip", ""}, {"metadata", ""}, {"rpc_port", ""}}, env.get());
    EXPECT_EQ(cfg.values.at("local_ip"), "127.0.0.4");
    EXPECT_EQ(cfg.values.count("rpc_port"), 0u);
    EXPECT_TRUE(starts_with(engine_segment(cfg), "127.0.0.4:"));
}

TEST(NixlConfig, BadEnvironmentValueIsNamed) {
    Env env({"FERRY_RPC_PORT=eighty"});
    auto cfg = layer_config({}, env.get());
    std::string error;
    EXPECT_EQ(engine_segment(cfg, &error), "");
    EXPECT_NE(error.find("rpc_port"), std::string::npos) << error;
    EXPECT_NE(cfg.describe().find("FERRY_RPC_PORT"), std::string::npos) << cfg.describe();
}

TEST(NixlConfig, TransportKeysThroughDoubleUnderscore) {
    Env env({"FERRY_TCP__LANES=2", "FERRY_PROTOCOLS=tcp"});
    auto cfg = layer_config({}, env.get());
    EXPECT_EQ(cfg.values.at("tcp.lanes"), "2");
    EXPECT_EQ(cfg.values.at("protocols"), "tcp");
    EXPECT_TRUE(starts_with(engine_segment(cfg), "127.0.0.1:"));
}
