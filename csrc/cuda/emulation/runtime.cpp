// The scheduler of the device emulation (emulation.h): a grid's thread blocks on
// CPU threads, each thread block's CUDA threads as fibers on one CPU thread.
//
// A fiber runs until it reaches a barrier or a warp exchange that other threads
// have not reached yet; then it hands the CPU thread to the next fiber, round
// robin, that can run (fresh, or waiting on a barrier that has since completed).
// The thread that completes a barrier computes its result and runs on. When no
// fiber can run and some have not finished, the thread block is deadlocked: the
// launch fails with a message saying where each thread waits. The order is fixed,
// so a run is deterministic; thread blocks are independent, so running them on
// several CPU threads changes nothing but the time.
//
// Switching: a few instructions of assembly on x86-64 (the callee-saved
// registers and the stack pointer), swapcontext elsewhere (a system call per
// switch, about ten times slower). Each fiber has a 64 KiB stack below a guard page.
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "emulation.h"
#include "trace.h"

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

#if defined(__x86_64__) && defined(__ELF__)
#define PAGED_EMU_ASM_SWITCH 1
// paged_emu_switch(&from_sp, to_sp): push the callee-saved registers, save the
// stack pointer, load the other fiber's and pop its registers; `ret` resumes it.
extern "C" void paged_emu_switch(void** from_sp, void* to_sp);
asm(R"(
  .text
  .globl paged_emu_switch
  .hidden paged_emu_switch
  .type paged_emu_switch, @function
paged_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size paged_emu_switch, .-paged_emu_switch
)");
#else
#define PAGED_EMU_ASM_SWITCH 0
#endif

namespace paged_emu {
namespace {

constexpr size_t kStackBytes = 64 * 1024;
constexpr int kMaxThreads = 1024;
constexpr int kWarp = 32;

enum class Wait { kRunnable, kBlock, kWarp, kDone };

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::kSyncWarp: return "__syncwarp";
    case WarpOp::kShfl: return "__shfl_sync";
    case WarpOp::kShflXor: return "__shfl_xor_sync";
  }
  return "?";
}

struct Context {
  void* sp = nullptr;  // the assembly switch's saved stack pointer
#if !PAGED_EMU_ASM_SWITCH
  ucontext_t uc;
#endif
};

struct Fiber {
  Context ctx;
  uint3 idx{};
  Wait wait = Wait::kRunnable;
  uint64_t gen = 0;  // the generation of the barrier it waits on
  char* stack = nullptr;
};

struct Warp {
  unsigned arrived = 0, mask = 0;
  WarpOp op = WarpOp::kSyncWarp;
  uint64_t gen = 0;
  uint32_t value[kWarp], result[kWarp];
  int arg[kWarp], width[kWarp];
};

// One CPU thread's state: the thread block it runs now.
struct BlockRun {
  std::vector<Fiber> fibers;
  Warp warps[kMaxThreads / kWarp];
  int num_threads = 0;
  int current = -1;  // the running fiber; -1: the CPU thread's own stack
  int block_arrived = 0;
  uint64_t block_gen = 0;
  Context main;
  const std::function<void()>* body = nullptr;
  std::string error;

  ~BlockRun() {
    for (Fiber& f : fibers) munmap(f.stack - page(), kStackBytes + page());
  }
  static size_t page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }
};

thread_local BlockRun* g_run = nullptr;

void fiber_entry();

void prepare(BlockRun& r, int i) {
  Fiber& f = r.fibers[i];
  f.wait = Wait::kRunnable;
  f.gen = 0;
#if PAGED_EMU_ASM_SWITCH
  // The first switch pops six registers, then returns into fiber_entry with the
  // stack aligned as after a call (rsp + 8 a multiple of 16).
  auto top = reinterpret_cast<uintptr_t>(f.stack + kStackBytes) & ~uintptr_t{15};
  void** sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;                                  // fiber_entry's return address: never used
  *--sp = reinterpret_cast<void*>(&fiber_entry);    // where `ret` goes
  for (int k = 0; k < 6; ++k) *--sp = nullptr;      // rbp, rbx, r12-r15
  f.ctx.sp = sp;
#else
  getcontext(&f.ctx.uc);
  f.ctx.uc.uc_stack.ss_sp = f.stack;
  f.ctx.uc.uc_stack.ss_size = kStackBytes;
  f.ctx.uc.uc_link = nullptr;
  makecontext(&f.ctx.uc, &fiber_entry, 0);
#endif
}

void jump(Context& from, Context& to) {
#if PAGED_EMU_ASM_SWITCH
  paged_emu_switch(&from.sp, to.sp);
#else
  swapcontext(&from.uc, &to.uc);
#endif
}

bool runnable(const BlockRun& r, const Fiber& f) {
  switch (f.wait) {
    case Wait::kRunnable: return true;
    case Wait::kBlock: return r.block_gen != f.gen;
    case Wait::kWarp: return r.warps[(&f - r.fibers.data()) / kWarp].gen != f.gen;
    case Wait::kDone: return false;
  }
  return false;
}

std::string hex(unsigned mask) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", mask);
  return buf;
}

std::string ranges(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    s += (s.empty() ? "" : ", ") + std::to_string(ids[i]) + (j > i ? "-" + std::to_string(ids[j]) : "");
    i = j + 1;
  }
  return s;
}

// Where every thread of a deadlocked thread block stands.
std::string deadlock_report(const BlockRun& r) {
  std::vector<int> at_block, done;
  for (int i = 0; i < r.num_threads; ++i) {
    if (r.fibers[i].wait == Wait::kBlock) at_block.push_back(i);
    if (r.fibers[i].wait == Wait::kDone) done.push_back(i);
  }
  std::string s = "deadlock: no thread can continue";
  if (!at_block.empty()) s += "; threads " + ranges(at_block) + " wait at __syncthreads";
  for (int w = 0; w * kWarp < r.num_threads; ++w) {
    const Warp& wp = r.warps[w];
    if (wp.arrived == 0) continue;
    std::vector<int> in, missing;
    for (int l = 0; l < kWarp; ++l) {
      if (wp.arrived >> l & 1u) in.push_back(l);
      else if (wp.mask >> l & 1u) missing.push_back(l);
    }
    s += "; warp " + std::to_string(w) + " lanes " + ranges(in) + " wait at " + op_name(wp.op) +
         " for lanes " + ranges(missing);
  }
  if (!done.empty()) s += "; threads " + ranges(done) + " have exited";
  return s;
}

void fail(BlockRun& r, const std::string& what) {
  r.error = what;
  jump(r.fibers[r.current].ctx, r.main);  // never resumed: the block is abandoned
}

// The current fiber cannot continue: run the next one that can, or return to
// the CPU thread when all have finished (or none can: a deadlock).
void yield(BlockRun& r) {
  const int n = r.num_threads, from = r.current;
  for (int k = 1; k <= n; ++k) {
    const int i = ((from < 0 ? -1 : from) + k) % n;
    if (i == from) break;
    if (runnable(r, r.fibers[i])) {
      r.current = i;
      threadIdx = r.fibers[i].idx;
      jump(from < 0 ? r.main : r.fibers[from].ctx, r.fibers[i].ctx);
      return;  // this fiber was resumed
    }
  }
  if (from >= 0 && runnable(r, r.fibers[from])) return;
  bool all_done = true;
  for (int i = 0; i < n; ++i) all_done = all_done && r.fibers[i].wait == Wait::kDone;
  if (!all_done) r.error = deadlock_report(r);
  if (from >= 0) jump(r.fibers[from].ctx, r.main);
}

void fiber_entry() {
  BlockRun& r = *g_run;
  (*r.body)();
  r.fibers[r.current].wait = Wait::kDone;
  yield(r);
  std::abort();  // a finished fiber is never resumed
}

void run_block(BlockRun& r, int num_threads, const std::function<void()>& body) {
  while (static_cast<int>(r.fibers.size()) < num_threads) {
    const size_t page = BlockRun::page();
    void* mem = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) throw std::runtime_error("device emulation: out of memory for fiber stacks");
    mprotect(mem, page, PROT_NONE);  // an overflow faults instead of corrupting the next stack
    r.fibers.emplace_back();
    r.fibers.back().stack = static_cast<char*>(mem) + page;
  }
  r.num_threads = num_threads;
  r.body = &body;
  r.block_arrived = 0;
  r.error.clear();
  for (int w = 0; w * kWarp < num_threads; ++w) r.warps[w].arrived = 0;
  for (int i = 0; i < num_threads; ++i) {
    r.fibers[i].idx = uint3{i % blockDim.x, (i / blockDim.x) % blockDim.y, i / (blockDim.x * blockDim.y)};
    prepare(r, i);
  }
  r.current = -1;
  yield(r);  // returns here when the block has finished or failed
  r.current = -1;
}

std::mutex g_trace_mutex;
std::atomic<bool> g_tracing{false};
std::vector<Visit> g_trace;

std::mutex g_error_mutex;
thread_local std::string g_error_text;
thread_local cudaError_t g_last_error = cudaSuccess;
std::string g_launch_error;  // the text of the latest cudaErrorLaunchFailure

int worker_count(int64_t num_blocks) {
  int n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (const char* env = std::getenv("PAGED_EMULATION_THREADS")) n = std::max(1, std::atoi(env));
  if (tracing()) n = 1;  // one CPU thread: the trace comes out in launch order
  return static_cast<int>(std::min<int64_t>(n, num_blocks));
}

}  // namespace

void trace_start() {
  const std::lock_guard<std::mutex> lock(g_trace_mutex);
  g_trace.clear();
  g_tracing = true;
}

std::vector<Visit> trace_stop() {
  const std::lock_guard<std::mutex> lock(g_trace_mutex);
  g_tracing = false;
  return std::move(g_trace);
}

bool tracing() { return g_tracing; }

void trace_visit(int logical_block, int64_t physical_block) {
  if (!g_tracing || threadIdx.x % kWarp != 0) return;
  const std::lock_guard<std::mutex> lock(g_trace_mutex);
  g_trace.push_back(Visit{blockIdx.x, blockIdx.y, blockIdx.z, static_cast<int>(threadIdx.x / kWarp), logical_block,
                          physical_block});
}

void sync_threads() {
  BlockRun& r = *g_run;
  Fiber& f = r.fibers[r.current];
  if (++r.block_arrived == r.num_threads) {  // the last to arrive releases the others
    r.block_arrived = 0;
    ++r.block_gen;
    return;
  }
  f.wait = Wait::kBlock;
  f.gen = r.block_gen;
  yield(r);
  f.wait = Wait::kRunnable;
}

uint32_t warp_exchange(WarpOp op, unsigned mask, uint32_t value, int arg, int width) {
  BlockRun& r = *g_run;
  const int id = r.current, lane = id % kWarp;
  Warp& w = r.warps[id / kWarp];
  auto who = [&] {
    return "thread " + std::to_string(id) + " (warp " + std::to_string(id / kWarp) + " lane " +
           std::to_string(lane) + ") at " + op_name(op);
  };
  if (!(mask >> lane & 1u)) fail(r, who() + ": its mask " + hex(mask) + " leaves its own lane out");
  if (width < 1 || width > kWarp || (width & (width - 1)) != 0)
    fail(r, who() + ": width " + std::to_string(width) + " is not a power of two <= 32");
  if (w.arrived == 0) {
    w.mask = mask;
    w.op = op;
  } else if (w.mask != mask || w.op != op) {
    fail(r, who() + " with mask " + hex(mask) + ", but other lanes wait at " + op_name(w.op) + " with mask " +
                hex(w.mask));
  }
  w.value[lane] = value;
  w.arg[lane] = arg;
  w.width[lane] = width;
  w.arrived |= 1u << lane;
  Fiber& f = r.fibers[id];
  if (w.arrived != mask) {
    f.wait = Wait::kWarp;
    f.gen = w.gen;
    yield(r);
    f.wait = Wait::kRunnable;
    return w.result[lane];
  }
  // The last lane of the mask: every lane's result, then release them.
  for (int l = 0; l < kWarp; ++l) {
    if (!(mask >> l & 1u)) continue;
    const int wd = w.width[l], segment = l & ~(wd - 1);
    int src = l;
    if (op == WarpOp::kShfl) src = segment | (w.arg[l] & (wd - 1));
    if (op == WarpOp::kShflXor) {
      src = l ^ w.arg[l];
      if (src < 0 || src >= segment + wd) src = l;  // later segments read their own value
    }
    if (op != WarpOp::kSyncWarp && !(mask >> src & 1u))
      fail(r, "warp " + std::to_string(id / kWarp) + " lane " + std::to_string(l) + " at " + op_name(op) +
                  " reads lane " + std::to_string(src) + ", outside the mask (undefined on a GPU)");
    w.result[l] = w.value[src];
  }
  w.arrived = 0;
  ++w.gen;
  return w.result[lane];
}

cudaError_t run_grid(dim3 grid, dim3 block, const std::function<void()>& body) {
  const int64_t threads = int64_t{block.x} * block.y * block.z;
  const int64_t blocks = int64_t{grid.x} * grid.y * grid.z;
  if (threads < 1 || threads > kMaxThreads || grid.y > 65535 || grid.z > 65535) {
    g_last_error = cudaErrorInvalidConfiguration;
    return g_last_error;
  }
  if (blocks == 0) return cudaSuccess;
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::string first_error;
  auto work = [&] {
    BlockRun run;
    g_run = &run;
    blockDim = block;
    gridDim = grid;
    for (int64_t b; !failed && (b = next++) < blocks;) {
      blockIdx = uint3{static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
                       static_cast<unsigned>(b / (int64_t{grid.x} * grid.y))};
      run_block(run, static_cast<int>(threads), body);
      if (!run.error.empty()) {
        const std::lock_guard<std::mutex> lock(g_error_mutex);
        if (!failed.exchange(true))
          first_error = "thread block (" + std::to_string(blockIdx.x) + ", " + std::to_string(blockIdx.y) + ", " +
                        std::to_string(blockIdx.z) + ") of " + std::to_string(threads) + " threads: " + run.error;
      }
    }
    g_run = nullptr;
  };
  const int workers = worker_count(blocks);
  if (workers == 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    for (int i = 0; i < workers; ++i) pool.emplace_back(work);
    for (std::thread& t : pool) t.join();
  }
  if (failed) {
    const std::lock_guard<std::mutex> lock(g_error_mutex);
    g_launch_error = first_error;
    g_last_error = cudaErrorLaunchFailure;
  }
  return g_last_error;
}

}  // namespace paged_emu

cudaError_t cudaGetLastError() {
  const cudaError_t err = paged_emu::g_last_error;
  paged_emu::g_last_error = cudaSuccess;
  return err;
}

const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument (block of 1 to 1024 threads)";
    case cudaErrorLaunchFailure: {
      const std::lock_guard<std::mutex> lock(paged_emu::g_error_mutex);
      paged_emu::g_error_text = "device emulation: " + paged_emu::g_launch_error;
      return paged_emu::g_error_text.c_str();
    }
  }
  return "unknown error";
}
