#include "op.hpp"

#include "plugin_util.hpp"

namespace ferry_tcp {

void finish_slice(std::vector<ferry_completion_t> &done, Op *op, int status, const char *message) {
    if (status != 0 && !op->failed.exchange(true, std::memory_order_relaxed)) {
        op->status = status;
        copy_message(op->message, message);
    }
    // acq_rel: the last finisher sees the status written by the first failing slice.
    if (op->remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    op->table->release(op->local);
    ferry_completion_t &c = done.emplace_back();  // value-initialised: clears the message too
    c.user_data = op->user_data;
    c.status = op->status;
    if (op->status != 0) copy_message(c.message, op->message);
    OpBlock *block = op->block;
    if (block->live.fetch_sub(1, std::memory_order_acq_rel) == 1) delete block;
}

}  // namespace ferry_tcp
