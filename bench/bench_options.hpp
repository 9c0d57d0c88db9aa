// transfer_engine_bench's command line: Mooncake's flags, in the forms gflags takes them
// (--flag=value, --flag value, -flag, --noflag, --flag=false, --flagfile=FILE), with Mooncake's
// meaning, plus Ferry's own. Where Ferry has no equivalent the parser says so by name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/engine.hpp"

namespace bench {

struct Options {
    std::string mode = "initiator";
    bool loopback = false;
    std::string metadata_server = "P2PHANDSHAKE";  // Mooncake's form, as typed
    std::string metadata_url;                      // Ferry's form of it
    std::string local_server_name;
    std::string segment_id;
    std::string operation = "read";
    std::string protocol = "tcp";  // as typed
    std::string transport;         // the Ferry transport each request names; empty: the engine picks
    uint64_t buffer_size = 1ull << 30;
    size_t batch_size = 128;
    uint64_t block_size = 65536;
    double duration = 10;
    unsigned threads = 1;
    std::string report_unit = "GB";
    int report_precision = 2;
    // Mooncake's device and topology flags
    std::string device_name;          // RDMA NICs -> rdma.devices
    std::string nic_priority_matrix;  // its NICs -> rdma.devices
    std::string rdma_devices;         // what the two above resolve to
    bool auto_discovery = false;      // every loaded transport, best first
    bool use_vram = false;
    int gpu_id = 0;  // -1: one buffer on every GPU
    bool init_mem = true;
    bool shared_buffers = false;
    bool huge_pages =
        true;  // host buffers ask for transparent huge pages (MADV_HUGEPAGE)  // host buffers from alloc_shared (managed: shm.so maps them)
    std::string backend = "classic";
    // Ferry's own
    bool verify = false;
    bool json = false;
    std::string config;
    std::vector<std::string> options;
    double wait_for_target = 10;
    std::string pattern = "sequential";  // or random: each block's offset drawn uniformly from the thread's span
    size_t inflight_batches = 1;         // batches each thread keeps in flight
    bool sweep = false;
    std::string sweep_block_sizes = "4096,16384,65536,262144,1048576";
    std::string sweep_batch_sizes = "1,16,128";
    std::string sweep_threads = "1,2,4";
    std::string sweep_out = "sweep.json";
    // One line each, printed to stderr before the run: what a Mooncake flag does here.
    std::vector<std::string> notes;
};

// Parses argv; prints help or the error (naming the flag and the fix) and exits on either.
Options parse_options(int argc, char **argv);

// The engine configuration: --config, then the flags, then --option on top.
enum class Role { Target, Initiator, LoopbackInitiator };
ferry::Result<ferry::Config> engine_config(const Options &o, Role role);

double unit_divisor(const std::string &unit);  // 0 for an unknown unit

}  // namespace bench
