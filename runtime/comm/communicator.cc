// Argument checks shared by every communicator, and the size-1 SelfCommunicator.
#include "runtime/comm/communicator.h"

#include <cstdint>
#include <cstring>

#include "graph/error.h"

namespace onnxtrain::runtime {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
  }
  return "?";
}

int64_t comm_element_size(DataType dtype, std::string_view what) {
  int bits = graph::dtype_bits(dtype);
  OT_CHECK(dtype != DataType::kString && bits >= 8 && bits % 8 == 0, what, ": dtype ",
           graph::dtype_short_name(dtype), " cannot be communicated");
  return bits / 8;
}

bool comm_can_reduce(DataType dtype) {
  return dtype == DataType::kFloat || dtype == DataType::kDouble || dtype == DataType::kInt32 ||
         dtype == DataType::kInt64 || dtype == DataType::kBFloat16;
}

void check_comm_args(const void* buf, int64_t count, DataType dtype, bool reduce,
                     std::string_view what) {
  OT_CHECK(count >= 0, what, ": count is negative (", count, ")");
  OT_CHECK(buf != nullptr || count == 0, what, ": buffer is null for count ", count);
  int64_t elem = comm_element_size(dtype, what);
  OT_CHECK(count <= INT64_MAX / elem, what, ": count ", count, " overflows the byte size");
  OT_CHECK(!reduce || comm_can_reduce(dtype), what, ": dtype ", graph::dtype_short_name(dtype),
           " cannot be reduced (sum supports f32, f64, bf16, i32, i64)");
}

void SelfCommunicator::all_reduce(void* buf, int64_t count, DataType dtype, ReduceOp op) {
  check_comm_args(buf, count, dtype, true, "all_reduce");
}

CommHandle SelfCommunicator::all_reduce_async(void* buf, int64_t count, DataType dtype,
                                              ReduceOp op) {
  check_comm_args(buf, count, dtype, true, "all_reduce_async");
  return CommHandle();
}

CommHandle Communicator::broadcast_async(const std::vector<ops::CollectiveBuffer>& bufs,
                                         DataType dtype, int root) {
  for (const ops::CollectiveBuffer& b : bufs) broadcast(b.data, b.count, dtype, root);
  return {};
}

void SelfCommunicator::broadcast(void* buf, int64_t count, DataType dtype, int root) {
  check_comm_args(buf, count, dtype, false, "broadcast");
  OT_CHECK(root == 0, "broadcast: root ", root, " is not a rank of a size-1 communicator");
}

void SelfCommunicator::all_gather(const void* send, void* recv, int64_t count, DataType dtype) {
  check_comm_args(send, count, dtype, false, "all_gather (send)");
  check_comm_args(recv, count, dtype, false, "all_gather (recv)");
  if (count > 0 && send != recv)
    std::memmove(recv, send, static_cast<size_t>(count * comm_element_size(dtype, "")));
}

void SelfCommunicator::reduce_scatter(const void* send, void* recv, int64_t count_per_rank,
                                      DataType dtype, ReduceOp op) {
  check_comm_args(send, count_per_rank, dtype, true, "reduce_scatter (send)");
  check_comm_args(recv, count_per_rank, dtype, true, "reduce_scatter (recv)");
  if (count_per_rank > 0 && send != recv)
    std::memmove(recv, send, static_cast<size_t>(count_per_rank * comm_element_size(dtype, "")));
}

}  // namespace onnxtrain::runtime
