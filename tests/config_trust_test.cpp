// The files an engine believes, checked as plugins are (core/util/file_trust.cpp): its YAML
// configuration (Engine::create_from_file, the C API's, so Python's and the NIXL backend's
// FERRY_CONFIG), and the files named by etcd_key_file, etcd_password_file, etcd_ca_file,
// etcd_cert_file and auth_secret_file (FERRY_AUTH_SECRET_FILE). One that other users could
// change is refused with what is wrong and the fix; a private one they could read is warned
// about, once.
#include <gtest/gtest.h>

#include <filesystem>

#include "control/auth.hpp"
#include "engine/config.hpp"
#include "ferry/engine.hpp"
#include "ferry/ferry.h"
#include "test_util.hpp"
#include "trust_util.hpp"
#include "util/log.hpp"

using namespace ferry;
using ferry::test::other_user;
using ferry::test::set_mode;
using ferry::test::TempDir;
using ferry::test::write_text;
namespace fs = std::filesystem;

namespace {

bool has(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

const std::string kSecret = "0123456789abcdef0123456789abcdef";

class ConfigTrust : public ::testing::Test {
protected:
    void SetUp() override {
        unsetenv("FERRY_AUTH_SECRET");
        unsetenv("FERRY_AUTH_SECRET_FILE");
    }
    void TearDown() override { SetUp(); }
    TempDir dir;
};

}  // namespace

TEST_F(ConfigTrust, AConfigFileOthersCanChangeIsRefused) {
    fs::path f = dir / "conf/ferry.yaml";
    write_text(f, std::string("plugin_path: ") + FERRY_EXAMPLE_PLUGIN_DIR + "\nplugins: [example]\n", 0644);
    auto ok = load_yaml_config(f.string());
    ASSERT_TRUE(ok) << ok.error().message;
    EXPECT_EQ(ok->at("plugins"), "example");

    set_mode(f, 0666);
    auto file = Engine::create_from_file(f.string());
    ASSERT_FALSE(file);
    EXPECT_EQ(file.error().code, -EACCES);
    EXPECT_EQ(file.error().message, "config file: the configuration file '" + f.string() +
                                        "' is refused because other users could change it: " + f.string() +
                                        " is writable by others (mode 0666); fix: chmod go-w " + f.string());
    // Through the C API, as Python's Engine(config_file=...) and the NIXL backend's FERRY_CONFIG.
    ferry_engine_t *engine = nullptr;
    EXPECT_EQ(ferry_engine_create_from_file(f.c_str(), nullptr, nullptr, 0, &engine), -EACCES);
    EXPECT_EQ(std::string(ferry_last_error()), file.error().message);

    set_mode(f, 0644);
    set_mode(dir / "conf", 0775);
    file = Engine::create_from_file(f.string());
    ASSERT_FALSE(file);
    EXPECT_TRUE(
        has(file.error().message,
            (dir / "conf").string() + " is writable by group (mode 0775); fix: chmod go-w " + (dir / "conf").string()))
        << file.error().message;

    set_mode(dir / "conf", 0755);
    file = Engine::create_from_file(f.string());
    ASSERT_TRUE(file) << file.error().message;
    auto missing = Engine::create_from_file((dir / "absent.yaml").string());
    ASSERT_FALSE(missing);
    EXPECT_EQ(missing.error().code, -ENOENT);
}

TEST_F(ConfigTrust, AConfigFileOwnedByAnotherUserIsRefused) {
    REQUIRE_OTHER_USER();
    fs::path f = dir / "ferry.yaml";
    write_text(f, "log_level: warn\n", 0644);
    ferry::test::give_to(f, other_user().uid(), other_user().gid());
    auto r = load_yaml_config(f.string());
    ASSERT_FALSE(r);
    EXPECT_TRUE(has(r.error().message, cat(f.string(), " is owned by uid ", other_user().uid(),
                                           ", not root or this process's user (uid 0); fix: chown root ", f.string())))
        << r.error().message;
}

TEST_F(ConfigTrust, ASecretFileOthersCanChangeIsRefusedAndOneTheyCanReadIsWarnedAboutOnce) {
    fs::path f = dir / "secret";
    write_text(f, kSecret + "\n", 0666);
    std::string path = f.string();
    auto refused = resolve_auth_secret(nullptr, &path);
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code, -EACCES);
    EXPECT_EQ(refused.error().message, "config key 'auth_secret_file': the cluster secret file '" + path +
                                           "' is refused because other users could change it: " + path +
                                           " is writable by others (mode 0666); fix: chmod go-w " + path);
    setenv("FERRY_AUTH_SECRET_FILE", path.c_str(), 1);
    auto from_env = resolve_auth_secret(nullptr, nullptr);
    ASSERT_FALSE(from_env);
    EXPECT_TRUE(has(from_env.error().message, "environment FERRY_AUTH_SECRET_FILE: the cluster secret file"))
        << from_env.error().message;
    unsetenv("FERRY_AUTH_SECRET_FILE");

    set_mode(f, 0644);
    test::StderrCapture log;
    auto warned = resolve_auth_secret(nullptr, &path);
    auto again = resolve_auth_secret(nullptr, &path);
    std::string said = log.take();
    ASSERT_TRUE(warned) << warned.error().message;
    EXPECT_EQ(warned->secret, kSecret);
    ASSERT_TRUE(again);
    const std::string warning = "config key 'auth_secret_file': the cluster secret file: " + path +
                                " is readable by others (mode 0644); fix: chmod 600 " + path;
    EXPECT_EQ(test::count_of(said, warning), 1u) << said;

    set_mode(f, 0600);
    test::StderrCapture quiet;
    ASSERT_TRUE(resolve_auth_secret(nullptr, &path));
    EXPECT_FALSE(has(quiet.take(), path)) << "chmod 600: nothing to say";

    set_mode(dir.path(), 0770);
    auto in_group_dir = resolve_auth_secret(nullptr, &path);
    ASSERT_FALSE(in_group_dir);
    EXPECT_TRUE(has(in_group_dir.error().message, dir.path().string() + " is writable by group (mode 0770)"))
        << in_group_dir.error().message;
    set_mode(dir.path(), 0700);
}

TEST_F(ConfigTrust, EtcdKeyPasswordAndCertificateFilesAreCheckedToo) {
    write_text(dir / "password", "etcd-password\n", 0600);
    write_text(dir / "key.pem", "not parsed until a connection\n", 0600);
    write_text(dir / "cert.pem", "not parsed until a connection\n", 0644);
    write_text(dir / "ca.pem", "not parsed until a connection\n", 0644);
    const Config password{{"metadata", "etcd://127.0.0.1:2379/ferry"},
                          {"etcd_user", "ferry"},
                          {"etcd_password_file", (dir / "password").string()}};
    const Config tls{{"metadata", "etcds://127.0.0.1:2379/ferry"},
                     {"etcd_ca_file", (dir / "ca.pem").string()},
                     {"etcd_cert_file", (dir / "cert.pem").string()},
                     {"etcd_key_file", (dir / "key.pem").string()}};
    auto p = parse_engine_settings(password);
    ASSERT_TRUE(p) << p.error().message;
    EXPECT_EQ(p->metadata.etcd.password, "etcd-password");
    auto t = parse_engine_settings(tls);
    ASSERT_TRUE(t) << t.error().message;

    struct Case {
        const char *file;
        const Config &config;
        const char *key;
        const char *what;
    };
    for (const auto &c : {Case{"password", password, "etcd_password_file", "etcd password"},
                          Case{"key.pem", tls, "etcd_key_file", "etcd private key"},
                          Case{"cert.pem", tls, "etcd_cert_file", "etcd client certificate"},
                          Case{"ca.pem", tls, "etcd_ca_file", "etcd CA certificate"}}) {
        const std::string f = (dir / c.file).string();
        set_mode(f, 0646);
        auto r = parse_engine_settings(c.config);
        ASSERT_FALSE(r) << c.file;
        EXPECT_EQ(r.error().code, -EACCES);
        EXPECT_EQ(r.error().message, cat("config key '", c.key, "': the ", c.what, " file '", f,
                                         "' is refused because other users could change it: ", f,
                                         " is writable by others (mode 0646); fix: chmod go-w ", f));
        set_mode(f, 0600);
    }

    // Readable by group: a warning for the key and the password, nothing for a certificate.
    set_mode(dir / "key.pem", 0640);
    set_mode(dir / "cert.pem", 0644);
    test::StderrCapture log;
    ASSERT_TRUE(parse_engine_settings(tls));
    std::string said = log.take();
    EXPECT_TRUE(has(said, "config key 'etcd_key_file': the etcd private key file: " + (dir / "key.pem").string() +
                              " is readable by group (mode 0640); fix: chmod 600 " + (dir / "key.pem").string()))
        << said;
    EXPECT_FALSE(has(said, "cert.pem")) << said;

    auto missing =
        parse_engine_settings({{"metadata", "etcds://127.0.0.1:2379/ferry"}, {"etcd_ca_file", "/nonexistent/ca.pem"}});
    ASSERT_FALSE(missing);
    EXPECT_TRUE(has(missing.error().message, "config key 'etcd_ca_file': cannot read '/nonexistent/ca.pem'"))
        << missing.error().message;
}
