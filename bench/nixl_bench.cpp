// nixl_bench: throughput of a NIXL backend through NIXL's public agent API, with
// transfer_engine_bench's flags, so FERRY over NIXL can be compared with Ferry's own bench and
// with the backends a NIXL user runs today (nixlbench refuses backends outside its own list).
//   nixl_bench --backend=FERRY --protocol=tcp --operation=write --block_size=65536 --batch_size=128 --duration=5
//   nixl_bench --backend=POSIX --operation=write        (DRAM to a file: POSIX is a file backend)
//   nixl_bench --backend=UCX                            (where NIXL was built with UCX)
// Remote-capable backends (FERRY, UCX) run loopback: two agents in this process, metadata
// exchanged in memory, one batch in flight, as transfer_engine_bench --loopback does.
// Throughput = batches x batch_size x block_size / duration.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <boost/program_options.hpp>

#include "nixl.h"

namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;

namespace {

[[noreturn]] void die(const std::string &why) {
    fprintf(stderr, "nixl_bench: %s\n", why.c_str());
    exit(1);
}

double unit_bytes(const std::string &u) {
    if (u == "GB") return 1e9;
    if (u == "GiB") return 1ull << 30;
    if (u == "MB") return 1e6;
    if (u == "MiB") return 1ull << 20;
    if (u == "Gb") return 1e9 / 8;
    die("--report_unit must be one of GB GiB MB MiB Gb");
}

void check(nixl_status_t st, const char *what) {
    if (st != NIXL_SUCCESS) die(std::string(what) + " failed: " + nixlEnumStrings::statusStr(st));
}

}  // namespace

int main(int argc, char **argv) {
    std::string backend_name, operation, protocol, report_unit, file_path;
    uint64_t buffer_size, block_size;
    size_t batch_size;
    double duration;
    bool json = false;
    unsigned poll_sleep_us = 0;
    std::vector<std::string> options;
    po::options_description desc("nixl_bench: a NIXL backend's throughput through NIXL's agent API");
    desc.add_options()("help", "this text")("backend", po::value(&backend_name)->default_value("FERRY"),
                                            "NIXL backend: FERRY, UCX, POSIX, ...")(
        "operation", po::value(&operation)->default_value("read"), "read or write")(
        "protocol", po::value(&protocol)->default_value("tcp"), "FERRY only: Ferry's protocols parameter")(
        "buffer_size", po::value(&buffer_size)->default_value(1ull << 30), "bytes registered on each side")(
        "batch_size", po::value(&batch_size)->default_value(128), "descriptors per transfer")(
        "block_size", po::value(&block_size)->default_value(65536), "bytes per descriptor")(
        "duration", po::value(&duration)->default_value(10), "seconds")(
        "report_unit", po::value(&report_unit)->default_value("GB"), "GB GiB MB MiB Gb")("json", po::bool_switch(&json),
                                                                                         "one JSON line")(
        "poll_sleep_us", po::value(&poll_sleep_us)->default_value(0),
        "sleep between getXferStatus calls (0: busy poll, as NIXL hosts do; NIXL has no blocking wait)")(
        "option", po::value(&options)->composing(), "backend parameter key=value (repeatable)")(
        "file", po::value(&file_path)->default_value("/tmp/nixl_bench.data"), "POSIX only: the file");
    po::variables_map vm;
    try {
        po::store(po::parse_command_line(argc, argv, desc), vm);
        po::notify(vm);
    } catch (const std::exception &e) {
        die(e.what());
    }
    if (vm.count("help")) {
        std::cout << desc << "\n";
        return 0;
    }
    if (operation != "read" && operation != "write") die("--operation must be read or write");
    if (block_size == 0 || batch_size == 0 || block_size * batch_size > buffer_size)
        die("--block_size x --batch_size must fit in --buffer_size");
    const double unit = unit_bytes(report_unit);
    const nixl_xfer_op_t op = operation == "read" ? NIXL_READ : NIXL_WRITE;
    const bool file_backend = backend_name == "POSIX" || backend_name == "GDS" || backend_name == "GDS_MT";

    nixl_b_params_t params;
    if (backend_name == "FERRY") params = {{"protocols", protocol}, {"local_ip", "127.0.0.1"}};
    for (const auto &kv : options) {
        auto eq = kv.find('=');
        if (eq == std::string::npos || eq == 0) die("--option takes key=value, got '" + kv + "'");
        params[kv.substr(0, eq)] = kv.substr(eq + 1);
    }

    nixlAgent initiator("bench-initiator", nixlAgentConfig(false));
    nixlBackendH *ib = nullptr;
    check(initiator.createBackend(backend_name, params, ib), "createBackend on the initiator");
    std::vector<char> local(buffer_size, 1);
    nixl_reg_dlist_t local_reg(DRAM_SEG);
    local_reg.addDesc(nixlBlobDesc(reinterpret_cast<uintptr_t>(local.data()), buffer_size, 0));
    check(initiator.registerMem(local_reg), "registerMem (local)");

    // The far side: the target agent's memory, or the file for a file backend.
    nixlAgent target("bench-target", nixlAgentConfig(false));
    std::vector<char> remote;
    nixl_reg_dlist_t remote_reg(file_backend ? FILE_SEG : DRAM_SEG);
    int fd = -1;
    std::string peer = "bench-target";
    if (file_backend) {
        fd = open(file_path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || ftruncate(fd, static_cast<off_t>(buffer_size)) != 0) die("cannot create " + file_path);
        remote_reg.addDesc(nixlBlobDesc(0, buffer_size, static_cast<uint64_t>(fd)));
        check(initiator.registerMem(remote_reg), "registerMem (file)");
        peer = "bench-initiator";
    } else {
        nixlBackendH *tb = nullptr;
        check(target.createBackend(backend_name, params, tb), "createBackend on the target");
        remote.assign(buffer_size, 2);
        remote_reg.addDesc(nixlBlobDesc(reinterpret_cast<uintptr_t>(remote.data()), buffer_size, 0));
        check(target.registerMem(remote_reg), "registerMem (target)");
        std::string md, name;
        check(target.getLocalMD(md), "getLocalMD");
        check(initiator.loadRemoteMD(md, name), "loadRemoteMD");
    }

    // Requests over successive spans of the buffer, reposted in turn (one in flight).
    const uint64_t span = batch_size * block_size;
    const size_t nreqs = std::max<uint64_t>(1, std::min<uint64_t>(16, buffer_size / span));
    std::vector<nixlXferReqH *> reqs(nreqs, nullptr);
    for (size_t r = 0; r < nreqs; ++r) {
        nixl_xfer_dlist_t l(DRAM_SEG), f(file_backend ? FILE_SEG : DRAM_SEG);
        for (size_t i = 0; i < batch_size; ++i) {
            uint64_t off = r * span + i * block_size;
            l.addDesc(nixlBasicDesc(reinterpret_cast<uintptr_t>(local.data()) + off, block_size, 0));
            if (file_backend) f.addDesc(nixlBasicDesc(off, block_size, static_cast<uint64_t>(fd)));
            else f.addDesc(nixlBasicDesc(reinterpret_cast<uintptr_t>(remote.data()) + off, block_size, 0));
        }
        check(initiator.createXferReq(op, l, f, peer, reqs[r]), "createXferReq");
    }

    uint64_t batches = 0;
    double worst_ms = 0;
    auto t0 = Clock::now(),
         end = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(duration));
    while (Clock::now() < end) {
        nixlXferReqH *req = reqs[batches % nreqs];
        auto b0 = Clock::now();
        nixl_status_t st = initiator.postXferReq(req);
        while (st == NIXL_IN_PROG) {
            if (poll_sleep_us) std::this_thread::sleep_for(std::chrono::microseconds(poll_sleep_us));
            st = initiator.getXferStatus(req);
        }
        if (st != NIXL_SUCCESS) die(std::string("transfer failed: ") + nixlEnumStrings::statusStr(st));
        worst_ms = std::max(worst_ms, std::chrono::duration<double, std::milli>(Clock::now() - b0).count());
        ++batches;
    }
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    double tput = static_cast<double>(batches) * static_cast<double>(span) / secs / unit;
    if (json)
        printf(
            "{\"backend\":\"%s\",\"protocol\":\"%s\",\"operation\":\"%s\",\"block_size\":%llu,\"batch_size\":%zu,"
            "\"poll_sleep_us\":%u,\"duration_s\":%.3f,\"batches\":%llu,\"throughput\":%.3f,\"unit\":\"%s/s\",\"worst_batch_ms\":%.3f}\n",
            backend_name.c_str(), backend_name == "FERRY" ? protocol.c_str() : "", operation.c_str(),
            static_cast<unsigned long long>(block_size), batch_size, poll_sleep_us, secs,
            static_cast<unsigned long long>(batches), tput, report_unit.c_str(), worst_ms);
    else
        printf(
            "backend=%s%s operation=%s block_size=%llu batch_size=%zu: %llu batches in %.2f s, %.2f %s/s, "
            "worst batch %.2f ms\n",
            backend_name.c_str(), backend_name == "FERRY" ? (" protocol=" + protocol).c_str() : "", operation.c_str(),
            static_cast<unsigned long long>(block_size), batch_size, static_cast<unsigned long long>(batches), secs,
            tput, report_unit.c_str(), worst_ms);
    for (auto *r : reqs) initiator.releaseXferReq(r);
    initiator.deregisterMem(local_reg);
    if (file_backend) {
        initiator.deregisterMem(remote_reg);
        close(fd);
        unlink(file_path.c_str());
    } else {
        target.deregisterMem(remote_reg);
    }
    return 0;
}
