// One NIXL agent for tests/nixl/netns_env_test.sh: the FERRY backend created with NO parameters
// (as vLLM's NixlConnector does), so Ferry's configuration comes only from the environment
// (FERRY_LOCAL_IP, FERRY_METADATA=etcd://..., FERRY_PROTOCOLS). NIXL's own metadata goes
// through files in a shared directory (this NIXL has no etcd of its own); Ferry's segment
// descriptors go through etcd.
//   nixl_env_peer target <dir>      registers 4 MiB, waits for the initiator's WRITE and notification
//   nixl_env_peer initiator <dir>   WRITEs a pattern into the target's region, then notifies
// Exit 0 when the target found every byte in place. Every wait has a deadline.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "nixl.h"

namespace {

constexpr size_t kSize = 4u << 20;
constexpr auto kDeadline = std::chrono::seconds(60);

uint8_t pattern(size_t i) { return static_cast<uint8_t>((i * 131 + 7) ^ (i >> 11)); }

void publish(const std::string &path, const std::string &text) {
    std::string tmp = path + ".tmp";
    std::ofstream(tmp, std::ios::binary) << text;
    std::rename(tmp.c_str(), path.c_str());  // whole file or none
}

bool await_file(const std::string &path, std::string &text) {
    auto deadline = std::chrono::steady_clock::now() + kDeadline;
    while (std::chrono::steady_clock::now() < deadline) {
        std::ifstream in(path, std::ios::binary);
        if (in) {
            std::stringstream ss;
            ss << in.rdbuf();
            text = ss.str();
            return true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
}

int fail(const char *role, const std::string &why) {
    fprintf(stderr, "%s: FAIL: %s\n", role, why.c_str());
    return 1;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s target|initiator <shared dir>\n", argv[0]);
        return 2;
    }
    const std::string role = argv[1], dir = argv[2];
    const bool target = role == "target";
    nixlAgent agent(role, nixlAgentConfig(false));
    nixlBackendH *backend = nullptr;
    if (agent.createBackend("FERRY", {}, backend) != NIXL_SUCCESS)
        return fail(argv[1], "createBackend(FERRY, {}) failed");
    nixl_mem_list_t mems;
    nixl_b_params_t used;
    agent.getBackendParams(backend, mems, used);
    printf("%s: Ferry segment %s; %s\n", argv[1], used["note.segment"].c_str(), used["note.sources"].c_str());

    std::vector<uint8_t> buf(kSize, 0);
    if (!target)
        for (size_t i = 0; i < kSize; ++i) buf[i] = pattern(i);
    nixl_reg_dlist_t reg(DRAM_SEG);
    reg.addDesc(nixlBlobDesc(reinterpret_cast<uintptr_t>(buf.data()), buf.size(), 0));
    if (agent.registerMem(reg) != NIXL_SUCCESS) return fail(argv[1], "registerMem failed");
    std::string md;
    if (agent.getLocalMD(md) != NIXL_SUCCESS) return fail(argv[1], "getLocalMD failed");
    publish(dir + "/" + role + ".md", md);
    if (target) publish(dir + "/target.addr", std::to_string(reinterpret_cast<uintptr_t>(buf.data())));

    std::string peer_md, peer_name;
    if (!await_file(dir + "/" + (target ? "initiator" : "target") + ".md", peer_md))
        return fail(argv[1], "no peer metadata");
    if (agent.loadRemoteMD(peer_md, peer_name) != NIXL_SUCCESS) return fail(argv[1], "loadRemoteMD failed");

    if (target) {
        auto deadline = std::chrono::steady_clock::now() + kDeadline;
        while (std::chrono::steady_clock::now() < deadline) {
            nixl_notifs_t notifs;
            if (agent.getNotifs(notifs) != NIXL_SUCCESS) return fail(argv[1], "getNotifs failed");
            for (auto &m : notifs["initiator"]) {
                if (m != "written") continue;
                for (size_t i = 0; i < kSize; ++i)
                    if (buf[i] != pattern(i)) return fail(argv[1], "byte " + std::to_string(i) + " differs");
                printf("target: 4 MiB in place, checked byte by byte\n");
                publish(dir + "/target.done", "ok");
                agent.deregisterMem(reg);
                return 0;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        return fail(argv[1], "no notification within the deadline");
    }
    std::string addr_text, done;
    if (!await_file(dir + "/target.addr", addr_text)) return fail(argv[1], "no target address");
    uintptr_t remote = std::stoull(addr_text);
    nixl_xfer_dlist_t local(DRAM_SEG), far(DRAM_SEG);
    local.addDesc(nixlBasicDesc(reinterpret_cast<uintptr_t>(buf.data()), kSize, 0));
    far.addDesc(nixlBasicDesc(remote, kSize, 0));
    nixl_opt_args_t args;
    args.notif = std::string("written");
    nixlXferReqH *req = nullptr;
    if (agent.createXferReq(NIXL_WRITE, local, far, "target", req, &args) != NIXL_SUCCESS)
        return fail(argv[1], "createXferReq failed");
    nixl_status_t st = agent.postXferReq(req);
    auto deadline = std::chrono::steady_clock::now() + kDeadline;
    while (st == NIXL_IN_PROG && std::chrono::steady_clock::now() < deadline) st = agent.getXferStatus(req);
    if (st != NIXL_SUCCESS) return fail(argv[1], "WRITE ended with " + std::to_string(st));
    agent.releaseXferReq(req);
    // Stay until the target has checked (it reads from this agent's memory no more, but the
    // notification's sender must not vanish before it is taken).
    if (!await_file(dir + "/target.done", done)) return fail(argv[1], "target did not confirm");
    printf("initiator: WRITE of 4 MiB with notification done\n");
    agent.deregisterMem(reg);
    return 0;
}
