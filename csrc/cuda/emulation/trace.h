// The device emulation's tracer (runtime.cpp): while it is on, lane 0 of every
// warp records each logical KV block the attention kernels visit, and launches
// run on one CPU thread so the records come out in a fixed order.
#pragma once

#include <cstdint>
#include <vector>

namespace paged_emu {

struct Visit {
  uint32_t block_x, block_y, block_z;  // the thread block (head, sequence, partition)
  int warp;
  int logical_block;
  int64_t physical_block;
};

void trace_start();
std::vector<Visit> trace_stop();
bool tracing();

}  // namespace paged_emu
