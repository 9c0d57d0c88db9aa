// transfer_engine_bench's flags: the table of them (Mooncake's, then Ferry's own), read in the
// forms gflags takes, --help, the checks parse_options makes once all are read, and the engine
// configuration they make. What Mooncake's flags mean here is bench_mooncake_flags.cpp's.
#include "bench_options.hpp"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "bench_options_detail.hpp"

namespace bench {

[[noreturn]] void usage_error(const std::string &what) {
    std::fprintf(stderr, "transfer_engine_bench: %s\n", what.c_str());
    std::exit(1);
}

std::string lower(std::string s) {
    for (char &c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

namespace {

// A setter returns the error text for a value it cannot take, empty when it took it.
using Setter = std::function<std::string(const std::string &)>;

struct Flag {
    std::string name;
    bool boolean;
    std::string default_text;
    std::string help;
    Setter set;
    bool mooncake;  // a flag of Mooncake's transfer_engine_bench (listed first in --help)
};

// gflags' boolean spellings.
bool parse_bool(const std::string &text, bool &out) {
    std::string t = lower(text);
    if (t == "true" || t == "t" || t == "yes" || t == "y" || t == "1") return out = true, true;
    if (t == "false" || t == "f" || t == "no" || t == "n" || t == "0") return out = false, true;
    return false;
}

// Decimal, or hexadecimal after 0x, as gflags reads integers; within [lo, hi].
template <class T>
Setter integer(T &target, long long lo, unsigned long long hi) {
    return [&target, lo, hi](const std::string &text) -> std::string {
        bool negative = !text.empty() && text[0] == '-';
        std::string digits = negative ? text.substr(1) : text;
        int base = digits.size() > 2 && digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X') ? 16 : 10;
        if (digits.empty() || !std::isxdigit(static_cast<unsigned char>(digits[0]))) return "is not an integer";
        errno = 0;
        char *end = nullptr;
        unsigned long long v = std::strtoull(digits.c_str(), &end, base);
        if (*end || errno) return "is not an integer";
        bool in_range = negative ? lo < 0 && v <= static_cast<unsigned long long>(-(lo + 1)) + 1
                                 : v <= hi && (lo <= 0 || v >= static_cast<unsigned long long>(lo));
        if (!in_range) return "is out of range (" + std::to_string(lo) + ".." + std::to_string(hi) + ")";
        target = negative ? static_cast<T>(-static_cast<long long>(v)) : static_cast<T>(v);
        return {};
    };
}

Setter real(double &target) {
    return [&target](const std::string &text) -> std::string {
        char *end = nullptr;
        double v = std::strtod(text.c_str(), &end);
        if (text.empty() || *end) return "is not a number";
        target = v;
        return {};
    };
}

Setter string(std::string &target) {
    return [&target](const std::string &text) {
        target = text;
        return std::string();
    };
}

Setter boolean(bool &target) {
    return [&target](const std::string &text) -> std::string {
        return parse_bool(text, target) ? "" : "is not a boolean (true/false, 1/0, yes/no)";
    };
}

// Flags that exist elsewhere in Mooncake's tooling, each with what to use instead.
const std::map<std::string, std::string> kElsewhere = {
    {"segment_size",
     "is not a flag of Mooncake's transfer_engine_bench either (its ub transport docs show it); "
     "the size each side registers is --buffer_size"},
};
const std::set<std::string> kTebench = {
    "xport_type",          "seg_type",          "seg_type_mix",      "local_gpu_id",
    "target_gpu_id",       "op_type",           "target_seg_name",   "seg_name",
    "metadata_type",       "metadata_url_list", "total_buffer_size", "start_block_size",
    "max_block_size",      "start_batch_size",  "max_batch_size",    "start_num_threads",
    "max_num_threads",     "check_consistency", "target_offset",     "target_range_size",
    "request_interval_us", "tent_intent_type"};
// glog's flags, which Mooncake's binaries take; Ferry logs through its own logger.
const std::set<std::string> kGlog = {
    "v",       "vmodule",     "logtostderr", "alsologtostderr", "colorlogtostderr", "minloglevel", "stderrthreshold",
    "log_dir", "logbuflevel", "logbufsecs",  "max_log_size"};

size_t edit_distance(const std::string &a, const std::string &b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            size_t up = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
            diag = up;
        }
    }
    return row[b.size()];
}

class Parser {
public:
    explicit Parser(Options &o);
    void parse(std::vector<std::string> args, int depth = 0);
    bool given(const std::string &name) const { return seen_.count(name) != 0; }
    void print_help() const;

private:
    const Flag *find(const std::string &name) const {
        for (auto &f : flags_)
            if (f.name == name) return &f;
        return nullptr;
    }
    void apply(const Flag &f, const std::string &value, const std::string &as_typed) {
        if (std::string e = f.set(value); !e.empty()) usage_error(as_typed + ": '" + value + "' " + e);
        seen_.insert(f.name);
    }
    [[noreturn]] void unknown(const std::string &name, const std::string &as_typed) const;

    Options &o_;
    std::vector<Flag> flags_;
    std::set<std::string> seen_;
    bool help_ = false;

public:
    bool help() const { return help_; }
};

Parser::Parser(Options &o) : o_(o) {
    auto add = [&](std::string name, bool is_bool, std::string def, std::string help, Setter set, bool mooncake) {
        flags_.push_back({std::move(name), is_bool, std::move(def), std::move(help), std::move(set), mooncake});
    };
    // Mooncake's transfer_engine_bench flags (mooncake-transfer-engine/example/transfer_engine_bench.cpp).
    add("mode", false, o.mode, "initiator | target | loopback (Ferry: both in this one process)", string(o.mode), true);
    add("metadata_server", false, o.metadata_server,
        "P2PHANDSHAKE (each engine serves its own descriptor; segments are ip:port); etcd: "
        "etcd://host:2379[,host:2379...][/prefix], or host:2379 as Mooncake reads it; etcds://... for etcd over TLS "
        "(docs/DEPLOYMENT.md; etcd_* keys of --option/--config for certificates and users); "
        "redis://[user[:password]@]host:6379[/db] (MC_REDIS_USERNAME, MC_REDIS_PASSWORD, MC_REDIS_DB_INDEX as in "
        "Mooncake, or redis_* keys); http://host:8080/metadata (Mooncake's HTTP metadata server)",
        string(o.metadata_server), true);
    add("local_server_name", false, "127.0.0.1, any port; a target's with a metadata server: the hostname",
        "this engine's name: with P2PHANDSHAKE the ip[:port] it listens on, with etcd, Redis or HTTP its segment name",
        string(o.local_server_name), true);
    add("segment_id", false, "",
        "initiator: the target's segment (ip:port with P2PHANDSHAKE, its name with etcd), or file:/path (file.so, gds.so)",
        string(o.segment_id), true);
    add("operation", false, o.operation, "read | write", string(o.operation), true);
    add("protocol", false, o.protocol,
        "transport every request names: Ferry's tcp, shm, efa, rdma, cuda_ipc, hip_ipc, file, gds, or Mooncake's "
        "names for them (nvlink_intra and nvlink: cuda_ipc, hip: hip_ipc, io_uring: file)",
        string(o.protocol), true);
    add("device_name", false, "",
        "RDMA NICs, comma-separated (rdma.devices); alone it selects --protocol=rdma, "
        "Mooncake's default",
        string(o.device_name), true);
    add("nic_priority_matrix", false, "",
        "Mooncake's NIC priority matrix (JSON file): the NICs it names become "
        "rdma.devices",
        string(o.nic_priority_matrix), true);
    add("auto_discovery", true, "false",
        "let the engine pick the transport for each request (every loaded plugin, "
        "best first) instead of --protocol",
        boolean(o.auto_discovery), true);
    add("buffer_size", false, std::to_string(o.buffer_size), "bytes each buffer holds (one per GPU with --gpu_id=-1)",
        integer(o.buffer_size, 1, UINT64_MAX), true);
    add("batch_size", false, std::to_string(o.batch_size), "ops per batch", integer(o.batch_size, 1, 1u << 24), true);
    add("block_size", false, std::to_string(o.block_size), "bytes per op", integer(o.block_size, 1, UINT64_MAX), true);
    add("duration", false, "10", "seconds", real(o.duration), true);
    add("threads", false, std::to_string(o.threads),
        "initiator threads, each with its own batches (Mooncake's default: 12)", integer(o.threads, 1, 4096), true);
    add("report_unit", false, o.report_unit, "GB GiB Gb MB MiB Mb KB KiB Kb", string(o.report_unit), true);
    add("report_precision", false, "2", "digits after the point", integer(o.report_precision, 0, 17), true);
    add("use_vram", true, "false; true when --gpu_id is given",
        "each side's buffer in GPU memory (CUDA or ROCm, found at run time)", boolean(o.use_vram), true);
    add("gpu_id", false, "0", "the GPU of --use_vram; -1: one buffer on every GPU, thread i on buffer i % GPUs",
        integer(o.gpu_id, -1, 1 << 20), true);
    add("init_mem", true, "true",
        "fill the buffers before the run (Ferry: with --verify's pattern; --verify fills "
        "regardless)",
        boolean(o.init_mem), true);
    add("backend", false, o.backend, "classic | tent: Ferry has one engine, either measures it", string(o.backend),
        true);
    // Ferry's.
    add("loopback", true, "false", "target and initiator in this one process (same as --mode=loopback)",
        boolean(o.loopback), false);
    add("verify", true, "false", "check every byte moved (through host copies for GPU memory)", boolean(o.verify),
        false);
    add("json", true, "false", "print one JSON object instead of text", boolean(o.json), false);
    add("shared_buffers", true, "false",
        "host buffers allocated with the engine's alloc_shared (memfd-backed managed buffers, which shm.so maps "
        "into peers: transfers are one memcpy)",
        boolean(o.shared_buffers), false);
    add("huge_pages", true, "true",
        "host buffers ask for transparent huge pages (MADV_HUGEPAGE) before they are faulted in; false: 4 KiB "
        "pages where THP is 'madvise' (docs/PERFORMANCE.md, \"Host buffers and huge pages\")",
        boolean(o.huge_pages), false);
    add(
        "metrics_port", false, "off",
        "serve the engine's Prometheus metrics on this port (0: any free one; the bench prints where), as the engine "
        "key metrics_port (docs/METRICS.md)",
        [&o](const std::string &v) {
            o.options.push_back("metrics_port=" + v);
            return std::string();
        },
        false);
    add("config", false, "", "engine YAML config file", string(o.config), false);
    add(
        "option", false, "", "engine or transport option key=value, e.g. tcp.lanes=2 (repeatable)",
        [&o](const std::string &v) {
            o.options.push_back(v);
            return std::string();
        },
        false);
    add("wait_for_target", false, "10", "initiator: seconds to wait for a target that is not up yet (0: fail at once)",
        real(o.wait_for_target), false);
    add("pattern", false, o.pattern, "sequential | random (blocks drawn uniformly, as fio's randread)",
        string(o.pattern), false);
    add("inflight_batches", false, "1", "batches each thread keeps in flight (depth = this x --batch_size)",
        integer(o.inflight_batches, 1, 4096), false);
    add("sweep", true, "false", "measure every block size x batch size x threads below, --duration each",
        boolean(o.sweep), false);
    add("sweep_block_sizes", false, o.sweep_block_sizes, "bytes, comma list", string(o.sweep_block_sizes), false);
    add("sweep_batch_sizes", false, o.sweep_batch_sizes, "ops per batch, comma list", string(o.sweep_batch_sizes),
        false);
    add("sweep_threads", false, o.sweep_threads, "threads, comma list", string(o.sweep_threads), false);
    add("sweep_out", false, o.sweep_out, "where --sweep writes its JSON", string(o.sweep_out), false);
}

void Parser::unknown(const std::string &name, const std::string &as_typed) const {
    if (auto it = kElsewhere.find(name); it != kElsewhere.end()) usage_error(as_typed + " " + it->second);
    if (kTebench.count(name))
        usage_error(as_typed +
                    " is a flag of Mooncake's tebench (the TENT benchmark), not of transfer_engine_bench; "
                    "see --help for the flags this bench takes");
    std::string best;
    size_t best_d = 3;
    for (auto &f : flags_)
        if (size_t d = edit_distance(name, f.name); d < best_d) best_d = d, best = f.name;
    usage_error("unknown flag " + as_typed + " (neither Mooncake's transfer_engine_bench nor Ferry's has it)" +
                (best.empty() ? "" : "; did you mean --" + best + "?") + "; see --help");
}

void Parser::parse(std::vector<std::string> args, int depth) {
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string &arg = args[i];
        if (arg == "--") {
            if (i + 1 < args.size()) usage_error("unexpected argument '" + args[i + 1] + "' after --");
            return;
        }
        if (arg.size() < 2 || arg[0] != '-')
            usage_error("unexpected argument '" + arg + "'; flags are written --name=value (see --help)");
        std::string body = arg.substr(arg[1] == '-' ? 2 : 1);  // gflags takes -flag as --flag
        auto eq = body.find('=');
        std::string name = body.substr(0, eq);
        std::replace(name.begin(), name.end(), '-', '_');  // --auto-discovery, as Mooncake's docs write it
        std::optional<std::string> value;
        if (eq != std::string::npos) value = body.substr(eq + 1);
        std::string as_typed = arg.substr(0, arg.find('='));
        if (name == "help" || name == "h" || name == "helpfull" || name == "helpshort") {
            help_ = true;
            continue;
        }
        if (name == "flagfile") {  // gflags: one flag per line, # comments
            if (!value) {
                if (i + 1 >= args.size()) usage_error("--flagfile needs a file name");
                value = args[++i];
            }
            std::ifstream in(*value);
            if (!in) usage_error("--flagfile=" + *value + ": cannot read it: " + strerror(errno));
            if (depth > 8) usage_error("--flagfile=" + *value + ": flag files nest more than 8 deep");
            std::vector<std::string> lines;
            for (std::string line; std::getline(in, line);) {
                line.erase(0, line.find_first_not_of(" \t\r"));
                line.erase(line.find_last_not_of(" \t\r") + 1);
                if (!line.empty() && line[0] != '#') lines.push_back(line);
            }
            parse(lines, depth + 1);
            continue;
        }
        if (kGlog.count(name)) {
            o_.notes.push_back(as_typed +
                               " is glog's; Ferry logs to stderr at FERRY_LOG_LEVEL (error, warn, info, "
                               "debug, trace) or --option log_level=...; ignored");
            if (!value && name != "logtostderr" && name != "alsologtostderr" && name != "colorlogtostderr" &&
                i + 1 < args.size() && args[i + 1][0] != '-')
                ++i;  // its value
            continue;
        }
        const Flag *f = find(name);
        if (!f && name.rfind("no", 0) == 0) {  // --noflag
            const Flag *b = find(name.substr(2));
            if (b && b->boolean) {
                if (value) usage_error(as_typed + " takes no value; write --" + b->name + "=" + *value);
                apply(*b, "false", as_typed);
                continue;
            }
        }
        if (!f) unknown(name, as_typed);
        if (f->boolean) {
            // --flag alone is true; `--flag false` (a boolean word next) is taken as its value,
            // since no one types it meaning true.
            bool b;
            if (!value && i + 1 < args.size() && parse_bool(args[i + 1], b)) value = args[++i];
            apply(*f, value.value_or("true"), as_typed);
            continue;
        }
        if (!value) {
            bool next_is_flag = i + 1 < args.size() && args[i + 1].rfind("--", 0) == 0;
            if (i + 1 >= args.size() || next_is_flag)
                usage_error(as_typed + " is missing its value; write " + as_typed + "=VALUE");
            value = args[++i];
        }
        apply(*f, *value, as_typed);
    }
}

void Parser::print_help() const {
    std::ostringstream out;
    out << "usage: transfer_engine_bench [flags]\n"
           "  transfer_engine_bench --loopback                       target and initiator in one process\n"
           "  transfer_engine_bench --mode=target --local_server_name=127.0.0.1:7000\n"
           "  transfer_engine_bench --mode=initiator --segment_id=127.0.0.1:7000\n"
           "  transfer_engine_bench --loopback --sweep --duration=1  then bench/plot_sweep.py sweep.json\n"
           "Flags are written as gflags takes them: --flag=value, --flag value, -flag=value; booleans also\n"
           "--flag, --noflag, --flag=false; --flagfile=FILE reads one flag per line.\n";
    for (bool mooncake : {true, false}) {
        out << (mooncake ? "\nMooncake's transfer_engine_bench flags:\n" : "\nFerry's flags:\n");
        for (auto &f : flags_) {
            if (f.mooncake != mooncake) continue;
            std::string head = "  --" + f.name;
            std::string text = f.help + (f.default_text.empty() ? "" : " (default: " + f.default_text + ")");
            out << head << std::string(head.size() < 24 ? 24 - head.size() : 1, ' ');
            size_t col = std::max<size_t>(head.size() + 1, 24);
            bool line_start = true;
            std::istringstream words(text);
            for (std::string w; words >> w;) {  // wrapped at 100 columns, under the help column
                if (!line_start && col + 1 + w.size() > 100) {
                    out << "\n" << std::string(24, ' ');
                    col = 24;
                    line_start = true;
                }
                if (!line_start) out << ' ', ++col;
                out << w;
                col += w.size();
                line_start = false;
            }
            out << "\n";
        }
    }
    out << "\nEnvironment:\n"
        << "  FERRY_PLUGIN_PATH     colon list of plugin directories searched first; a build tree needs none\n"
        << "                        (build/core/ferry/plugins), an install looks in <libdir>/ferry/plugins\n"
        << "  FERRY_PLUGINS         load only these plugins (tcp,shm) or all but these (^efa)\n"
        << "  FERRY_LOG_LEVEL       error, warn (default), info, debug, trace\n"
        << "  FERRY_AUTH_SECRET     cluster secret (>= 16 bytes) peers must share; FERRY_AUTH_SECRET_FILE: from a file\n"
        << "  FERRY_HOST_ID         which peers count as the same host (default: machine id + boot id)\n"
        << "  FERRY_EFA_PROVIDER    libfabric provider for efa.so (default efa; tcp to run without EFA)\n"
        << "  FERRY_LIBCUDA         the CUDA driver library --use_vram loads (default libcuda.so.1)\n"
        << "build/core/ferry-info shows which plugins load and why the others do not.\n";
    std::cout << out.str();
}

}  // namespace

double unit_divisor(const std::string &unit) {
    static const std::map<std::string, double> units = {{"GB", 1e9},
                                                        {"GiB", 1024.0 * 1024 * 1024},
                                                        {"Gb", 1e9 / 8},
                                                        {"MB", 1e6},
                                                        {"MiB", 1024.0 * 1024},
                                                        {"Mb", 1e6 / 8},
                                                        {"KB", 1e3},
                                                        {"KiB", 1024.0},
                                                        {"Kb", 1e3 / 8}};
    auto it = units.find(unit);
    return it == units.end() ? 0 : it->second;
}

Options parse_options(int argc, char **argv) {
    Options o;
    Parser p(o);
    p.parse(std::vector<std::string>(argv + 1, argv + argc));
    if (p.help()) {
        p.print_help();
        std::exit(0);
    }
    if (o.loopback) o.mode = "loopback";
    if (o.mode != "target" && o.mode != "initiator" && o.mode != "loopback")
        usage_error("--mode must be initiator, target or loopback, got '" + o.mode + "'");
    if (o.operation != "read" && o.operation != "write")
        usage_error("--operation must be read or write, got '" + o.operation + "'");
    if (o.backend != "classic" && o.backend != "tent")
        usage_error("--backend must be classic or tent, got '" + o.backend + "'");
    if (p.given("backend") && o.backend == "tent")
        o.notes.push_back("--backend=tent: Ferry has one engine; it is measured as with classic");
    if (o.duration <= 0) usage_error("--duration must be positive");
    if (o.wait_for_target < 0) usage_error("--wait_for_target must be 0 or more");
    if (o.block_size > o.buffer_size) usage_error("--block_size is larger than --buffer_size");
    if (unit_divisor(o.report_unit) == 0) usage_error("--report_unit must be one of GB GiB Gb MB MiB Mb KB KiB Kb");
    resolve_mooncake_flags(o, [&](const std::string &name) { return p.given(name); });
    if (o.pattern != "sequential" && o.pattern != "random") usage_error("--pattern must be sequential or random");
    if (o.mode == "initiator" && o.segment_id.empty())
        usage_error("--mode=initiator needs --segment_id=<the target's segment: ip:port with P2PHANDSHAKE>");
    return o;
}

// Mooncake's engine reads Redis credentials from MC_REDIS_USERNAME, MC_REDIS_PASSWORD and
// MC_REDIS_DB_INDEX; the URL's user:password@ and /db win over them, as there.
static void redis_from_environment(const std::string &url, ferry::Config &c) {
    const std::string rest = url.substr(std::string("redis://").size());
    const auto slash = rest.find('/');
    const bool url_credentials = rest.substr(0, slash).find('@') != std::string::npos;
    const bool url_db = slash != std::string::npos && slash + 1 < rest.size();
    auto take = [&](const char *var, const char *key, bool skip) {
        const char *v = std::getenv(var);
        if (v && *v && !skip && !c.count(key)) c[key] = v;
    };
    take("MC_REDIS_USERNAME", "redis_user", url_credentials);
    take("MC_REDIS_PASSWORD", "redis_password", url_credentials || c.count("redis_password_file"));
    take("MC_REDIS_DB_INDEX", "redis_db", url_db);
}

ferry::Result<ferry::Config> engine_config(const Options &o, Role role) {
    ferry::Config c;
    if (!o.config.empty()) {
        auto file = ferry::load_yaml_config(o.config);
        if (!file) return std::unexpected(file.error());
        c = *file;
    }
    c["metadata"] = o.metadata_url;
    const bool p2p = o.metadata_url.empty() || o.metadata_url == "P2PHANDSHAKE";
    // One name per engine: in loopback the target takes it, the initiator gets its own.
    if (!o.local_server_name.empty() && role != Role::LoopbackInitiator) {
        const std::string &n = o.local_server_name;
        if (p2p && n.find(':') == std::string::npos) {
            // Mooncake listens on the named host at a port of its choosing: the same here.
            addrinfo hints{}, *res = nullptr;
            hints.ai_family = AF_INET;
            if (int rc = getaddrinfo(n.c_str(), nullptr, &hints, &res); rc != 0)
                return ferry::fail(-EINVAL, "--local_server_name=" + n + ": " + gai_strerror(rc));
            char ip[NI_MAXHOST];
            int rc = getnameinfo(res->ai_addr, res->ai_addrlen, ip, sizeof ip, nullptr, 0, NI_NUMERICHOST);
            freeaddrinfo(res);
            if (rc != 0) return ferry::fail(-EINVAL, "--local_server_name=" + n + ": " + gai_strerror(rc));
            c["local_ip"] = ip;
            c["rpc_port"] = "0";
        } else {
            c["local_server_name"] = n;
        }
    }
    if (o.local_server_name.empty() && role == Role::Target && !p2p) {
        // Mooncake names a target by its hostname, which its initiators' --segment_id then gives.
        char host[256] = {};
        if (gethostname(host, sizeof host - 1) == 0 && host[0]) c["local_server_name"] = host;
    }
    if (!o.rdma_devices.empty()) c["rdma.devices"] = o.rdma_devices;
    for (const auto &kv : o.options) {
        auto eq = kv.find('=');
        if (eq == std::string::npos || eq == 0)
            return ferry::fail(-EINVAL, "--option takes key=value, got '" + kv + "'");
        c[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    if (o.metadata_url.rfind("redis://", 0) == 0) redis_from_environment(o.metadata_url, c);
    return c;
}

}  // namespace bench
