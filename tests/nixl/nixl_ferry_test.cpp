// Two NIXL agents in two processes move bytes through the FERRY backend (libplugin_FERRY.so),
// using nothing but NIXL's public agent API (nixl.h). This process is the initiator; it runs
// itself again as the target (--target) and the two talk over a pair of pipes: the target's
// metadata and buffer addresses one way, commands and their answers both ways.
//
// Usage: nixl_ferry_test --protocols=<ferry protocol list> [gtest flags]
// Environment: NIXL_PLUGIN_DIR (where libplugin_FERRY.so is), FERRY_PLUGIN_PATH (Ferry transports).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "../listeners.hpp"
#include "nixl.h"

namespace {

constexpr size_t kRegionSize = (4u << 20) + 4096 + 123;  // several descriptors, an odd tail
constexpr size_t kChunks = 5;
constexpr auto kDeadline = std::chrono::seconds(30);
constexpr int kChildIn = 100, kChildOut = 101;  // the target's ends of the pipes

std::string g_protocols = "tcp";
std::string g_self_exe;

uint8_t pattern(int seed, size_t i) { return static_cast<uint8_t>(i * 131 + seed * 71 + (i >> 12)); }

void fill(std::vector<uint8_t> &buf, int seed) {
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = pattern(seed, i);
}

// Index of the first byte that differs from the pattern; nullopt when all match.
std::optional<size_t> first_mismatch(const std::vector<uint8_t> &buf, int seed) {
    for (size_t i = 0; i < buf.size(); ++i)
        if (buf[i] != pattern(seed, i)) return i;
    return std::nullopt;
}

nixl_b_params_t backend_params() { return {{"protocols", g_protocols}, {"local_ip", "127.0.0.1"}}; }

// ---- length-prefixed frames over a pipe ----

bool write_all(int fd, const void *data, size_t len) {
    auto *p = static_cast<const char *>(data);
    while (len > 0) {
        ssize_t n = ::write(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        p += n;
        len -= static_cast<size_t>(n);
    }
    return true;
}

bool read_all(int fd, void *data, size_t len, std::chrono::steady_clock::time_point deadline) {
    auto *p = static_cast<char *>(data);
    while (len > 0) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) return false;
        pollfd pfd{fd, POLLIN, 0};
        int r = ::poll(&pfd, 1, static_cast<int>(left.count()));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        ssize_t n = ::read(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        p += n;
        len -= static_cast<size_t>(n);
    }
    return true;
}

bool send_frame(int fd, const std::string &s) {
    uint32_t n = static_cast<uint32_t>(s.size());
    return write_all(fd, &n, sizeof n) && write_all(fd, s.data(), s.size());
}

std::optional<std::string> recv_frame(int fd) {
    auto deadline = std::chrono::steady_clock::now() + kDeadline;
    uint32_t n = 0;
    if (!read_all(fd, &n, sizeof n, deadline)) return std::nullopt;
    std::string s(n, '\0');
    if (!read_all(fd, s.data(), n, deadline)) return std::nullopt;
    return s;
}

// ---- NIXL helpers ----

nixl_xfer_dlist_t chunked(uintptr_t addr, size_t size) {
    nixl_xfer_dlist_t list(DRAM_SEG);
    size_t chunk = size / kChunks;
    for (size_t off = 0; off < size; off += chunk)
        list.addDesc(nixlBasicDesc(addr + off, std::min(chunk, size - off), 0));
    return list;
}

nixl_xfer_dlist_t chunked(const std::vector<uint8_t> &buf) {
    return chunked(reinterpret_cast<uintptr_t>(buf.data()), buf.size());
}

nixl_reg_dlist_t region(std::vector<uint8_t> &buf) {
    nixl_reg_dlist_t list(DRAM_SEG);
    list.addDesc(nixlBlobDesc(reinterpret_cast<uintptr_t>(buf.data()), buf.size(), 0));
    return list;
}

// Polls a posted request until it leaves NIXL_IN_PROG or the deadline passes.
nixl_status_t wait_xfer(nixlAgent &agent, nixlXferReqH *req, nixl_status_t posted) {
    auto deadline = std::chrono::steady_clock::now() + kDeadline;
    nixl_status_t st = posted;
    while (st == NIXL_IN_PROG && std::chrono::steady_clock::now() < deadline) st = agent.getXferStatus(req);
    return st;
}

// Waits until `from` has sent `message`; the other notifications that came in are kept in `seen`.
bool wait_notification(nixlAgent &agent, const std::string &from, const std::string &message,
                       std::vector<std::string> &seen) {
    auto deadline = std::chrono::steady_clock::now() + kDeadline;
    while (std::chrono::steady_clock::now() < deadline) {
        nixl_notifs_t notifs;
        if (agent.getNotifs(notifs) != NIXL_SUCCESS) return false;
        for (auto &[agent_name, messages] : notifs)
            for (auto &m : messages) {
                if (agent_name == from && m == message) return true;
                seen.push_back(agent_name + ": " + m);
            }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
}

// ---- the target process ----

int target_main() {
    auto fail = [](const std::string &why) {
        fprintf(stderr, "target: %s\n", why.c_str());
        send_frame(kChildOut, "FAIL " + why);
        return 1;
    };
    nixlAgent agent("target", nixlAgentConfig(false));
    nixlBackendH *backend = nullptr;
    if (agent.createBackend("FERRY", backend_params(), backend) != NIXL_SUCCESS)
        return fail("createBackend(FERRY) failed");

    std::vector<uint8_t> write_target(kRegionSize, 0), read_source(kRegionSize);
    fill(read_source, 2);
    if (agent.registerMem(region(write_target)) != NIXL_SUCCESS ||
        agent.registerMem(region(read_source)) != NIXL_SUCCESS)
        return fail("registerMem failed");
    nixl_blob_t md;
    if (agent.getLocalMD(md) != NIXL_SUCCESS) return fail("getLocalMD failed");
    std::ostringstream addrs;
    addrs << reinterpret_cast<uintptr_t>(write_target.data()) << ' ' << reinterpret_cast<uintptr_t>(read_source.data());
    if (!send_frame(kChildOut, md) || !send_frame(kChildOut, addrs.str())) return 1;

    std::vector<std::string> seen;
    for (;;) {
        auto cmd = recv_frame(kChildIn);
        if (!cmd) return fail("no command from the initiator");
        std::string reply = "OK";
        if (*cmd == "check-write") {
            // The notification comes after the data: the bytes must all be there when it does.
            if (!wait_notification(agent, "initiator", "write-done", seen)) reply = "no write-done notification";
            else if (auto at = first_mismatch(write_target, 1))
                reply = "written bytes differ from offset " + std::to_string(*at);
        } else if (cmd->rfind("wait-notif ", 0) == 0) {
            if (!wait_notification(agent, "initiator", cmd->substr(11), seen))
                reply = "notification '" + cmd->substr(11) + "' did not arrive";
        } else if (cmd->rfind("load-md ", 0) == 0) {
            std::string name;
            if (agent.loadRemoteMD(cmd->substr(8), name) != NIXL_SUCCESS || name != "initiator")
                reply = "loadRemoteMD failed";
        } else if (*cmd == "notify-back") {
            if (agent.genNotif("initiator", "hello-from-target") != NIXL_SUCCESS) reply = "genNotif failed";
        } else if (*cmd == "deregister-read-source") {
            if (agent.deregisterMem(region(read_source)) != NIXL_SUCCESS) reply = "deregisterMem failed";
        } else if (*cmd == "exit") {
            send_frame(kChildOut, reply);
            return 0;
        } else {
            reply = "unknown command " + *cmd;
        }
        if (reply != "OK" && !seen.empty()) reply += " (other notifications: " + seen.front() + ")";
        if (!send_frame(kChildOut, reply)) return 1;
    }
}

// ---- the initiator (this test) ----

struct TargetProcess {
    pid_t pid = -1;
    int to = -1, from = -1;

    bool start() {
        int down[2], up[2];
        if (pipe2(down, O_CLOEXEC) != 0 || pipe2(up, O_CLOEXEC) != 0) return false;
        pid = fork();
        if (pid < 0) return false;
        if (pid == 0) {
            dup2(down[0], kChildIn);  // dup2 clears O_CLOEXEC on the copies
            dup2(up[1], kChildOut);
            std::string proto = "--protocols=" + g_protocols;
            execl(g_self_exe.c_str(), g_self_exe.c_str(), "--target", proto.c_str(), static_cast<char *>(nullptr));
            _exit(127);
        }
        close(down[0]);
        close(up[1]);
        to = down[1];
        from = up[0];
        return true;
    }

    std::string ask(const std::string &cmd) {
        if (!send_frame(to, cmd)) return "target gone";
        return recv_frame(from).value_or("no answer from the target");
    }

    // Exit status of the target; -1 when it had to be killed.
    int finish() {
        if (pid <= 0) return -1;
        close(to);
        close(from);
        auto deadline = std::chrono::steady_clock::now() + kDeadline;
        int status = 0;
        while (waitpid(pid, &status, WNOHANG) == 0) {
            if (std::chrono::steady_clock::now() > deadline) {
                kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
                pid = -1;
                return -1;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }

    ~TargetProcess() {
        if (pid > 0) {
            kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
        }
    }
};

TEST(NixlFerry, PluginIsDiscoveredWithItsParameters) {
    nixlAgent agent("lister", nixlAgentConfig(false));
    std::vector<nixl_backend_t> plugins;
    ASSERT_EQ(agent.getAvailPlugins(plugins), NIXL_SUCCESS);
    ASSERT_NE(std::find(plugins.begin(), plugins.end(), "FERRY"), plugins.end())
        << "libplugin_FERRY.so not found in NIXL_PLUGIN_DIR="
        << (getenv("NIXL_PLUGIN_DIR") ? getenv("NIXL_PLUGIN_DIR") : "");
    nixl_mem_list_t mems;
    nixl_b_params_t params;
    ASSERT_EQ(agent.getPluginParams("FERRY", mems, params), NIXL_SUCCESS);
    EXPECT_NE(std::find(mems.begin(), mems.end(), DRAM_SEG), mems.end());
    EXPECT_NE(std::find(mems.begin(), mems.end(), VRAM_SEG), mems.end());
    for (const char *key : {"metadata", "local_ip", "protocols", "plugin_path", "remote_access"})
        EXPECT_EQ(params.count(key), 1u) << key;
    // Empty: the environment (FERRY_METADATA), then FERRY_CONFIG's file, then Ferry's default
    // (P2PHANDSHAKE) decide; a value here would hide them when a host passes the defaults back.
    EXPECT_EQ(params["metadata"], "");
    EXPECT_NE(params["note.progress_thread"].find("does not apply"), std::string::npos);
    EXPECT_NE(params["note.sync_mode"].find("does not apply"), std::string::npos);
}

// vLLM's NixlConnector creates backends with no parameters: the environment configures them.
TEST(NixlFerry, EnvironmentConfiguresABackendCreatedWithoutParameters) {
    setenv("FERRY_LOCAL_IP", "127.0.0.7", 1);
    setenv("FERRY_PROTOCOLS", g_protocols.c_str(), 1);
    nixlAgent agent("from-env", nixlAgentConfig(false));
    nixlBackendH *backend = nullptr;
    nixl_status_t created = agent.createBackend("FERRY", {}, backend);
    unsetenv("FERRY_LOCAL_IP");
    unsetenv("FERRY_PROTOCOLS");
    ASSERT_EQ(created, NIXL_SUCCESS);
    nixl_mem_list_t mems;
    nixl_b_params_t used;
    ASSERT_EQ(agent.getBackendParams(backend, mems, used), NIXL_SUCCESS);
    EXPECT_EQ(used["local_ip"], "127.0.0.7");
    EXPECT_EQ(used["note.segment"].rfind("127.0.0.7:", 0), 0u) << used["note.segment"];
    EXPECT_NE(used["note.sources"].find("FERRY_LOCAL_IP"), std::string::npos) << used["note.sources"];
    // FERRY_LOCAL_IP alone puts tcp.so's data listener on that address too (it used to stay on
    // 127.0.0.1, out of reach of other nodes): the handshake server and tcp.so, nothing else.
    if (g_protocols == "tcp") {
        auto listening = ferry::test::own_listeners();
        EXPECT_EQ(ferry::test::count_on(listening, "127.0.0.7"), 2u) << ferry::test::joined(listening);
    }
    // A host parameter still wins over the environment.
    setenv("FERRY_LOCAL_IP", "127.0.0.7", 1);
    nixlAgent agent2("from-param", nixlAgentConfig(false));
    created = agent2.createBackend("FERRY", {{"local_ip", "127.0.0.8"}, {"protocols", g_protocols}}, backend);
    unsetenv("FERRY_LOCAL_IP");
    ASSERT_EQ(created, NIXL_SUCCESS);
    ASSERT_EQ(agent2.getBackendParams(backend, mems, used), NIXL_SUCCESS);
    EXPECT_EQ(used["note.segment"].rfind("127.0.0.8:", 0), 0u) << used["note.segment"];
}

// estimateXferCost: refused until something was measured or configured, then from the
// measured bandwidth; prepMemView refused; customParam "transport=<name>" or refused.
TEST(NixlFerry, CostMemViewAndCustomParam) {
    nixlAgent agent("costs", nixlAgentConfig(false));
    nixlBackendH *backend = nullptr;
    ASSERT_EQ(agent.createBackend("FERRY", backend_params(), backend), NIXL_SUCCESS);
    std::vector<uint8_t> a(kRegionSize), b(kRegionSize, 0);
    fill(a, 5);
    ASSERT_EQ(agent.registerMem(region(a)), NIXL_SUCCESS);
    ASSERT_EQ(agent.registerMem(region(b)), NIXL_SUCCESS);

    nixlXferReqH *req = nullptr;
    ASSERT_EQ(agent.createXferReq(NIXL_WRITE, chunked(a), chunked(b), "costs", req), NIXL_SUCCESS);
    std::chrono::microseconds duration{0}, margin{0};
    nixl_cost_t method;
    EXPECT_EQ(agent.estimateXferCost(req, duration, margin, method), NIXL_ERR_NOT_SUPPORTED);
    EXPECT_EQ(wait_xfer(agent, req, agent.postXferReq(req)), NIXL_SUCCESS);
    ASSERT_EQ(agent.estimateXferCost(req, duration, margin, method), NIXL_SUCCESS);
    EXPECT_GT(duration.count(), 0);
    EXPECT_GE(margin.count(), 0);
    EXPECT_EQ(method, nixl_cost_t::ANALYTICAL_BACKEND);
    EXPECT_EQ(agent.releaseXferReq(req), NIXL_SUCCESS);

    nixl_opt_args_t forced;
    forced.customParam = "transport=" + g_protocols.substr(0, g_protocols.find(','));
    std::fill(b.begin(), b.end(), 0);
    ASSERT_EQ(agent.createXferReq(NIXL_WRITE, chunked(a), chunked(b), "costs", req, &forced), NIXL_SUCCESS);
    EXPECT_EQ(wait_xfer(agent, req, agent.postXferReq(req)), NIXL_SUCCESS);
    EXPECT_EQ(first_mismatch(b, 5), std::nullopt);
    EXPECT_EQ(agent.releaseXferReq(req), NIXL_SUCCESS);
    nixl_opt_args_t bogus;
    bogus.customParam = "lanes=9";
    EXPECT_NE(agent.createXferReq(NIXL_WRITE, chunked(a), chunked(b), "costs", req, &bogus), NIXL_SUCCESS);

    nixl_local_dlist_t view_list(DRAM_SEG);
    view_list.addDesc(nixlBasicDesc(reinterpret_cast<uintptr_t>(a.data()), a.size(), 0));
    nixlMemViewH view = nullptr;
    EXPECT_NE(agent.prepMemView(view_list, view), NIXL_SUCCESS);
    EXPECT_EQ(agent.deregisterMem(region(a)), NIXL_SUCCESS);
    EXPECT_EQ(agent.deregisterMem(region(b)), NIXL_SUCCESS);
}

TEST(NixlFerry, BadParametersFailCreateBackend) {
    nixlAgent agent("bad-params", nixlAgentConfig(false));
    nixlBackendH *backend = nullptr;
    // The backend's own key with a bad value, and a key Ferry does not know.
    EXPECT_NE(agent.createBackend("FERRY", {{"remote_access", "sideways"}}, backend), NIXL_SUCCESS);
    EXPECT_NE(agent.createBackend("FERRY", {{"no_such_ferry_key", "1"}}, backend), NIXL_SUCCESS);
    EXPECT_NE(
        agent.createBackend("FERRY", {{"protocols", g_protocols}, {"metadata", "zookeeper://127.0.0.1:1"}}, backend),
        NIXL_SUCCESS);
    // A good configuration still works in the same agent afterwards.
    EXPECT_EQ(agent.createBackend("FERRY", backend_params(), backend), NIXL_SUCCESS);
}

TEST(NixlFerry, LocalTransferWithinOneAgent) {
    nixlAgent agent("solo", nixlAgentConfig(false));
    nixlBackendH *backend = nullptr;
    ASSERT_EQ(agent.createBackend("FERRY", backend_params(), backend), NIXL_SUCCESS);
    std::vector<uint8_t> a(kRegionSize), b(kRegionSize, 0);
    fill(a, 3);
    ASSERT_EQ(agent.registerMem(region(a)), NIXL_SUCCESS);
    ASSERT_EQ(agent.registerMem(region(b)), NIXL_SUCCESS);

    nixl_opt_args_t args;
    args.notif = std::string("local-done");
    nixlXferReqH *req = nullptr;
    ASSERT_EQ(agent.createXferReq(NIXL_WRITE, chunked(a), chunked(b), "solo", req, &args), NIXL_SUCCESS);
    EXPECT_EQ(wait_xfer(agent, req, agent.postXferReq(req)), NIXL_SUCCESS);
    EXPECT_EQ(first_mismatch(b, 3), std::nullopt);
    std::vector<std::string> seen;
    EXPECT_TRUE(wait_notification(agent, "solo", "local-done", seen));
    EXPECT_EQ(agent.releaseXferReq(req), NIXL_SUCCESS);
    EXPECT_EQ(agent.deregisterMem(region(a)), NIXL_SUCCESS);
    EXPECT_EQ(agent.deregisterMem(region(b)), NIXL_SUCCESS);
}

TEST(NixlFerry, TwoProcessesWriteReadAndNotify) {
    TargetProcess target;
    ASSERT_TRUE(target.start());

    nixlAgent agent("initiator", nixlAgentConfig(false));
    nixlBackendH *backend = nullptr;
    ASSERT_EQ(agent.createBackend("FERRY", backend_params(), backend), NIXL_SUCCESS);
    std::vector<uint8_t> src(kRegionSize), dst(kRegionSize, 0);
    fill(src, 1);
    ASSERT_EQ(agent.registerMem(region(src)), NIXL_SUCCESS);
    ASSERT_EQ(agent.registerMem(region(dst)), NIXL_SUCCESS);

    // Metadata exchange: the target's comes over the pipe, ours goes back for its notifications.
    auto md = recv_frame(target.from);
    ASSERT_TRUE(md.has_value()) << "no metadata from the target";
    ASSERT_NE(md->rfind("FAIL ", 0), 0u) << *md;
    auto addrs = recv_frame(target.from);
    ASSERT_TRUE(addrs.has_value());
    uintptr_t remote_write = 0, remote_read = 0;
    std::istringstream(*addrs) >> remote_write >> remote_read;
    std::string name;
    ASSERT_EQ(agent.loadRemoteMD(*md, name), NIXL_SUCCESS);
    ASSERT_EQ(name, "target");
    nixl_blob_t my_md;
    ASSERT_EQ(agent.getLocalMD(my_md), NIXL_SUCCESS);
    ASSERT_EQ(target.ask("load-md " + my_md), "OK");

    // WRITE with a notification; the target checks every byte once the notification is there.
    nixl_opt_args_t args;
    args.notif = std::string("write-done");
    nixlXferReqH *write_req = nullptr;
    ASSERT_EQ(
        agent.createXferReq(NIXL_WRITE, chunked(src), chunked(remote_write, kRegionSize), "target", write_req, &args),
        NIXL_SUCCESS);
    EXPECT_EQ(wait_xfer(agent, write_req, agent.postXferReq(write_req)), NIXL_SUCCESS);
    EXPECT_EQ(target.ask("check-write"), "OK");
    EXPECT_EQ(agent.releaseXferReq(write_req), NIXL_SUCCESS);

    // READ, verified here.
    nixlXferReqH *read_req = nullptr;
    ASSERT_EQ(agent.createXferReq(NIXL_READ, chunked(dst), chunked(remote_read, kRegionSize), "target", read_req),
              NIXL_SUCCESS);
    EXPECT_EQ(wait_xfer(agent, read_req, agent.postXferReq(read_req)), NIXL_SUCCESS);
    auto bad = first_mismatch(dst, 2);
    EXPECT_EQ(bad, std::nullopt) << "read bytes differ from offset " << bad.value_or(0);

    // Standalone notifications, both ways.
    EXPECT_EQ(agent.genNotif("target", "hello-from-initiator"), NIXL_SUCCESS);
    EXPECT_EQ(target.ask("wait-notif hello-from-initiator"), "OK");
    EXPECT_EQ(target.ask("notify-back"), "OK");
    std::vector<std::string> seen;
    EXPECT_TRUE(wait_notification(agent, "target", "hello-from-target", seen));

    // Once the target has deregistered the region, its stale metadata here gets nothing out of
    // it: the repost fails and not one byte lands.
    ASSERT_EQ(target.ask("deregister-read-source"), "OK");
    std::fill(dst.begin(), dst.end(), 0xEE);
    nixl_status_t st = agent.postXferReq(read_req);
    if (st == NIXL_IN_PROG || st == NIXL_SUCCESS) st = wait_xfer(agent, read_req, st);
    EXPECT_LT(st, 0) << "a READ of deregistered memory succeeded";
    EXPECT_EQ(std::count(dst.begin(), dst.end(), 0xEE), static_cast<long>(dst.size()));
    agent.releaseXferReq(read_req);

    EXPECT_EQ(target.ask("exit"), "OK");
    EXPECT_EQ(target.finish(), 0);
    EXPECT_EQ(agent.deregisterMem(region(src)), NIXL_SUCCESS);
    EXPECT_EQ(agent.deregisterMem(region(dst)), NIXL_SUCCESS);
}

}  // namespace

int main(int argc, char **argv) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return 2;
    g_self_exe.assign(exe, static_cast<size_t>(n));
    bool target = false;
    std::vector<char *> rest;
    for (int i = 0; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "--target") target = true;
        else if (arg.rfind("--protocols=", 0) == 0) g_protocols = arg.substr(12);
        else rest.push_back(argv[i]);
    }
    if (target) return target_main();
    int rest_argc = static_cast<int>(rest.size());
    testing::InitGoogleTest(&rest_argc, rest.data());
    printf("NIXL host test over Ferry protocols=%s, NIXL_PLUGIN_DIR=%s\n", g_protocols.c_str(),
           getenv("NIXL_PLUGIN_DIR") ? getenv("NIXL_PLUGIN_DIR") : "(unset)");
    return RUN_ALL_TESTS();
}
