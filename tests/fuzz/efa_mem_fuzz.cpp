// efa.so's export_mem decoder (plugins/efa/memory.cpp: parse_chunks), which reads the
// registration keys a peer put in its segment descriptor. Invariants: a refusal gives a reason;
// accepted chunks are exactly the announced count, non-empty, non-wrapping, sorted by address,
// with the local-only revoked flag cleared.
#include <string>
#include <vector>

#include "fuzz_check.hpp"
#include "memory.hpp"

using namespace ferry_efa;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::vector<RemoteChunk> chunks;
    std::string why;
    if (!parse_chunks(data, size, &chunks, &why)) {
        FUZZ_CHECK(!why.empty(), "refusal without a reason");
        return 0;
    }
    FUZZ_CHECK(size >= sizeof(MemHead) && (size - sizeof(MemHead)) == chunks.size() * sizeof(RemoteChunk),
               "chunk count does not match the bytes");
    for (size_t i = 0; i < chunks.size(); ++i) {
        FUZZ_CHECK(chunks[i].len > 0 && chunks[i].addr + chunks[i].len >= chunks[i].addr, "empty or wrapping chunk");
        FUZZ_CHECK(chunks[i].revoked == 0, "revoked flag taken from the wire");
        if (i > 0) FUZZ_CHECK(chunks[i - 1].addr <= chunks[i].addr, "chunks unsorted");
    }
    return 0;
}
