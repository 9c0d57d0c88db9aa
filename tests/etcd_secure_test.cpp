// The etcd metadata backend against a real etcd secured the way production clusters run it,
// started by the test itself on 127.0.0.1 ports 23790-23799: TLS with client-certificate
// authentication (a CA, server and client certificates made with the openssl CLI), and
// etcd's user/password authentication with one-second tokens. Engines in this process and in
// child processes register and find each other; a wrong CA, a missing client certificate and a
// wrong password fail at once with what to set; expired and forgotten tokens are replaced.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "ferry/engine.hpp"
#include "peer_pattern.hpp"
#include "peer_process.hpp"
#include "test_util.hpp"

using namespace ferry;
using ferry::test::PeerProcess;
using Clock = std::chrono::steady_clock;

namespace {

bool contains(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

std::string sh(const std::string &command, int *status) {
    return ferry::test::run_command("(" + command + ") 2>&1", status);
}

// One etcd server on 127.0.0.1 with the given extra flags, in a directory of its own. It dies
// with the test process (PR_SET_PDEATHSIG) even if the test crashes.
class EtcdProcess {
public:
    EtcdProcess(uint16_t client_port, std::string scheme, std::vector<std::string> flags, std::string probe)
        : client_port_(client_port), scheme_(std::move(scheme)), flags_(std::move(flags)), probe_(std::move(probe)) {}
    ~EtcdProcess() { stop(); }

    std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }
    std::string url() const { return scheme_ + "://" + endpoint(); }

    // Starts etcd and waits until `probe` (a shell command; {URL} is replaced) succeeds.
    std::string start() {
        const std::string client = url();
        const std::string peer = "http://127.0.0.1:" + std::to_string(client_port_ + 1);
        std::vector<std::string> args = {"etcd",
                                         "--data-dir",
                                         (dir_ / "data").string(),
                                         "--listen-client-urls",
                                         client,
                                         "--advertise-client-urls",
                                         client,
                                         "--listen-peer-urls",
                                         peer,
                                         "--initial-advertise-peer-urls",
                                         peer,
                                         "--initial-cluster",
                                         "default=" + peer};
        args.insert(args.end(), flags_.begin(), flags_.end());
        // Built before fork: the child of a multithreaded process only makes async-signal-safe calls.
        std::vector<char *> argv;
        for (auto &a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        const pid_t parent = getpid();
        const int log = open(log_path().c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        pid_ = fork();
        if (pid_ == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(1);
            if (log >= 0) {
                dup2(log, 1);
                dup2(log, 2);
            }
            execv(FERRY_ETCD_BIN, argv.data());
            _exit(127);
        }
        if (log >= 0) close(log);
        std::string probe = probe_;
        probe.replace(probe.find("{URL}"), 5, client);
        // Generous: on a loaded 2-core machine etcd takes seconds to elect itself.
        auto deadline = Clock::now() + std::chrono::seconds(60);
        std::string last;
        while (Clock::now() < deadline) {
            int status = 0;
            if (pid_ > 0 && waitpid(pid_, &status, WNOHANG) == pid_) {
                pid_ = -1;
                return "etcd exited at start (port " + std::to_string(client_port_) +
                       " in use?); its log: " + log_tail();
            }
            last = sh(probe, &status);
            if (status == 0) return "";
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        return "etcd did not answer on " + client + " within 60 s (last probe: " + last + "); its log: " + log_tail();
    }
    void stop() {
        if (pid_ > 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
            pid_ = -1;
        }
    }

private:
    std::filesystem::path log_path() const { return dir_ / "etcd.log"; }
    std::string log_tail() {
        int status = 0;
        return sh("tail -c 1500 " + log_path().string(), &status);
    }

    uint16_t client_port_;
    std::string scheme_;
    std::vector<std::string> flags_;
    std::string probe_;
    ferry::test::TempDir dir_;
    pid_t pid_ = -1;
};

// Why these tests cannot run here, or "".
std::string missing_tools() {
    if (std::string(FERRY_ETCD_BIN).empty() || ::access(FERRY_ETCD_BIN, X_OK) != 0)
        return "etcd is not installed (apt-get install etcd-server)";
    int status = 0;
    sh("openssl version", &status);
    if (status != 0) return "the openssl CLI is not installed (apt-get install openssl)";
    sh("curl --version", &status);
    if (status != 0) return "curl is not installed (apt-get install curl)";
    return "";
}

// A CA, a server certificate for 127.0.0.1 (also usable as a client: etcd's gateway connects
// to etcd with it), a client certificate, and a second CA that signed none of them.
std::string make_certificates(const std::filesystem::path &d) {
    const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2";
    const std::string p = d.string() + "/";
    std::string script =
        "set -e; cd " + p +
        "; "
        "openssl req -x509" +
        ec +
        " -keyout ca.key -out ca.pem -subj /CN=ferry-test-ca; "
        "openssl req -x509" +
        ec +
        " -keyout other-ca.key -out other-ca.pem -subj /CN=some-other-ca; "
        "printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth,clientAuth\\n' > server.ext; "
        "printf 'extendedKeyUsage=clientAuth\\n' > client.ext; "
        "for who in server client; do "
        "openssl req" +
        ec +
        " -keyout $who.key -out $who.csr -subj /CN=ferry-$who; "
        "openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
        "-extfile $who.ext -out $who.pem; done";
    int status = 0;
    std::string out = sh(script, &status);
    return status == 0 ? "" : "making test certificates failed: " + out;
}

Result<void> read_all(Engine &e, SegmentId seg, uint64_t remote, std::vector<uint8_t> &local) {
    std::vector<Request> r = {{Opcode::Read, local.data(), seg, remote, local.size(), ""}};
    auto b = e.submit(r);
    if (!b) return std::unexpected(b.error());
    auto w = e.wait(*b, std::chrono::seconds(20));
    (void)e.free_batch(*b);
    return w;
}

bool eventually(const std::function<bool()> &check, std::chrono::seconds limit = std::chrono::seconds(30)) {
    auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
        if (check()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return false;
}

std::vector<std::string> as_peer_args(const Config &c) {
    std::vector<std::string> args = {"--size", "1048576"};
    for (auto &[k, v] : c) {
        if (k == "plugins") continue;
        args.push_back("--option");
        args.push_back(k + "=" + v);
    }
    return args;
}

// A peer registered through `peer_config` is found and read by an engine made from `config`.
void expect_found_and_read(const Config &peer_config, const Config &config) {
    PeerProcess peer(as_peer_args(peer_config));
    ASSERT_TRUE(peer.ok) << peer.error;
    auto engine = Engine::create(config);
    ASSERT_TRUE(engine) << engine.error().message;
    auto seg = (*engine)->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;
    std::vector<uint8_t> local(peer.size);
    ASSERT_TRUE((*engine)->register_memory(local.data(), local.size()));
    auto r = read_all(**engine, *seg, peer.base, local);
    ASSERT_TRUE(r) << r.error().message;
    for (size_t i = 0; i < local.size(); ++i) ASSERT_EQ(local[i], test::peer_pattern(i)) << i;
}

}  // namespace

// ---- keys checked before anything is contacted -------------------------------------------

TEST(EtcdSecureConfig, InconsistentKeysAreRefusedWithWhatToSet) {
    ferry::test::TempDir dir;
    std::ofstream(dir / "ca.pem") << "x";
    auto create = [](Config c) {
        c["plugins"] = "tcp";
        auto e = Engine::create(c);
        return e ? std::string("created") : e.error().message;
    };
    const std::string ca = (dir / "ca.pem").string();
    EXPECT_TRUE(
        contains(create({{"metadata", "etcd://127.0.0.1:1/p"}, {"etcd_ca_file", ca}}), "write etcds://127.0.0.1:1/p"));
    EXPECT_TRUE(contains(create({{"metadata", "etcds://127.0.0.1:1/p"}, {"etcd_cert_file", ca}}), "set both"));
    EXPECT_TRUE(contains(create({{"metadata", "etcds://127.0.0.1:1/p"}, {"etcd_ca_file", "/nonexistent/ca.pem"}}),
                         "config key 'etcd_ca_file': cannot read '/nonexistent/ca.pem'"));
    EXPECT_TRUE(
        contains(create({{"metadata", "etcd://127.0.0.1:1/p"}, {"etcd_user", "u"}}), "set 'etcd_password_file'"));
    EXPECT_TRUE(
        contains(create({{"metadata", "etcd://127.0.0.1:1/p"}, {"etcd_password", "pw"}}), "'etcd_user' is not"));
    EXPECT_TRUE(contains(create({{"metadata", "P2PHANDSHAKE"}, {"etcd_user", "u"}, {"etcd_password", "pw"}}),
                         "not an etcd:// or etcds:// address"));
    EXPECT_TRUE(contains(create({{"metadata", "etcd://https://127.0.0.1:1/p"}}), "etcds://h1:2379,h2:2379/prefix"));
    // A secret file is a regular file read with a bound: /dev/zero is refused, not read forever.
    EXPECT_TRUE(contains(
        create({{"metadata", "etcd://127.0.0.1:1/p"}, {"etcd_user", "u"}, {"etcd_password_file", "/dev/zero"}}),
        "/dev/zero is not a regular file"));
    const std::string big = (dir / "big-password").string();
    std::ofstream(big) << std::string(65537, 'p');
    chmod(big.c_str(), 0600);
    EXPECT_TRUE(
        contains(create({{"metadata", "etcd://127.0.0.1:1/p"}, {"etcd_user", "u"}, {"etcd_password_file", big}}),
                 "holds more than 65536 bytes"));
}

// ---- TLS with client certificates ---------------------------------------------------------

class EtcdTls : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        skip_ = missing_tools();
        if (!skip_.empty()) return;
        certs_ = new ferry::test::TempDir;
        if (std::string e = make_certificates(certs_->path()); !e.empty()) {
            setup_error_ = e;
            return;
        }
        const std::string p = certs_->path().string() + "/";
        etcd_ =
            new EtcdProcess(23790, "https",
                            {"--cert-file", p + "server.pem", "--key-file", p + "server.key", "--trusted-ca-file",
                             p + "ca.pem", "--client-cert-auth"},
                            "curl -sS -f -m 2 -X POST {URL}/v3/maintenance/status -d '{}' --cacert " + p +
                                "ca.pem --cert " + p + "client.pem --key " + p + "client.key | grep -q '\"header\"'");
        setup_error_ = etcd_->start();
    }
    static void TearDownTestSuite() {
        delete etcd_;
        etcd_ = nullptr;
        delete certs_;
        certs_ = nullptr;
    }
    void SetUp() override {
        if (!skip_.empty()) GTEST_SKIP() << "SKIPPED: " << skip_;
        ASSERT_TRUE(setup_error_.empty()) << setup_error_;
    }
    static std::string file(const std::string &name) { return (certs_->path() / name).string(); }
    Config config(const std::string &name) const {
        return {{"plugins", "tcp"},
                {"metadata", "etcds://" + etcd_->endpoint() + "/ferry-tls-" + std::to_string(getpid())},
                {"local_server_name", name},
                {"etcd_lease_ttl_s", "5"},
                {"etcd_ca_file", file("ca.pem")},
                {"etcd_cert_file", file("client.pem")},
                {"etcd_key_file", file("client.key")}};
    }

    static inline std::string skip_, setup_error_;
    static inline ferry::test::TempDir *certs_ = nullptr;
    static inline EtcdProcess *etcd_ = nullptr;
};

TEST_F(EtcdTls, EnginesRegisterAndFindEachOtherOverTlsWithClientCertificates) {
    expect_found_and_read(config("tls-a"), config("tls-b"));
}

TEST_F(EtcdTls, AWrongCaFailsAtOnceNamingTheUrlAndWhatToSet) {
    auto c = config("tls-wrong-ca");
    c["etcd_ca_file"] = file("other-ca.pem");
    auto start = Clock::now();
    auto e = Engine::create(c);
    ASSERT_FALSE(e);
    const std::string &m = e.error().message;
    EXPECT_TRUE(contains(m, "https://" + etcd_->endpoint())) << m;
    EXPECT_TRUE(contains(m, "certificate verify failed")) << m;
    EXPECT_TRUE(contains(m, "set etcd_ca_file to the CA that signed etcd's server certificate")) << m;
    EXPECT_EQ(e.error().code, -EACCES);
    std::cout << "wrong CA: " << m << "\n";
    // Not retried for metadata_retry_ms (10 s): waiting does not cure a wrong CA.
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(8));
}

// etcd answers with a TLS alert, or (TLS 1.3: the alert crosses the request) a reset; either
// way the error names the setting, and the engine does not start.
TEST_F(EtcdTls, WithoutAClientCertificateEtcdRefusesAndTheErrorSaysWhatToSet) {
    auto c = config("tls-no-cert");
    c.erase("etcd_cert_file");
    c.erase("etcd_key_file");
    c["metadata_retry_ms"] = "2000";
    auto e = Engine::create(c);
    ASSERT_FALSE(e);
    EXPECT_TRUE(contains(e.error().message, "https://" + etcd_->endpoint())) << e.error().message;
    EXPECT_TRUE(contains(e.error().message, "it requires a client certificate; set etcd_cert_file and etcd_key_file"))
        << e.error().message;
    std::cout << "no client certificate: " << e.error().message << "\n";
    // A certificate from a CA etcd does not trust is refused too.
    c["etcd_cert_file"] = file("other-ca.pem");
    c["etcd_key_file"] = file("other-ca.key");
    auto untrusted = Engine::create(c);
    ASSERT_FALSE(untrusted);
    EXPECT_TRUE(contains(untrusted.error().message, "does not accept the client certificate in etcd_cert_file"))
        << untrusted.error().message;
    std::cout << "untrusted client certificate: " << untrusted.error().message << "\n";
}

TEST_F(EtcdTls, PlainHttpToATlsEtcdFails) {
    auto c = config("tls-plain");
    c["metadata"] = "etcd://" + etcd_->endpoint() + "/ferry-tls";
    for (auto k : {"etcd_ca_file", "etcd_cert_file", "etcd_key_file"}) c.erase(k);
    c["metadata_retry_ms"] = "300";
    auto e = Engine::create(c);
    ASSERT_FALSE(e);
    EXPECT_TRUE(contains(e.error().message, "http://" + etcd_->endpoint())) << e.error().message;
}

// ---- user/password authentication ---------------------------------------------------------

class EtcdAuth : public ::testing::Test {
protected:
    static constexpr const char *kPassword = "ferry's pass \"word\" 42";
    static void SetUpTestSuite() {
        skip_ = missing_tools();
        if (!skip_.empty()) return;
        // Tokens live one second without use, so engines must authenticate again and again.
        etcd_ = new EtcdProcess(23792, "http", {"--auth-token-ttl", "1"},
                                "curl -sS -f -m 2 -X POST {URL}/v3/maintenance/status -d '{}' | grep -q '\"header\"'");
        dir_ = new ferry::test::TempDir;
        setup_error_ = etcd_->start();
        if (setup_error_.empty()) setup_error_ = enable_auth();
        std::ofstream(*dir_ / "password", std::ios::binary) << kPassword << "\n";
        chmod((*dir_ / "password").c_str(), 0600);
    }
    static void TearDownTestSuite() {
        delete etcd_;
        etcd_ = nullptr;
        delete dir_;
        dir_ = nullptr;
    }
    // A root user (etcd requires one) and user "ferry" allowed only under /ferry-auth.
    static std::string enable_auth() {
        const std::string u = etcd_->url();
        auto b64 = [](const std::string &s) {
            int st = 0;
            return sh("printf %s '" + s + "' | base64 -w0", &st);
        };
        const std::string steps[][2] = {
            {"/v3/auth/role/add", R"({"name":"root"})"},
            {"/v3/auth/user/add", R"({"name":"root","password":"root-pw-123"})"},
            {"/v3/auth/user/grant", R"({"user":"root","role":"root"})"},
            {"/v3/auth/role/add", R"({"name":"ferry"})"},
            {"/v3/auth/role/grant", R"({"name":"ferry","perm":{"permType":"READWRITE","key":")" + b64("/ferry-auth") +
                                        R"(","range_end":")" + b64("/ferry-auti") + R"("}})"},
            {"/v3/auth/user/add", R"({"name":"ferry","password":"ferry's pass \"word\" 42"})"},
            {"/v3/auth/user/grant", R"({"user":"ferry","role":"ferry"})"},
            {"/v3/auth/enable", "{}"},
        };
        const std::string body_file = (*dir_ / "request.json").string();
        for (auto &[path, body] : steps) {
            std::ofstream(body_file, std::ios::trunc) << body;
            int st = 0;
            std::string out = sh("curl -sS -f -m 10 -X POST " + u + path + " --data-binary @" + body_file, &st);
            if (st != 0 || contains(out, "\"error\"")) return "enabling etcd auth: " + path + ": " + out;
        }
        return "";
    }
    void SetUp() override {
        if (!skip_.empty()) GTEST_SKIP() << "SKIPPED: " << skip_;
        ASSERT_TRUE(setup_error_.empty()) << setup_error_;
    }
    Config config(const std::string &name) const {
        return {{"plugins", "tcp"},
                {"metadata", "etcd://" + etcd_->endpoint() + "/ferry-auth/" + std::to_string(getpid())},
                {"local_server_name", name},
                {"etcd_lease_ttl_s", "6"},
                {"etcd_user", "ferry"},
                {"etcd_password_file", (*dir_ / "password").string()}};
    }

    static inline std::string skip_, setup_error_;
    static inline EtcdProcess *etcd_ = nullptr;
    static inline ferry::test::TempDir *dir_ = nullptr;
};

TEST_F(EtcdAuth, EnginesAuthenticateWithAPasswordFileOrValue) {
    auto by_value = config("auth-b");
    by_value.erase("etcd_password_file");
    by_value["etcd_password"] = kPassword;
    expect_found_and_read(config("auth-a"), by_value);
}

TEST_F(EtcdAuth, AWrongPasswordFailsAtOnceWithoutShowingIt) {
    auto c = config("auth-wrong");
    c.erase("etcd_password_file");
    c["etcd_password"] = "not the password 17";
    auto start = Clock::now();
    auto e = Engine::create(c);
    ASSERT_FALSE(e);
    const std::string &m = e.error().message;
    EXPECT_TRUE(contains(m, "etcd refused user 'ferry': wrong user or password")) << m;
    EXPECT_TRUE(contains(m, "check etcd_user and etcd_password")) << m;
    EXPECT_FALSE(contains(m, "not the password 17")) << m;
    std::cout << "wrong password: " << m << "\n";
    EXPECT_EQ(e.error().code, -EACCES);
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(8));
}

TEST_F(EtcdAuth, WithoutCredentialsTheErrorSaysWhatToSet) {
    auto c = config("auth-none");
    c.erase("etcd_user");
    c.erase("etcd_password_file");
    auto e = Engine::create(c);
    ASSERT_FALSE(e);
    EXPECT_TRUE(contains(e.error().message, "set etcd_user and etcd_password_file")) << e.error().message;
    std::cout << "no credentials: " << e.error().message << "\n";
    // A user whose role does not cover the prefix.
    auto elsewhere = config("auth-elsewhere");
    elsewhere["metadata"] = "etcd://" + etcd_->endpoint() + "/not-ferrys";
    auto denied = Engine::create(elsewhere);
    ASSERT_FALSE(denied);
    EXPECT_TRUE(contains(denied.error().message, "grant etcd user 'ferry' a role with READWRITE"))
        << denied.error().message;
}

// Tokens expire after a second unused, and an etcd restart forgets them all: leases, fetches
// and the watch stream (which etcd cancels when it opens with a dead token) authenticate again.
TEST_F(EtcdAuth, ExpiredAndForgottenTokensAreReplaced) {
    auto engine = Engine::create(config("auth-reader"));
    ASSERT_TRUE(engine) << engine.error().message;
    std::vector<uint8_t> local(1 << 20);
    ASSERT_TRUE((*engine)->register_memory(local.data(), local.size()));
    auto first = std::make_unique<PeerProcess>(as_peer_args(config("auth-phoenix")));
    ASSERT_TRUE(first->ok) << first->error;
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // the reader's token expires unused
    auto seg = (*engine)->open_segment("auth-phoenix");
    ASSERT_TRUE(seg) << seg.error().message;
    ASSERT_TRUE(read_all(**engine, *seg, first->base, local));

    // etcd restarts: every token is gone, every watch stream breaks.
    etcd_->stop();
    ASSERT_EQ(etcd_->start(), "");
    first->kill_now();
    // The same name from a new process: new port, new buffer. The reader hears of it only
    // through its watch, re-opened with a new token.
    PeerProcess second(as_peer_args(config("auth-phoenix")));
    ASSERT_TRUE(second.ok) << second.error;
    std::fill(local.begin(), local.end(), 0);
    ASSERT_TRUE(eventually([&] { return static_cast<bool>(read_all(**engine, *seg, second.base, local)); }))
        << "ops to the restarted peer never succeeded: the watch did not come back";
    for (size_t i = 0; i < local.size(); ++i) ASSERT_EQ(local[i], test::peer_pattern(i)) << i;

    // Well past the 6 s lease: the second peer's keep-alives went on with fresh tokens.
    std::this_thread::sleep_for(std::chrono::seconds(8));
    auto late = Engine::create(config("auth-late"));
    ASSERT_TRUE(late) << late.error().message;
    auto again = (*late)->open_segment("auth-phoenix");
    ASSERT_TRUE(again) << "the peer's registration did not survive token expiry: " << again.error().message;
}
