// bertkit's GEMM ops for graphs compiled ahead (kernels/graph_gemm.py builds and loads this file):
//
//   bertkit_mkl_linear(x, weight, bias)        fp32: MKL's packed sgemm, for any row count
//   bertkit_fma_linear(x, weight, bias)        fp32: bertkit's AVX2 / FMA kernel, for any row count
//   bertkit_fma_linear_gelu(x, weight, bias)   the same through the exact GELU
//   bertkit_int8_linear(q, row_scale, weight, weight_scale, bias)
//                                              int8: per-row int8 x per-column int8 on AMX tiles
//                                              (on AVX2 without VNNI, VPMADDUBSW), its scales and
//                                              bias applied as the sums are stored
//   bertkit_int8_linear_seven(x, weight, weight_scale, bias)
//                                              int8 on AVX2 without VNNI: fp32 rows quantised per row
//                                              to 7 bits (unsigned, a zero point) x per-column int8
//   bertkit_int8_linear_seven_gelu(...)        the same through the exact GELU
//   bertkit_attention(q, k, v, mask, heads)    fp32 attention of a short input (up to 64 keys) on
//                                              AVX-512 or AVX2 (on AVX2 up to 512), longer ones
//                                              through torch's SDPA
//   bertkit_add_norm(y, residual, weight, bias, eps)
//                                              LayerNorm(y + residual) of each row (a post-LN block's end)
//   bertkit_fma_pack / bertkit_fma_linear_packed, bertkit_attention_eager
//                                              the same for eager models: the pack held by the
//                                              caller, the items on torch's threads (run_items)
//
// The GEMMs pack a weight once, on its first call, kept by the weight's address (a graph's constants
// keep theirs) and checked against a sample of its values (a freed graph's address may be reused
// by another's constants). AOTInductor calls the ops through their C functions (SHIM_*).
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <utility>
#include <cstring>
#include <mutex>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

extern "C" {  // MKL's packed GEMM (LP64), as libtorch_cpu exports it
size_t cblas_sgemm_pack_get_size(int identifier, int m, int n, int k);
void cblas_sgemm_pack(int layout, int identifier, int trans, int m, int n, int k, float alpha,
                      const float* src, int ld, float* dest);
void cblas_sgemm_compute(int layout, int transa, int transb, int m, int n, int k, const float* a, int lda,
                         const float* b, int ldb, float beta, float* c, int ldc);
}

namespace {
constexpr int64_t kSamples = 64;

// ---- packs kept per weight address

struct Pack {
  std::vector<int64_t> shape;
  std::vector<double> sample;
  at::Tensor data;
};

// The values at a few dozen positions of a 2-D weight (any strides), read without allocating.
template <typename T, typename Visit>
void for_each_sampled(const at::Tensor& w, Visit visit) {
  auto values = w.accessor<T, 2>();
  int64_t columns = w.size(1), count = w.numel();
  int64_t step = std::max<int64_t>(1, count / kSamples);
  for (int64_t i = 0; i < count; i += step) visit(static_cast<double>(values[i / columns][i % columns]));
  visit(static_cast<double>(values[(count - 1) / columns][(count - 1) % columns]));
}

template <typename T>
bool same_weight(const Pack& pack, const at::Tensor& w) {
  if (pack.shape != w.sizes().vec()) return false;
  size_t at = 0;
  bool same = true;
  for_each_sampled<T>(w, [&](double value) { same = same && at < pack.sample.size() && pack.sample[at++] == value; });
  return same && at == pack.sample.size();
}

// The pack of `w` made by `make(w)` on the first call for its address and values.
template <typename T, typename Make>
at::Tensor pack_for(std::unordered_map<const void*, Pack>& packs, std::mutex& lock, const at::Tensor& w, Make make) {
  std::lock_guard<std::mutex> guard(lock);
  auto found = packs.find(w.data_ptr());
  if (found != packs.end() && same_weight<T>(found->second, w)) return found->second.data;
  std::vector<double> sample;
  for_each_sampled<T>(w, [&](double value) { sample.push_back(value); });
  at::Tensor data = make(w);
  packs[w.data_ptr()] = Pack{w.sizes().vec(), std::move(sample), data};
  return data;
}

int64_t padded(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// ---- packs on 2 MB pages
//
// One request streams every packed weight from memory once per call, and on 4 KB pages each page's
// first line misses the TLB; in a VM a miss walks both the guest's and the host's page tables (a
// random line over 4 MB: ~160 ns on 4 KB pages against ~25 on 2 MB ones, AMD EPYC Zen 3 VM). So the
// packs live in chunks the kernel is asked to back with transparent huge pages (madvise; where THP is
// off they are ordinary pages), several packs to a chunk, as one of a few hundred KB alone would
// hold a whole 2 MB page. A chunk is returned once every pack in it is freed and a newer chunk
// takes the next packs.
class PackMemory {
 public:
  // `bytes` of zeros (a fresh mapping's), 64-byte aligned, as a flat tensor of `type`
  static at::Tensor zeros(int64_t bytes, at::ScalarType type) {
    const int64_t element = static_cast<int64_t>(c10::elementSize(type));
    const size_t size = padded_size(static_cast<size_t>(std::max<int64_t>(bytes, 1)), 64);
    if (!huge_.load(std::memory_order_relaxed)) return at::zeros({(bytes + element - 1) / element}, at::dtype(type));
    Chunk* chunk = nullptr;
    char* data = nullptr;
    {
      std::lock_guard<std::mutex> guard(lock_);
      if (current_ == nullptr || current_->used + size > current_->size) {
        Chunk* fresh = map(std::max(kChunk, padded_size(size, kHuge)));
        if (fresh == nullptr) return at::zeros({(bytes + element - 1) / element}, at::dtype(type));
        retire(current_);
        current_ = fresh;
      }
      chunk = current_;
      data = chunk->base + chunk->used;
      chunk->used += size;
      ++chunk->live;
    }
    return at::from_blob(data, {(bytes + element - 1) / element}, [chunk](void*) { release(chunk); }, at::dtype(type));
  }

  // Whether packs made from now on take 2 MB pages (bertkit_set_pack_pages: an A/B against 4 KB ones)
  static void set_huge(bool huge) { huge_.store(huge, std::memory_order_relaxed); }

 private:
  static constexpr size_t kHuge = size_t{2} << 20, kChunk = size_t{16} << 20;
  struct Chunk {
    void* mapping;
    size_t mapped;
    char* base;
    size_t size, used = 0;
    int64_t live = 0;  // packs not yet freed (under lock_)
  };

  static size_t padded_size(size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

  static Chunk* map(size_t size) {
    const size_t mapped = size + kHuge;  // room to start on a 2 MB boundary
    void* mapping = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapping == MAP_FAILED) return nullptr;
    char* base = reinterpret_cast<char*>(padded_size(reinterpret_cast<uintptr_t>(mapping), kHuge));
    madvise(base, size, MADV_HUGEPAGE);  // a hint: refused or ignored, the pages stay 4 KB
    return new Chunk{mapping, mapped, base, size};
  }

  static void retire(Chunk* chunk) {  // under lock_: no new packs go there
    if (chunk != nullptr && chunk->live == 0) unmap(chunk);
  }

  static void release(Chunk* chunk) {
    std::lock_guard<std::mutex> guard(lock_);
    if (--chunk->live == 0 && chunk != current_) unmap(chunk);
  }

  static void unmap(Chunk* chunk) {
    munmap(chunk->mapping, chunk->mapped);
    delete chunk;
  }

  static inline std::mutex lock_;
  static inline Chunk* current_ = nullptr;
  static inline std::atomic<bool> huge_{true};
};

// ---- fp32: MKL's packed sgemm

constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kBMatrix = 162;
constexpr int kPackRows = 64;  // sizes the pack only: any row count may use it
std::mutex mkl_lock;
std::unordered_map<const void*, Pack> mkl_packs;

at::Tensor mkl_pack(const at::Tensor& w) {
  int n = w.size(0), k = w.size(1);
  size_t bytes = cblas_sgemm_pack_get_size(kBMatrix, kPackRows, n, k);
  auto data = PackMemory::zeros(static_cast<int64_t>(bytes + sizeof(float)), at::kFloat);
  cblas_sgemm_pack(kRowMajor, kBMatrix, kTrans, kPackRows, n, k, 1.0f, w.data_ptr<float>(), k, data.data_ptr<float>());
  return data;
}

at::Tensor mkl_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat && x.device().is_cpu(),
              "bertkit_mkl_linear takes fp32 CPU tensors");
  TORCH_CHECK(weight.dim() == 2 && x.size(-1) == weight.size(1), "bertkit_mkl_linear: shapes do not match");
  // Packs are kept per weight address, which a graph's constants hold; anything else takes torch's GEMM.
  if (!weight.is_contiguous() || weight.numel() == 0) return at::linear(x, weight, bias);
  auto input = x.contiguous();
  int64_t k = weight.size(1), n = weight.size(0), m = input.numel() / k;
  auto sizes = input.sizes().vec();
  sizes.back() = n;
  float beta = 0.0f;
  auto y = at::empty({m, n}, input.options());
  if (bias.has_value() && bias->defined()) {  // C = bias (copied: never the bias itself), then C += x W^T
    // row by row: a TensorIterator copy of the expanded bias cost 1.5% of the MiniLM graph
    TORCH_CHECK(bias->numel() == n, "bertkit_mkl_linear: a bias of one value per output");
    auto values = bias->to(at::kFloat).contiguous();
    const float* from = values.data_ptr<float>();
    float* to = y.data_ptr<float>();
    for (int64_t r = 0; r < m; ++r) std::memcpy(to + r * n, from, n * sizeof(float));
    beta = 1.0f;
  }
  if (m > 0) {
    auto pack = pack_for<float>(mkl_packs, mkl_lock, weight, mkl_pack);
    cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, m, n, k, input.data_ptr<float>(), k, pack.data_ptr<float>(), k,
                        beta, y.data_ptr<float>(), n);
  }
  return y.view(sizes);
}

// ---- the avx2 graph's own threads: a caller never waits for a worker that has not started
//
// at::parallel_for (libgomp) splits a region evenly and waits at its end for every thread. A worker
// asleep after a rest (libgomp spins ~10 ms after a region, then sleeps) wakes in tens of
// microseconds to milliseconds on a VM's vCPU, and with another process's threads spinning beside
// it may not run at all for a while: the first regions of a lone request wait for it (on an AMD
// EPYC Zen 3 one MiniLM input took 8.8 ms back to back, 16.9 after 0.2 s of rest). Here the caller
// and the workers claim a job's items one at a time; a worker still asleep claims none and the
// caller waits only for items already claimed, so a late worker costs at most its share of the
// time until it arrives (ONNX Runtime's pool does the same). A job is one word: the job's number
// (high 32 bits) and the items left (low 32); a worker reads the job's body only after claiming an
// item of it, which the caller outlives.
// A sleeping worker is woken onto the caller's other CPUs (its affinity narrowed for the wake-up,
// restored once it runs): a scheduler may place a woken thread on its waker's CPU when the other
// vCPU has idled (one that packs a VM's threads onto few vCPUs does so after ~0.1 s idle), where it
// waits behind the caller until the load balancer moves it. On a 2-vCPU AMD EPYC Zen 4 VM, after
// 0.1-0.3 s of rest, the worker took its first item 3.1-3.7 ms after a job began (on the caller's CPU
// in 28 of 40 probes), steered 0.12-0.16 ms (bertkit_team_wake_probe); one MiniLM input through the
// int8 graph after 0.1 s of rest 3.5-3.7 -> 3.1-3.35 ms, the fp32 and bf16 graphs within their noise.
class Team {
 public:
  static Team& instance() {
    static const bool once = [] {  // a forked child has none of the workers (nor maybe the locks): a new team
      pthread_atfork(nullptr, nullptr, [] { current_ = new Team(); });
      current_ = new Team();
      return true;
    }();
    (void)once;
    return *current_;  // never destroyed: its workers sleep until the process ends
  }

  // body(item, next) for each item in [0, count), on the calling thread and up to at::get_num_threads() - 1
  // workers; `next` is the item the same thread runs after this one, or -1 where it is not known yet
  // (a GEMM's body fetches that item's weights while it computes: see fma_rows). A thread claims its
  // next item ahead only while more items than threads are left, so the last few never wait behind
  // one that holds them.
  template <class Body>
  void run(int64_t count, const Body& body) {
    const int threads = at::get_num_threads();
    std::unique_lock<std::mutex> caller(caller_lock_, std::try_to_lock);  // another caller meanwhile: run alone
    if (count <= 1 || threads <= 1 || !caller.owns_lock() || count > int64_t{kLeft}) {
      for (int64_t item = 0; item < count; ++item) body(item, item + 1 < count ? item + 1 : -1);
      return;
    }
    start_workers(threads - 1);
    call_ = [](const void* body, int64_t item, int64_t next) { (*static_cast<const Body*>(body))(item, next); };
    body_ = &body;
    threads_ = threads;
    count_ = count;
    done_.store(0, std::memory_order_relaxed);
    const uint64_t job = ((claim_.load(std::memory_order_relaxed) >> 32) + 1) & kLeft;
    claim_.store(job << 32 | static_cast<uint64_t>(count));  // seq_cst, against sleeping_ (see worker)
    if (sleeping_.load() > 0) {
      std::lock_guard<std::mutex> lock(sleep_lock_);
      if (steer_.load(std::memory_order_relaxed)) steer_sleepers();
      ++wakes_;
      wake_.notify_all();
    }
    work();
    // The items still running are a worker's: yield while waiting, in case the scheduler put that
    // worker on this thread's CPU (a woken thread often lands beside its waker), else spinning here
    // would keep it off the CPU for a time slice.
    for (int spins = 0; done_.load(std::memory_order_acquire) < count; ++spins) {
      if (spins < kWaitSpins) _mm_pause();
      else std::this_thread::yield();
    }
  }

  // How long a worker spins (yielding) after its last item before it sleeps: bertkit_set_team_spin,
  // kept across a fork's new team.
  static void set_spin(int64_t microseconds) { spin_us_.store(microseconds, std::memory_order_relaxed); }

  // Whether sleeping workers are woken onto the CPUs other than the caller's (bertkit_set_team_steer:
  // an A/B against the scheduler's own placement)
  static void set_steer(bool steer) { steer_.store(steer, std::memory_order_relaxed); }

 private:
  static constexpr uint64_t kLeft = 0xffffffffu;
  static constexpr int kWaitSpins = 256;  // the caller's pauses before it yields (~10 µs)

  using Call = void (*)(const void*, int64_t, int64_t);

  // The affinity of the sleeping workers this job wakes (those active): the caller's CPUs less the one
  // it runs on, where that leaves any (under sleep_lock_; each worker restores its own as it wakes)
  void steer_sleepers() {
    cpu_set_t others;
    const int cpu = sched_getcpu();
    if (cpu < 0 || sched_getaffinity(0, sizeof(others), &others) != 0 || !CPU_ISSET(cpu, &others)) return;
    CPU_CLR(cpu, &others);
    if (CPU_COUNT(&others) == 0) return;
    const int active = active_.load(std::memory_order_relaxed);
    for (size_t i = 0; i < tids_.size(); ++i)
      if (asleep_[i] && indices_[i] < active && sched_setaffinity(tids_[i], sizeof(others), &others) == 0)
        steered_[i] = 1;
  }

  void start_workers(int wanted) {
    active_.store(wanted, std::memory_order_relaxed);  // fewer threads than before: the rest stay idle
    while (started_ < wanted) std::thread(&Team::worker, this, started_++).detach();
  }

  // Claims items until none is left, each with the next one where enough are left (run); counts
  // them done once at the end (one atomic add a thread). A claimed item keeps its job current: the
  // caller returns only once every item is counted done.
  bool work() {
    int64_t did = 0;
    for (int64_t item = claim(0); item >= 0; ++did) {
      const int64_t next = claim(threads_);
      call_(body_, item, next);
      item = next >= 0 ? next : claim(0);
    }
    if (did > 0) done_.fetch_add(did, std::memory_order_release);
    return did > 0;
  }

  // An item of the current job where more than `keep` are left, else -1.
  int64_t claim(int64_t keep) {
    uint64_t word = claim_.load(std::memory_order_acquire);
    while (static_cast<int64_t>(word & kLeft) > keep) {
      if (claim_.compare_exchange_weak(word, word - 1, std::memory_order_acq_rel, std::memory_order_acquire))
        return count_ - static_cast<int64_t>(word & kLeft);
    }
    return -1;
  }

  bool job_waiting(int index) const {
    return (claim_.load() & kLeft) != 0 && index < active_.load(std::memory_order_relaxed);
  }

  void worker(int index) {
    pthread_setname_np(pthread_self(), "bertkit-ops");  // as `top -H` and /proc/PID/task/*/comm show it
    cpu_set_t allowed;  // as started: restored after a steered wake-up
    const bool known = sched_getaffinity(0, sizeof(allowed), &allowed) == 0;
    size_t slot;
    {
      std::lock_guard<std::mutex> lock(sleep_lock_);
      slot = tids_.size();
      tids_.push_back(known ? static_cast<pid_t>(syscall(SYS_gettid)) : 0);
      indices_.push_back(index);
      asleep_.push_back(0);
      steered_.push_back(0);
    }
    auto last = std::chrono::steady_clock::now();
    for (;;) {
      if (index < active_.load(std::memory_order_relaxed) && work()) {
        last = std::chrono::steady_clock::now();
        continue;
      }
      if (std::chrono::steady_clock::now() - last < std::chrono::microseconds(spin_us_.load(std::memory_order_relaxed))) {
        for (int i = 0; i < 16; ++i) _mm_pause();
        std::this_thread::yield();  // a caller that shares this CPU runs first
        continue;
      }
      // sleeping_ up, then the job word read (seq_cst both, as the caller's store then load): either
      // this sees the caller's job or the caller sees this sleeper and wakes it. Woken, it spins even
      // where the caller took every item before it arrived (a small job): the request's next jobs
      // follow within microseconds, and waiting again here would miss those too (a worker woken
      // after a rest by one 1 x 384 x 32 GEMM spun after 2 of 10 calls before this, x 384 after 4).
      std::unique_lock<std::mutex> lock(sleep_lock_);
      sleeping_.fetch_add(1);
      asleep_[slot] = known;  // steered only where its own affinity can be restored
      const uint64_t seen = wakes_;
      wake_.wait(lock, [&] {
        return job_waiting(index) || (wakes_ != seen && index < active_.load(std::memory_order_relaxed));
      });
      sleeping_.fetch_sub(1);
      asleep_[slot] = 0;
      const bool steered = steered_[slot];
      steered_[slot] = 0;
      lock.unlock();
      if (steered) sched_setaffinity(0, sizeof(allowed), &allowed);
      last = std::chrono::steady_clock::now();
    }
  }

  static inline Team* current_ = nullptr;
  // 30 ms: a lone request after a quiet spell then finds this 2-vCPU VM as fast as back to back.
  // With 5 ms all-MiniLM-L6-v2 (36 tokens, compiled, AMD EPYC Zen 3, each alone in a process) took
  // 6.2-6.7 ms back to back and 12.7-14.7 after 0.1-0.2 s of rest; with 30, 9.3-9.9 after a rest (ONNX
  // Runtime 9.1-11.4, its worker spinning ~45 ms after each run), at 0.23-0.45 of a core on average
  // against 0.11-0.21 (ONNX Runtime's 0.28-0.69), requests 0.1-0.2 s apart.
  static inline std::atomic<int64_t> spin_us_{30000};
  std::mutex caller_lock_, sleep_lock_;
  std::condition_variable wake_;
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<int> sleeping_{0}, active_{0};
  int started_ = 0;  // under caller_lock_
  uint64_t wakes_ = 0;  // the callers' wake-ups, under sleep_lock_
  // per worker, under sleep_lock_: its thread id and index, whether it sleeps, whether a caller narrowed
  // its affinity
  std::vector<pid_t> tids_;
  std::vector<int> indices_;
  std::vector<char> asleep_, steered_;
  static inline std::atomic<bool> steer_{true};
  Call call_ = nullptr;
  const void* body_ = nullptr;
  int64_t count_ = 0;
  int64_t threads_ = 1;
};

// Where an op's items run: on the Team (a compiled graph's ops, whose own loops run on the calling
// thread) or on torch's OpenMP threads (an eager model's, whose other ops run on those: the Team's
// workers spinning beside libgomp's would share the same cores; all-MiniLM-L6-v2 batches of 32 ran
// 0.92x oneDNN's GEMMs on the Team, 1.13x on torch's threads, AMD EPYC Zen 3).
enum class Threads { team, torch };

// body(item) or body(item, next): `next` the item the same thread runs after this one, -1 where
// none is known (Team::run).
template <class Body>
void run_items(Threads threads, int64_t count, const Body& body) {
  auto both = [&](int64_t item, int64_t next) {
    if constexpr (std::is_invocable_v<const Body&, int64_t, int64_t>) body(item, next);
    else body(item);
  };
  if (threads == Threads::team) {
    Team::instance().run(count, both);
    return;
  }
  at::parallel_for(0, count, 1, [&](int64_t first, int64_t last) {  // each thread a range of items in order
    for (int64_t item = first; item < last; ++item) both(item, item + 1 < last ? item + 1 : -1);
  });
}

// ---- fp32: bertkit's own AVX2 / FMA GEMM
//
// For CPUs whose best vector unit is AVX2 (no AVX-512): at the row counts of one request oneDNN's
// AVX2 GEMM ran at ~55% of these cores' FMA peak and MKL's (its AVX2 path on AMD) slower still,
// where ONNX Runtime's MLAS reaches ~80%. The weight (N, K) is packed once into panels of 16 output
// columns, each K rows of 16 floats; six input rows at a time take a panel's 6 x 16 sums in twelve
// AVX registers (the bias their start), one broadcast and two loads per six pairs of FMAs.

constexpr int64_t kPanel = 16, kFmaRows = 6, kRowChunk = 96;  // kRowChunk: input rows kept in L2 per pass
std::mutex fma_lock;
std::unordered_map<const void*, Pack> fma_packs;

at::Tensor fma_pack(const at::Tensor& w) {  // (N, K) -> [N/16][K][16], zero past the last column
  int64_t n = w.size(0), k = w.size(1), np = padded(n, kPanel);
  auto data = PackMemory::zeros(np * k * static_cast<int64_t>(sizeof(float)), at::kFloat);
  float* d = data.data_ptr<float>();
  auto values = w.accessor<float, 2>();
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < k; ++i) d[((j / kPanel) * k + i) * kPanel + j % kPanel] = values[j][i];
  return data;
}

bool fma_usable() {
  static const bool usable = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return usable;
}

bool avx512_usable() {
  static const bool usable = __builtin_cpu_supports("avx512f");
  return usable;
}

// AMD's Zen 4 (family 25 with AVX-512) runs an AVX-512 instruction as two 256-bit halves: the AVX2
// kernels lose no arithmetic width there.
bool amd_zen4() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return false;
  const bool amd = ebx == 0x68747541 && edx == 0x69746e65 && ecx == 0x444d4163;  // "AuthenticAMD"
  if (!amd || !__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  return ((eax >> 8) & 0xf) + ((eax >> 20) & 0xff) == 0x19 && avx512_usable();
}

bool amx_usable();

// Whether the compiled graphs' GEMMs are this file's 256-bit kernels on the Team (fp32, and int8
// without AMX), their attention and their own loops too: CPUs whose vector units are 256 bits wide,
// AVX2 without AVX-512 or AMD's Zen 4. There oneDNN's GEMMs ran at about half the FMA peak at one
// request's row counts: on a Zen 4, one all-MiniLM-L6-v2 input of 8-64 tokens through the fp32 graph
// 9.6 ms with these kernels against 15.1 with oneDNN's AVX-512 ones (two runs, ONNX Runtime 9.7 in
// both; docs/speed.md). Intel's
// AVX-512 CPUs and later AMD ones (full 512-bit units) keep oneDNN's (MKL's, AMX) kernels, unmeasured.
bool team_graphs() {
  static const bool team = fma_usable() && !amx_usable() && (!avx512_usable() || amd_zen4());
  return team;
}

__attribute__((target("avx2,fma"))) inline __m256 exp_nonpositive8(__m256 x);  // (the attention's, below)

// The exact GELU, x / 2 (1 + erf(x / sqrt 2)), for an eager model's intermediate GEMM (its output
// stored once rather than passed over again). erf(z) = 1 - q, q = P(t) e^(-z^2), t = 1 / (1 + 0.3275911 z)
// for z >= 0 (Abramowitz and Stegun 7.1.26, |error| < 1.5e-7): 1 + erf is 2 - q for x >= 0 and q
// itself for x < 0, so the negative side keeps its relative accuracy (no 1 - erf cancellation).
__attribute__((target("avx2,fma"))) inline __m256 gelu8(__m256 x) {
  const __m256 z = _mm256_mul_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), x), _mm256_set1_ps(0.70710678118654752f));
  const __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), z, _mm256_set1_ps(1.0f)));
  __m256 p = _mm256_set1_ps(1.061405429f);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
  const __m256 q = _mm256_mul_ps(_mm256_mul_ps(p, t), exp_nonpositive8(_mm256_mul_ps(_mm256_sub_ps(_mm256_setzero_ps(), z), z)));
  const __m256 negative = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 one_plus_erf = _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(2.0f), q), q, negative);
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), one_plus_erf);
}

// gelu8 over `columns` values in place (a last few through a buffer)
__attribute__((target("avx2,fma"))) void gelu_columns(float* y, int64_t columns) {
  int64_t c = 0;
  for (; c + 8 <= columns; c += 8) _mm256_storeu_ps(y + c, gelu8(_mm256_loadu_ps(y + c)));
  if (c < columns) {
    alignas(32) float rest[8] = {};
    std::memcpy(rest, y + c, (columns - c) * sizeof(float));
    _mm256_store_ps(rest, gelu8(_mm256_load_ps(rest)));
    std::memcpy(y + c, rest, (columns - c) * sizeof(float));
  }
}

// One row's 16 sums (low: columns 0-7, high: 8-15) -> y's `columns` (<= 16, the weight's last panel
// fewer), through the exact GELU when `Gelu`: the fp32 kernels' store
template <bool Gelu>
__attribute__((target("avx2,fma"), always_inline)) inline void store_row16(float* y, __m256 low, __m256 high,
                                                                        int64_t columns) {
  if constexpr (Gelu) {
    low = gelu8(low);
    high = gelu8(high);
  }
  if (columns == kPanel) {
    _mm256_storeu_ps(y, low);
    _mm256_storeu_ps(y + 8, high);
    return;
  }
  alignas(32) float last[kPanel];
  _mm256_store_ps(last, low);
  _mm256_store_ps(last + 8, high);
  std::memcpy(y, last, columns * sizeof(float));
}

// R rows of x (from `x`, `ldx` apart) times one panel (K x 16) plus its 16 biases -> y's `columns` (<= 16),
// through the exact GELU when `Gelu`.
// Meanwhile one line (one K row, 64 bytes) of the thread's next panel `next` is fetched into L1 every
// `stride` steps of K, starting at line `phase`: a panel's `stride` row blocks pass over it with phases
// 0 .. stride - 1, so together they fetch the next panel whole, spread over the current one's compute.
// Without it the first row block met each panel in memory and waited for it: the weights of one request's
// GEMMs stream from memory once per call (MiniLM's encoder is 42 MB), and one core's row block needs
// them faster than memory brings them unasked (all MiniLM's GEMMs in turn at 36 rows, Zen 3: one
// thread 67-74 -> 78-84 GFLOPS, two 109-123 -> 137-156; 12 rows, two threads, 1.09-1.15x).
// The twelve sums are named variables: GCC kept an array of them in memory, storing each after its FMA.
#define BERTKIT_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
template <int R, bool Gelu>
__attribute__((target("avx2,fma"))) void fma_rows(const float* x, int64_t ldx, const float* panel, int64_t k,
                                                   const float* bias, float* y, int64_t ldy, int64_t columns,
                                                   const float* next, int64_t phase, int64_t stride) {
  const __m256 bias_low = _mm256_loadu_ps(bias), bias_high = _mm256_loadu_ps(bias + 8);
#define BERTKIT_START(r) __m256 low##r = bias_low, high##r = bias_high;
  BERTKIT_ROWS(BERTKIT_START)
  const float* row = x;
  const float* line = next + phase * kPanel;
  for (int64_t start = 0; start < k; start += stride, line += stride * kPanel) {
    if (start + phase < k) _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T0);
    const int64_t end = std::min(k, start + stride);
    for (int64_t i = start; i < end; ++i, ++row) {
      const __m256 b_low = _mm256_load_ps(panel + i * kPanel), b_high = _mm256_load_ps(panel + i * kPanel + 8);
#define BERTKIT_FMA(r)                                        \
      if constexpr (r < R) {                                  \
        const __m256 a = _mm256_broadcast_ss(row + r * ldx);  \
        low##r = _mm256_fmadd_ps(a, b_low, low##r);           \
        high##r = _mm256_fmadd_ps(a, b_high, high##r);        \
      }
      BERTKIT_ROWS(BERTKIT_FMA)
    }
  }
#define BERTKIT_STORE(r) \
  if constexpr (r < R) store_row16<Gelu>(y + r * ldy, low##r, high##r, columns);
  BERTKIT_ROWS(BERTKIT_STORE)
#undef BERTKIT_START
#undef BERTKIT_FMA
#undef BERTKIT_STORE
}
#undef BERTKIT_ROWS

// The same for up to eight rows with AVX-512, each row's 16 sums in one 512-bit register (a panel's
// line one load): a call of at most 8 rows passes over each panel once rather than twice (6 + 2), one
// of 13-16 twice rather than three times. There a lone input's GEMMs are bound by the weights'
// stream: MiniLM's GEMMs in turn, 24 layers' weights, alternated with the 6-row blocks in one process
// (Zen 4): 1.22-1.24x at 8 rows, 1.18x at 16 (BERT-base 1.31x, 1.17x); level at 12 and 24, 0.94-0.97x
// at 36 (four 8-row passes and a 4-row one against six full ones), hence only up to 16 rows.
#define BERTKIT_ROWS8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
template <int R, bool Gelu>
__attribute__((target("avx2,fma,avx512f"))) void fma_rows16(const float* x, int64_t ldx, const float* panel, int64_t k,
                                                             const float* bias, float* y, int64_t ldy, int64_t columns,
                                                             const float* next, int64_t phase, int64_t stride) {
  const __m512 biases = _mm512_loadu_ps(bias);
#define BERTKIT_START(r) __m512 sum##r = biases;
  BERTKIT_ROWS8(BERTKIT_START)
  const float* row = x;
  const float* line = next + phase * kPanel;
  for (int64_t start = 0; start < k; start += stride, line += stride * kPanel) {
    if (start + phase < k) _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T0);
    const int64_t end = std::min(k, start + stride);
    for (int64_t i = start; i < end; ++i, ++row) {
      const __m512 b = _mm512_load_ps(panel + i * kPanel);
#define BERTKIT_FMA(r) \
      if constexpr (r < R) sum##r = _mm512_fmadd_ps(_mm512_set1_ps(row[r * ldx]), b, sum##r);
      BERTKIT_ROWS8(BERTKIT_FMA)
    }
  }
#define BERTKIT_STORE(r)                                                                                 \
  if constexpr (r < R)                                                                                   \
    store_row16<Gelu>(y + r * ldy, _mm512_castps512_ps256(sum##r),                                       \
                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sum##r), 1)), columns);
  BERTKIT_ROWS8(BERTKIT_STORE)
#undef BERTKIT_START
#undef BERTKIT_FMA
#undef BERTKIT_STORE
}
#undef BERTKIT_ROWS8

using FmaKernel = void (*)(const float*, int64_t, const float*, int64_t, const float*, float*, int64_t, int64_t,
                          const float*, int64_t, int64_t);
constexpr FmaKernel kFmaKernels[2][kFmaRows] = {
    {&fma_rows<1, false>, &fma_rows<2, false>, &fma_rows<3, false>, &fma_rows<4, false>, &fma_rows<5, false>, &fma_rows<6, false>},
    {&fma_rows<1, true>, &fma_rows<2, true>, &fma_rows<3, true>, &fma_rows<4, true>, &fma_rows<5, true>, &fma_rows<6, true>}};
constexpr int64_t kWideRows = 8;
constexpr FmaKernel kWideKernels[2][kWideRows] = {
    {&fma_rows16<1, false>, &fma_rows16<2, false>, &fma_rows16<3, false>, &fma_rows16<4, false>,
     &fma_rows16<5, false>, &fma_rows16<6, false>, &fma_rows16<7, false>, &fma_rows16<8, false>},
    {&fma_rows16<1, true>, &fma_rows16<2, true>, &fma_rows16<3, true>, &fma_rows16<4, true>,
     &fma_rows16<5, true>, &fma_rows16<6, true>, &fma_rows16<7, true>, &fma_rows16<8, true>}};

// Rows a block for a call of m rows: eight (fma_rows16) with AVX-512 where that takes fewer passes
// over each panel and m is at most 16, else six
int64_t fma_block_rows(int64_t m) {
  return avx512_usable() && (m <= kWideRows || (m > 2 * kFmaRows && m <= 2 * kWideRows)) ? kWideRows : kFmaRows;
}

// x (..., K) times a pack of an (N, K) weight (fma_pack) plus bias -> (..., N), the items on `threads`.
at::Tensor fma_compute(Threads threads, const at::Tensor& x, const at::Tensor& pack, int64_t n,
                       const std::optional<at::Tensor>& bias, bool gelu = false) {
  auto input = x.contiguous();
  int64_t k = input.size(-1), m = input.numel() / std::max<int64_t>(k, 1), panels = padded(n, kPanel) / kPanel;
  TORCH_CHECK(pack.numel() == panels * kPanel * k, "bertkit_fma_linear: the pack is not of an (", n, ", ", k, ") weight");
  auto sizes = input.sizes().vec();
  sizes.back() = n;
  auto y = at::empty({m, n}, input.options());
  if (m == 0) return y.view(sizes);
  std::vector<float> biases(panels * kPanel, 0.0f);  // padded to whole panels
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == n, "bertkit_fma_linear: a bias of one value per output");
    auto values = bias->to(at::kFloat).contiguous();
    std::memcpy(biases.data(), values.data_ptr<float>(), n * sizeof(float));
  }
  const float *a = input.data_ptr<float>(), *b = pack.data_ptr<float>();
  float* c = y.data_ptr<float>();
  // An item is one panel times one chunk of rows (chunks that stay in L2 while the panels pass),
  // claimed one at a time by the team's threads (Team: no thread waits for a sleeping one).
  const int64_t chunks = (m + kRowChunk - 1) / kRowChunk, step = fma_block_rows(m);
  run_items(threads, chunks * panels, [&](int64_t item, int64_t next) {
    int64_t chunk = item / panels * kRowChunk, chunk_end = std::min(m, chunk + kRowChunk), p = item % panels;
    int64_t column = p * kPanel, columns = std::min(kPanel, n - column);
    const float* panel = b + p * k * kPanel;
    const float* ahead = next >= 0 ? b + next % panels * k * kPanel : panel;  // none known: lines already here
    const int64_t blocks = (chunk_end - chunk + step - 1) / step;
    for (int64_t r = chunk, phase = 0; r < chunk_end; r += step, ++phase) {
      int64_t rows = std::min(step, chunk_end - r);
      const FmaKernel kernel = step == kWideRows ? kWideKernels[gelu][rows - 1] : kFmaKernels[gelu][rows - 1];
      kernel(a + r * k, k, panel, k, biases.data() + column, c + r * n + column, n, columns, ahead, phase, blocks);
    }
  });
  return y.view(sizes);
}

void check_fma_operands(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat && x.device().is_cpu() &&
              weight.device().is_cpu(), "bertkit_fma_linear takes fp32 CPU tensors");
}

// The graph's op: the weight packed on its first call, kept by the weight's address (which a
// graph's constants hold); the items on the Team.
at::Tensor fma_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  check_fma_operands(x, weight);
  TORCH_CHECK(weight.dim() == 2 && x.size(-1) == weight.size(1), "bertkit_fma_linear: shapes do not match");
  if (!fma_usable() || !weight.is_contiguous() || weight.numel() == 0) return at::linear(x, weight, bias);
  return fma_compute(Threads::team, x, pack_for<float>(fma_packs, fma_lock, weight, fma_pack), weight.size(0), bias);
}

// The same through the exact GELU as the sums are stored (the fp32 graph's feed-forward intermediate)
at::Tensor fma_linear_gelu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  check_fma_operands(x, weight);
  TORCH_CHECK(weight.dim() == 2 && x.size(-1) == weight.size(1), "bertkit_fma_linear_gelu: shapes do not match");
  if (!fma_usable() || !weight.is_contiguous() || weight.numel() == 0) return at::gelu(at::linear(x, weight, bias));
  return fma_compute(Threads::team, x, pack_for<float>(fma_packs, fma_lock, weight, fma_pack), weight.size(0), bias, true);
}

// An eager model's: the pack made by bertkit_fma_pack and held by the caller (freed with the weight
// it was made from: kernels/packed.py), the items on torch's threads.
at::Tensor fma_pack_weight(const at::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.dim() == 2 && weight.device().is_cpu(),
              "bertkit_fma_pack takes an fp32 (N, K) CPU weight");
  return fma_pack(weight.contiguous());
}

at::Tensor fma_linear_packed(const at::Tensor& x, const at::Tensor& pack, int64_t n, const std::optional<at::Tensor>& bias,
                             bool gelu) {
  check_fma_operands(x, pack);
  TORCH_CHECK(fma_usable(), "bertkit_fma_linear_packed needs a CPU with AVX2 and FMA");
  return fma_compute(Threads::torch, x, pack, n, bias, gelu);
}

// ---- bf16: the same panels summed with VDPBF16PS, for the bf16 graph where its kernels are the Team's
//
// The bf16 graph is recorded under autocast: its Linears take bf16 rows and weights and give bf16
// outputs (fp32 sums of bf16 products, the bias added, rounded once). On a Zen 4 (team_graphs) with
// AVX512_BF16 the weight (N, K) is packed once in panels of 16 output columns, each K / 2 lines of 16
// pairs of K values; six input rows at a time broadcast one pair each and one VDPBF16PS per 8 columns
// adds 16 products to the fp32 sums, twice an FMA's. The sums leave plus the bias, through the exact
// GELU where asked (as oneDNN's GELU post-op applies it before rounding), rounded to bf16.

bool bf16_usable() {
  static const bool usable = team_graphs() && avx512_usable() && __builtin_cpu_supports("avx512bf16") &&
                             __builtin_cpu_supports("avx512vl");
  return usable;
}

std::mutex bf16_lock;
std::unordered_map<const void*, Pack> bf16_packs;

at::Tensor bf16_pack(const at::Tensor& w) {  // (N, K) bf16, K even -> [N/16][K/2][16][2], zero past the last column
  int64_t n = w.size(0), k = w.size(1), np = padded(n, kPanel);
  auto data = PackMemory::zeros(np * k * 2, at::kBFloat16);
  uint16_t* d = reinterpret_cast<uint16_t*>(data.data_ptr());
  auto values = w.contiguous();
  const uint16_t* source = reinterpret_cast<const uint16_t*>(values.data_ptr());
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < k; ++i)
      d[((j / kPanel) * (k / 2) + i / 2) * kPanel * 2 + (j % kPanel) * 2 + i % 2] = source[j * k + i];
  return data;
}

#define BERTKIT_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
template <int R, bool Gelu>
__attribute__((target("avx2,fma,avx512f,avx512vl,avx512bf16"))) void bf16_rows(
    const uint16_t* x, int64_t ldx, const uint16_t* panel, int64_t k, const float* bias, uint16_t* y, int64_t ldy,
    int64_t columns, const uint16_t* next, int64_t phase, int64_t stride) {
  const __m256 bias_low = _mm256_loadu_ps(bias), bias_high = _mm256_loadu_ps(bias + 8);
#define BERTKIT_START(r) __m256 low##r = bias_low, high##r = bias_high;
  BERTKIT_ROWS(BERTKIT_START)
  const int64_t lines = k / 2;  // a line: one pair of K values of the panel's 16 columns, 64 bytes
  for (int64_t start = 0; start < lines; start += stride) {
    if (start + phase < lines)
      _mm_prefetch(reinterpret_cast<const char*>(next + (start + phase) * kPanel * 2), _MM_HINT_T0);
    const int64_t end = std::min(lines, start + stride);
    for (int64_t i = start; i < end; ++i) {
      const __m256bh b_low = (__m256bh)_mm256_load_si256(reinterpret_cast<const __m256i*>(panel + i * kPanel * 2));
      const __m256bh b_high = (__m256bh)_mm256_load_si256(reinterpret_cast<const __m256i*>(panel + i * kPanel * 2 + 16));
#define BERTKIT_DOT(r)                                                     \
      if constexpr (r < R) {                                               \
        int32_t pair;                                                      \
        std::memcpy(&pair, x + r * ldx + 2 * i, sizeof(pair));             \
        const __m256bh a = (__m256bh)_mm256_set1_epi32(pair);              \
        low##r = _mm256_dpbf16_ps(low##r, a, b_low);                       \
        high##r = _mm256_dpbf16_ps(high##r, a, b_high);                    \
      }
      BERTKIT_ROWS(BERTKIT_DOT)
    }
  }
  alignas(32) uint16_t last[kPanel];  // the weight's last panel, fewer than 16 columns
#define BERTKIT_STORE(r)                                                                         \
  if constexpr (r < R) {                                                                         \
    if constexpr (Gelu) {                                                                        \
      low##r = gelu8(low##r);                                                                    \
      high##r = gelu8(high##r);                                                                  \
    }                                                                                            \
    const __m128i out_low = (__m128i)_mm256_cvtneps_pbh(low##r), out_high = (__m128i)_mm256_cvtneps_pbh(high##r); \
    if (columns == kPanel) {                                                                     \
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y + r * ldy), out_low);                        \
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y + r * ldy + 8), out_high);                   \
    } else {                                                                                     \
      _mm_store_si128(reinterpret_cast<__m128i*>(last), out_low);                                \
      _mm_store_si128(reinterpret_cast<__m128i*>(last + 8), out_high);                           \
      std::memcpy(y + r * ldy, last, columns * sizeof(uint16_t));                                \
    }                                                                                            \
  }
  BERTKIT_ROWS(BERTKIT_STORE)
#undef BERTKIT_START
#undef BERTKIT_DOT
#undef BERTKIT_STORE
}
#undef BERTKIT_ROWS

using Bf16Kernel = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, const float*, uint16_t*, int64_t, int64_t,
                            const uint16_t*, int64_t, int64_t);
constexpr Bf16Kernel kBf16Kernels[2][kFmaRows] = {
    {&bf16_rows<1, false>, &bf16_rows<2, false>, &bf16_rows<3, false>, &bf16_rows<4, false>, &bf16_rows<5, false>,
     &bf16_rows<6, false>},
    {&bf16_rows<1, true>, &bf16_rows<2, true>, &bf16_rows<3, true>, &bf16_rows<4, true>, &bf16_rows<5, true>,
     &bf16_rows<6, true>}};

// bf16 x (..., K) times the bf16 weight (N, K) plus bias -> bf16 (..., N), the items on the Team (as
// fma_compute); where the kernel cannot run (no AVX512_BF16, an odd K), autocast's Linear in ATen.
at::Tensor bf16_linear_impl(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                            bool gelu) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu() && weight.dim() == 2 && x.size(-1) == weight.size(1),
              "bertkit_bf16_linear: CPU rows and an (N, K) weight of the rows' K");
  const bool has_bias = bias.has_value() && bias->defined();
  auto input = x.to(at::kBFloat16).contiguous();
  auto w = weight.to(at::kBFloat16);
  int64_t k = input.size(-1), m = input.numel() / std::max<int64_t>(k, 1), n = w.size(0);
  if (!bf16_usable() || k % 2 != 0 || m == 0 || n == 0 || !weight.is_contiguous() ||
      weight.scalar_type() != at::kBFloat16) {  // the same arithmetic in ATen
    std::optional<at::Tensor> sums_bias;
    if (has_bias) sums_bias = bias->to(at::kBFloat16).to(at::kFloat);
    auto sums = at::linear(input.to(at::kFloat), w.to(at::kFloat), sums_bias);
    return (gelu ? at::gelu(sums) : sums).to(at::kBFloat16);
  }
  auto pack = pack_for<at::BFloat16>(bf16_packs, bf16_lock, weight, bf16_pack);
  const int64_t panels = padded(n, kPanel) / kPanel;
  std::vector<float> biases(panels * kPanel, 0.0f);  // padded to whole panels; the bias as autocast holds it, bf16
  if (has_bias) {
    TORCH_CHECK(bias->numel() == n, "bertkit_bf16_linear: a bias of one value per output");
    auto values = bias->to(at::kBFloat16).to(at::kFloat).contiguous();
    std::memcpy(biases.data(), values.data_ptr<float>(), n * sizeof(float));
  }
  auto sizes = input.sizes().vec();
  sizes.back() = n;
  auto y = at::empty({m, n}, input.options());
  const uint16_t* a = reinterpret_cast<const uint16_t*>(input.data_ptr());
  const uint16_t* b = reinterpret_cast<const uint16_t*>(pack.data_ptr());
  uint16_t* c = reinterpret_cast<uint16_t*>(y.data_ptr());
  const int64_t chunks = (m + kRowChunk - 1) / kRowChunk;
  run_items(Threads::team, chunks * panels, [&](int64_t item, int64_t next) {
    int64_t chunk = item / panels * kRowChunk, chunk_end = std::min(m, chunk + kRowChunk), p = item % panels;
    int64_t column = p * kPanel, columns = std::min(kPanel, n - column);
    const uint16_t* panel = b + p * k * kPanel;
    const uint16_t* ahead = next >= 0 ? b + next % panels * k * kPanel : panel;
    const int64_t blocks = (chunk_end - chunk + kFmaRows - 1) / kFmaRows;
    for (int64_t r = chunk, phase = 0; r < chunk_end; r += kFmaRows, ++phase) {
      int64_t rows = std::min(kFmaRows, chunk_end - r);
      kBf16Kernels[gelu][rows - 1](a + r * k, k, panel, k, biases.data() + column, c + r * n + column, n, columns,
                                   ahead, phase, blocks);
    }
  });
  return y.view(sizes);
}

at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  return bf16_linear_impl(x, weight, bias, false);
}

at::Tensor bf16_linear_gelu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  return bf16_linear_impl(x, weight, bias, true);
}

// ---- int8 on AMX tiles
//
// A tile holds 16 rows of 64 bytes. TDPBSSD adds A (16 rows x 64 int8 of K) times B (16 rows of
// 16 columns x 4 consecutive K values: 64 K values of 16 columns) to C (16 x 16 int32): exact
// int32 sums, as oneDNN's s8 x s8 GEMM gives. The weight is packed as 16-column blocks, each its
// K / 4 rows of 64 bytes, so a block's B tile for K values kt..kt+63 is 16 consecutive rows.

constexpr int64_t kTileRows = 16, kTileK = 64, kBlock = 16, kQuad = 64;  // kQuad: columns per step
std::mutex int8_lock;
std::unordered_map<const void*, Pack> int8_packs;

void int8_pack_into(const at::Tensor& w, int8_t* d) {  // (K, N) int8 -> [N/16][K/4][16][4] into zeros
  int64_t k = w.size(0), n = w.size(1), kp = padded(k, kTileK);
  auto values = w.accessor<int8_t, 2>();
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < k; ++i) d[((j / kBlock) * (kp / 4) + i / 4) * kBlock * 4 + (j % kBlock) * 4 + i % 4] = values[i][j];
}

at::Tensor int8_pack(const at::Tensor& w) {  // zero padded to whole tiles
  auto data = PackMemory::zeros(padded(w.size(1), kQuad) * padded(w.size(0), kTileK), at::kChar);
  int8_pack_into(w, data.data_ptr<int8_t>());
  return data;
}

bool amx_usable() {
  static const bool usable = [] {
    if (!__builtin_cpu_supports("avx512f")) return false;
    unsigned eax, ebx, ecx, edx;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    bool tiles = (edx >> 24) & 1, int8 = (edx >> 25) & 1;  // AMX-TILE, AMX-INT8
    // Linux hands a process the tiles' state only when asked (ARCH_REQ_XCOMP_PERM, XTILEDATA)
    return tiles && int8 && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  }();
  return usable;
}

struct TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t bytes_per_row[16];
  uint8_t rows[16];
};

struct Int8Problem {
  const int8_t* a;  // (m, kp): K padded to 64 with zeros
  int64_t m, kp, n;
  const int8_t* b;  // the pack
  const float *row_scale, *weight_scale, *bias;  // (m), (n), (n) or null
  float* y;         // (m, n)
  // 7-bit activations (AVX2, int8_linear_seven): `a` holds unsigned values 0-127, each row's zero
  // point and each column's sum of weights take out the offset
  const int32_t* zero = nullptr;         // (m)
  const int32_t* column_sums = nullptr;  // (n padded to 64)
  bool paired = false;                   // every weight within +-64: two pair sums added in int16
  bool gelu = false;                     // the exact GELU of each output (gelu8), applied as an item ends
};

// C tiles -> y: int32 sums times the row's and the column's scale, plus the bias.
__attribute__((target("avx512f"))) void store_tiles(const Int8Problem& p, const int32_t (*sums)[kTileRows][kBlock],
                                                     const int64_t* rows0, const int64_t* columns0, int tiles) {
  for (int t = 0; t < tiles; ++t) {
    int64_t column = columns0[t], columns = std::min<int64_t>(kBlock, p.n - column);
    if (columns <= 0) continue;
    __mmask16 mask = static_cast<__mmask16>((1u << columns) - 1);
    __m512 scale = _mm512_maskz_loadu_ps(mask, p.weight_scale + column);
    __m512 bias = p.bias ? _mm512_maskz_loadu_ps(mask, p.bias + column) : _mm512_setzero_ps();
    for (int64_t r = 0; r < kTileRows && rows0[t] + r < p.m; ++r) {
      int64_t row = rows0[t] + r;
      __m512 value = _mm512_cvtepi32_ps(_mm512_loadu_si512(sums[t][r]));
      value = _mm512_fmadd_ps(_mm512_mul_ps(value, _mm512_set1_ps(p.row_scale[row])), scale, bias);
      _mm512_mask_storeu_ps(p.y + row * p.n + column, mask, value);
    }
  }
}

// Tile shapes, each a row count of 64 bytes. Two row tiles at a time (2 x 2): C 0-1 and A 4 take the
// first tile's rows, C 2-3 and A 5 the second's, B 6-7 are 16 rows of 64 K values; one row tile
// (1 x 4): C 0-3 and A 4 take its rows, B 5-7. A last tile of fewer than 16 rows is configured so,
// rather than padded: the rows are read from the input as they are.
struct TileShapes {
  int first, second;  // 2 x 2: the rows of both tiles; 1 x 4: second = 0
  bool operator!=(const TileShapes& other) const { return first != other.first || second != other.second; }
};

__attribute__((target("amx-tile"))) void configure(TileShapes shapes) {
  TileConfig config{};
  config.palette = 1;
  for (int t = 0; t < 8; ++t) config.bytes_per_row[t] = 64;
  int c[8];
  if (shapes.second > 0) {
    const int rows[8] = {shapes.first, shapes.first, shapes.second, shapes.second, shapes.first, shapes.second, 16, 16};
    std::copy(rows, rows + 8, c);
  } else {
    const int rows[8] = {shapes.first, shapes.first, shapes.first, shapes.first, shapes.first, 16, 16, 16};
    std::copy(rows, rows + 8, c);
  }
  for (int t = 0; t < 8; ++t) config.rows[t] = static_cast<uint8_t>(c[t]);
  // GCC's _tile_loadconfig tells the compiler it reads 8 bytes of the 64: without this barrier the
  // other stores into `config` may be dropped as dead, and LDTILECFG faults on what is left.
  __asm__ __volatile__("" : : "r"(&config) : "memory");
  _tile_loadconfig(&config);
}

// Columns quad0 * 64 .. quad1 * 64 of y. Two row tiles at a time take 2 x 2 accumulators (two A
// tiles and two B tiles per K step); a last single row tile takes 1 x 4 (four column blocks), so
// that four independent tile products are in flight in either case. Each group of row tiles runs
// over all the columns before the next: the tiles are configured once per shape (LDTILECFG took
// ~4% of the int8 graph's time, configured per column step), the next group reads the weights
// again from L2.
__attribute__((target("amx-tile,amx-int8,avx512f"))) void int8_columns(const Int8Problem& p, int64_t quad0, int64_t quad1) {
  alignas(64) int32_t sums[4][kTileRows][kBlock];
  const int64_t block_bytes = (p.kp / 4) * kBlock * 4;
  TileShapes loaded{-1, -1};
  auto shape = [&](TileShapes wanted) {
    if (wanted != loaded) configure(wanted);
    loaded = wanted;
  };
  int64_t r0 = 0;
  for (; r0 + kTileRows < p.m; r0 += 2 * kTileRows) {
    shape({static_cast<int>(kTileRows), static_cast<int>(std::min<int64_t>(kTileRows, p.m - r0 - kTileRows))});
    for (int64_t quad = quad0; quad < quad1; ++quad) {
      const int8_t* b = p.b + quad * 4 * block_bytes;
      for (int half = 0; half < 2; ++half) {
        const int8_t* b0 = b + (2 * half) * block_bytes;
        const int8_t* b1 = b0 + block_bytes;
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (int64_t kt = 0; kt < p.kp; kt += kTileK) {
          _tile_loadd(4, p.a + r0 * p.kp + kt, p.kp);
          _tile_loadd(5, p.a + (r0 + kTileRows) * p.kp + kt, p.kp);
          _tile_loadd(6, b0 + kt * kBlock, 64);
          _tile_loadd(7, b1 + kt * kBlock, 64);
          _tile_dpbssd(0, 4, 6);
          _tile_dpbssd(1, 4, 7);
          _tile_dpbssd(2, 5, 6);
          _tile_dpbssd(3, 5, 7);
        }
        _tile_stored(0, sums[0], 64); _tile_stored(1, sums[1], 64);
        _tile_stored(2, sums[2], 64); _tile_stored(3, sums[3], 64);
        int64_t column = quad * kQuad + half * 2 * kBlock;
        const int64_t rows0[4] = {r0, r0, r0 + kTileRows, r0 + kTileRows};
        const int64_t columns0[4] = {column, column + kBlock, column, column + kBlock};
        store_tiles(p, sums, rows0, columns0, 4);
      }
    }
  }
  if (r0 < p.m) {  // one row tile left
    shape({static_cast<int>(std::min<int64_t>(kTileRows, p.m - r0)), 0});
    for (int64_t quad = quad0; quad < quad1; ++quad) {
      const int8_t* b = p.b + quad * 4 * block_bytes;
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (int64_t kt = 0; kt < p.kp; kt += kTileK) {
        _tile_loadd(4, p.a + r0 * p.kp + kt, p.kp);
        _tile_loadd(5, b + kt * kBlock, 64);
        _tile_loadd(6, b + block_bytes + kt * kBlock, 64);
        _tile_loadd(7, b + 2 * block_bytes + kt * kBlock, 64);
        _tile_dpbssd(0, 4, 5);
        _tile_dpbssd(1, 4, 6);
        _tile_dpbssd(2, 4, 7);
        _tile_loadd(5, b + 3 * block_bytes + kt * kBlock, 64);
        _tile_dpbssd(3, 4, 5);
      }
      _tile_stored(0, sums[0], 64); _tile_stored(1, sums[1], 64);
      _tile_stored(2, sums[2], 64); _tile_stored(3, sums[3], 64);
      int64_t column = quad * kQuad;
      const int64_t rows0[4] = {r0, r0, r0, r0};
      const int64_t columns0[4] = {column, column + kBlock, column + 2 * kBlock, column + 3 * kBlock};
      store_tiles(p, sums, rows0, columns0, 4);
    }
  }
  _tile_release();
}

// ---- int8 on AVX2 (CPUs without VNNI or AMX)
//
// VPMADDUBSW multiplies unsigned by signed bytes and adds each pair into an int16, saturating. Both
// operands here are signed (symmetric, |value| <= 127), so the activation's sign moves onto the
// weight: |a| x (w x sign a), whose pair sums stay within 2 x 127 x 127 = 32258 < 32767. The sums are
// exact, the same int32 sums as VNNI, AMX and oneDNN's `_int_mm` give (ggml's AVX2 int8 dot product
// does the same). VPMADDWD by ones widens the pairs to int32. The pack is the AMX one (int8_pack):
// per 16 columns, each group of 4 K values is 64 bytes, columns 0-7 then 8-15 (one register each).
// Four input rows at a time keep their 4 x 16 sums in eight registers.

constexpr int64_t kInt8Rows = 4, kInt8RowChunk = 128;

bool vnni_present() {
  unsigned eax, ebx, ecx, edx;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  bool avx512_vnni = (ecx >> 11) & 1;
  __cpuid_count(7, 1, eax, ebx, ecx, edx);
  bool avx_vnni = (eax >> 4) & 1;
  return avx512_vnni || avx_vnni;
}

// Whether bertkit_int8_linear runs the AVX2 kernel: AVX2 without VNNI or AMX (oneDNN's s8 GEMM would
// saturate its int16 pair sums there).
bool avx2_int8_usable() {
  static const bool usable = fma_usable() && !amx_usable() && !vnni_present();
  return usable;
}

// Whether the row-quantising op (int8_linear_seven) sums with VPDPBUSD: the graphs' kernels are the
// Team's (team_graphs: a Zen 4 here) and the CPU has AVX512_VNNI, which multiplies unsigned 8-bit
// values by signed ones and adds each four products into an int32 exactly, in one instruction: the
// rows quantised to 8 bits (255 steps) rather than 7, one instruction per 32 products rather than three.
bool vnni_int8_usable() {
  static const bool usable = team_graphs() && avx512_usable() && __builtin_cpu_supports("avx512vnni") &&
                             __builtin_cpu_supports("avx512vl");
  return usable;
}

// The steps a row quantised by the op spans: 255 with VNNI (exact sums of 8-bit values), else 127
// (VPMADDUBSW's 16-bit pair sums hold 7-bit values times int8 weights).
int row_steps() { return vnni_int8_usable() ? 255 : 127; }

// Seven: `a` holds 7-bit unsigned values (int8_linear_seven), multiplied as they are, the rows' zero
// points times the columns' weight sums taken from the sums as they are stored. Paired (Seven, and
// every weight within +-64: kernels/int8.py's 7-bit weights, +-63): two VPMADDUBSW pair sums
// of eight K values are added in int16 before one VPMADDWD widens them, 4 x 127 x 64 = 32512 still
// short of int16's limit, so the sums stay exact with one widening per 64 products, not two (Zen 3,
// the inner loop alone: 1.4-1.5x). The thread's next
// block `next` is fetched a line (4 K values of 16 columns) every `stride` lines from line `phase`,
// as fma_rows fetches its next panel (MiniLM's 7-bit GEMMs in turn at 36 rows, Zen 3: one thread
// 1.07-1.09x, two 1.03-1.06x).
#define BERTKIT_INT8_ROWS(X) X(0) X(1) X(2) X(3)
// The unpaired kernels' loop over the `lines` of a block (4 K values of its 16 columns each), LOAD
// reading the line (b_low / b_high, or one 512-bit b), DOT(r) adding each row's products; the thread's
// next block fetched a line every `stride` lines from line `phase`.
#define BERTKIT_INT8_LINES(LOAD, DOT)                                                                      \
  for (int64_t start = 0; start < lines; start += stride) {                                                \
    if (start + phase < lines)                                                                             \
      _mm_prefetch(reinterpret_cast<const char*>(next + (start + phase) * kBlock * 4), _MM_HINT_T0);      \
    const int64_t end = std::min(lines, start + stride) * 4;                                               \
    for (int64_t i = start * 4; i < end; i += 4) {                                                         \
      LOAD                                                                                                 \
      BERTKIT_INT8_ROWS(DOT)                                                                               \
    }                                                                                                      \
  }
enum class Int8Mode { exact, seven, paired };

// R rows' int32 sums of one 16-column block (low: its first 8 columns, high: the next 8) -> y's
// `columns` (<= 16): where the rows were quantised with a zero point (`Zero`), the zero point times
// the column's weight sum taken off, then times the row's and the column's scale, plus the bias.
template <int R, bool Zero>
__attribute__((target("avx2,fma"), always_inline)) inline void store_int8_rows(
    const __m256i* lows, const __m256i* highs, const float* row_scale, const float* column_scale, const float* bias,
    float* y, int64_t ldy, int64_t columns, const int32_t* zero, const int32_t* column_sums) {
  // A whole block's scales and bias read in place: copied out for every call (two memcpy calls of a
  // variable size) they cost 3-12% of the kernel at one request's rows (Zen 3, harness A/B)
  alignas(32) float scale[kBlock] = {}, start[kBlock] = {}, last[kBlock];
  const float* scales = column_scale;
  const float* biases = bias != nullptr ? bias : start;
  if (columns < kBlock) {
    std::memcpy(scale, column_scale, columns * sizeof(float));
    if (bias != nullptr) std::memcpy(start, bias, columns * sizeof(float));
    scales = scale;
    biases = start;
  }
  const __m256 scale_low = _mm256_loadu_ps(scales), scale_high = _mm256_loadu_ps(scales + 8);
  const __m256 bias_low = _mm256_loadu_ps(biases), bias_high = _mm256_loadu_ps(biases + 8);
  __m256i sums_low = _mm256_setzero_si256(), sums_high = _mm256_setzero_si256();
  if constexpr (Zero) {  // padded to whole blocks of 64 columns: 16 can be read
    sums_low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(column_sums));
    sums_high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(column_sums + 8));
  }
  for (int r = 0; r < R; ++r) {
    __m256i low = lows[r], high = highs[r];
    if constexpr (Zero) {
      const __m256i z = _mm256_set1_epi32(zero[r]);
      low = _mm256_sub_epi32(low, _mm256_mullo_epi32(z, sums_low));
      high = _mm256_sub_epi32(high, _mm256_mullo_epi32(z, sums_high));
    }
    const __m256 s = _mm256_set1_ps(row_scale[r]);
    const __m256 out_low = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(low), s), scale_low, bias_low);
    const __m256 out_high = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(high), s), scale_high, bias_high);
    if (columns == kBlock) {
      _mm256_storeu_ps(y + r * ldy, out_low);
      _mm256_storeu_ps(y + r * ldy + 8, out_high);
    } else {
      _mm256_store_ps(last, out_low);
      _mm256_store_ps(last + 8, out_high);
      std::memcpy(y + r * ldy, last, columns * sizeof(float));
    }
  }
}

template <int R, Int8Mode Mode>
__attribute__((target("avx2,fma"))) void int8_rows_avx2(const int8_t* a, int64_t lda, const int8_t* block, int64_t kp,
                                                         const float* row_scale, const float* column_scale,
                                                         const float* bias, float* y, int64_t ldy, int64_t columns,
                                                         const int32_t* zero, const int32_t* column_sums,
                                                         const int8_t* next, int64_t phase, int64_t stride) {
  constexpr bool Seven = Mode != Int8Mode::exact;
  const __m256i ones = _mm256_set1_epi16(1);
#define BERTKIT_START(r) __m256i low##r = _mm256_setzero_si256(), high##r = _mm256_setzero_si256();
  BERTKIT_INT8_ROWS(BERTKIT_START)
  const int64_t lines = kp / 4;
  if constexpr (Mode == Int8Mode::paired) {  // kp is a multiple of 64: whole pairs of lines
    const int64_t pairs = lines / 2;
    for (int64_t start = 0; start < pairs; start += stride) {
      if (start + phase < pairs) {  // a pair's two lines: one line every `stride` lines, as below
        const char* line = reinterpret_cast<const char*>(next + (start + phase) * 2 * kBlock * 4);
        _mm_prefetch(line, _MM_HINT_T0);
        _mm_prefetch(line + kBlock * 4, _MM_HINT_T0);
      }
      const int64_t end = std::min(pairs, start + stride) * 8;
      for (int64_t i = start * 8; i < end; i += 8) {
      const __m256i b_low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + i * kBlock));
      const __m256i b_high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + i * kBlock + 32));
      const __m256i c_low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + (i + 4) * kBlock));
      const __m256i c_high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + (i + 4) * kBlock + 32));
#define BERTKIT_PAIRED(r)                                                                                  \
      if constexpr (r < R) {                                                                               \
        int32_t words[2];                                                                                  \
        std::memcpy(words, a + r * lda + i, sizeof(words));                                                \
        const __m256i x = _mm256_set1_epi32(words[0]), x_next = _mm256_set1_epi32(words[1]);              \
        low##r = _mm256_add_epi32(low##r, _mm256_madd_epi16(_mm256_add_epi16(                              \
            _mm256_maddubs_epi16(x, b_low), _mm256_maddubs_epi16(x_next, c_low)), ones));                  \
        high##r = _mm256_add_epi32(high##r, _mm256_madd_epi16(_mm256_add_epi16(                            \
            _mm256_maddubs_epi16(x, b_high), _mm256_maddubs_epi16(x_next, c_high)), ones));                \
      }
      BERTKIT_INT8_ROWS(BERTKIT_PAIRED)
      }
    }
  } else {
#define BERTKIT_DOT(r)                                                                                     \
    if constexpr (r < R) {                                                                                 \
      int32_t word;                                                                                        \
      std::memcpy(&word, a + r * lda + i, sizeof(word));                                                   \
      const __m256i x = _mm256_set1_epi32(word);                                                           \
      if constexpr (Seven) {                                                                               \
        low##r = _mm256_add_epi32(low##r, _mm256_madd_epi16(_mm256_maddubs_epi16(x, b_low), ones));        \
        high##r = _mm256_add_epi32(high##r, _mm256_madd_epi16(_mm256_maddubs_epi16(x, b_high), ones));     \
      } else {                                                                                             \
        const __m256i magnitude = _mm256_abs_epi8(x);                                                      \
        low##r = _mm256_add_epi32(low##r, _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(b_low, x)), ones)); \
        high##r = _mm256_add_epi32(high##r, _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(b_high, x)), ones)); \
      }                                                                                                    \
    }
#define BERTKIT_LOAD                                                                                       \
    const __m256i b_low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + i * kBlock));        \
    const __m256i b_high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + i * kBlock + 32));
    BERTKIT_INT8_LINES(BERTKIT_LOAD, BERTKIT_DOT)
  }
  __m256i lows[kInt8Rows], highs[kInt8Rows];
#define BERTKIT_GATHER(r)  \
  if constexpr (r < R) {   \
    lows[r] = low##r;      \
    highs[r] = high##r;    \
  }
  BERTKIT_INT8_ROWS(BERTKIT_GATHER)
  store_int8_rows<R, Seven>(lows, highs, row_scale, column_scale, bias, y, ldy, columns, zero, column_sums);
#undef BERTKIT_START
#undef BERTKIT_PAIRED
#undef BERTKIT_LOAD
#undef BERTKIT_DOT
#undef BERTKIT_GATHER
}

// The same with VPDPBUSD (vnni_int8_usable): `a` holds 8-bit unsigned values with a zero point, each
// step of four K values one instruction per eight columns of a row, the sums exact (255 x 127 x 4 is
// far from int32's limit). Eight rows at a time, each row's 16 sums in one 512-bit register: a line
// of the block (4 K values of its 16 columns, 64 bytes) is one load per eight rows and one VPDPBUSD
// per row (MiniLM's int8 GEMMs in turn, 24 layers' weights, alternated in one process on a Zen 4:
// 1.03-1.07x the AVX2-width kernel of four rows at 36 rows, 1.04-1.09x at 64).
constexpr int64_t kVnniRows = 8;
#undef BERTKIT_INT8_ROWS
#define BERTKIT_INT8_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
template <int R>
__attribute__((target("avx2,fma,avx512f,avx512vl,avx512vnni"))) void int8_rows_vnni(
    const int8_t* a, int64_t lda, const int8_t* block, int64_t kp, const float* row_scale, const float* column_scale,
    const float* bias, float* y, int64_t ldy, int64_t columns, const int32_t* zero, const int32_t* column_sums,
    const int8_t* next, int64_t phase, int64_t stride) {
  __m256i lows[kVnniRows], highs[kVnniRows];
#define BERTKIT_START(r) __m512i sum##r = _mm512_setzero_si512();
  BERTKIT_INT8_ROWS(BERTKIT_START)
  const int64_t lines = kp / 4;
#define BERTKIT_LOAD const __m512i b = _mm512_loadu_si512(block + i * kBlock);
#define BERTKIT_DOT(r)                                                   \
  if constexpr (r < R) {                                                 \
    int32_t word;                                                        \
    std::memcpy(&word, a + r * lda + i, sizeof(word));                   \
    sum##r = _mm512_dpbusd_epi32(sum##r, _mm512_set1_epi32(word), b);    \
  }
  BERTKIT_INT8_LINES(BERTKIT_LOAD, BERTKIT_DOT)
#define BERTKIT_GATHER(r)                            \
  if constexpr (r < R) {                             \
    lows[r] = _mm512_castsi512_si256(sum##r);        \
    highs[r] = _mm512_extracti64x4_epi64(sum##r, 1); \
  }
  BERTKIT_INT8_ROWS(BERTKIT_GATHER)
  store_int8_rows<R, true>(lows, highs, row_scale, column_scale, bias, y, ldy, columns, zero, column_sums);
#undef BERTKIT_START
#undef BERTKIT_LOAD
#undef BERTKIT_DOT
#undef BERTKIT_GATHER
}
#undef BERTKIT_INT8_ROWS
#undef BERTKIT_INT8_LINES

using Int8Kernel = void (*)(const int8_t*, int64_t, const int8_t*, int64_t, const float*, const float*, const float*,
                            float*, int64_t, int64_t, const int32_t*, const int32_t*, const int8_t*, int64_t, int64_t);
#define BERTKIT_MODE(m) {&int8_rows_avx2<1, m>, &int8_rows_avx2<2, m>, &int8_rows_avx2<3, m>, &int8_rows_avx2<4, m>}
constexpr Int8Kernel kInt8Kernels[3][kInt8Rows] = {
    BERTKIT_MODE(Int8Mode::exact), BERTKIT_MODE(Int8Mode::seven), BERTKIT_MODE(Int8Mode::paired)};
#undef BERTKIT_MODE
constexpr Int8Kernel kVnniKernels[kVnniRows] = {&int8_rows_vnni<1>, &int8_rows_vnni<2>, &int8_rows_vnni<3>,
                                                &int8_rows_vnni<4>, &int8_rows_vnni<5>, &int8_rows_vnni<6>,
                                                &int8_rows_vnni<7>, &int8_rows_vnni<8>};

// An item is one 16-column block times one chunk of rows, claimed one at a time on `threads` (as fma_compute).
void int8_avx2(const Int8Problem& p, Threads threads = Threads::team) {
  const int64_t blocks = padded(p.n, kBlock) / kBlock, chunks = (p.m + kInt8RowChunk - 1) / kInt8RowChunk;
  const int64_t block_bytes = (p.kp / 4) * kBlock * 4;
  run_items(threads, chunks * blocks, [&](int64_t item, int64_t next) {
    int64_t chunk = item / blocks * kInt8RowChunk, chunk_end = std::min(p.m, chunk + kInt8RowChunk), j = item % blocks;
    int64_t column = j * kBlock, columns = std::min(kBlock, p.n - column);
    const int8_t* block = p.b + j * block_bytes;
    const int8_t* ahead = next >= 0 ? p.b + next % blocks * block_bytes : block;  // none known: lines already here
    const bool vnni = p.zero != nullptr && vnni_int8_usable();
    const int64_t step = vnni ? kVnniRows : kInt8Rows, passes = (chunk_end - chunk + step - 1) / step;
    for (int64_t r = chunk, phase = 0; r < chunk_end; r += step, ++phase) {
      int64_t rows = std::min(step, chunk_end - r);
      const int mode = p.zero == nullptr ? 0 : p.paired ? 2 : 1;
      const Int8Kernel kernel = vnni ? kVnniKernels[rows - 1] : kInt8Kernels[mode][rows - 1];
      kernel(p.a + r * p.kp, p.kp, block, p.kp, p.row_scale + r, p.weight_scale + column,
             p.bias ? p.bias + column : nullptr, p.y + r * p.n + column, p.n, columns, p.zero ? p.zero + r : nullptr,
             p.column_sums ? p.column_sums + column : nullptr, ahead, phase, passes);
    }
    if (p.gelu)
      for (int64_t r = chunk; r < chunk_end; ++r) gelu_columns(p.y + r * p.n + column, columns);
  });
}

// (M, K) int8 rows q, their (M, 1) scales, the (K, N) int8 weight (any strides), its (N,) scales
// and bias -> (M, N) fp32: (q @ weight) * row_scale * weight_scale + bias.
at::Tensor int8_linear(const at::Tensor& q, const at::Tensor& row_scale, const at::Tensor& weight,
                       const at::Tensor& weight_scale, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(q.scalar_type() == at::kChar && weight.scalar_type() == at::kChar && q.device().is_cpu(),
              "bertkit_int8_linear takes int8 CPU rows and weights");
  TORCH_CHECK(q.dim() == 2 && weight.dim() == 2 && q.size(1) == weight.size(0) && row_scale.numel() == q.size(0) &&
              weight_scale.numel() == weight.size(1), "bertkit_int8_linear: shapes do not match");
  bool has_bias = bias.has_value() && bias->defined();
  int64_t m = q.size(0), k = q.size(1), n = weight.size(1);
  auto scales = row_scale.to(at::kFloat).contiguous().view({m});
  auto column_scales = weight_scale.to(at::kFloat).contiguous();
  at::Tensor bias_values = has_bias ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const bool amx = amx_usable(), avx2 = !amx && avx2_int8_usable();
  if ((!amx && !avx2) || m == 0 || n == 0 || k == 0) {  // oneDNN's s8 GEMM: the same sums, without the tiles
    auto y = at::_int_mm(q.contiguous(), weight).to(at::kFloat) * scales.view({m, 1}) * column_scales;
    return has_bias ? y + bias_values : y;
  }
  auto pack = pack_for<int8_t>(int8_packs, int8_lock, weight, int8_pack);
  int64_t kp = padded(k, kTileK);
  auto rows = q.contiguous();
  if (kp != k) rows = at::constant_pad_nd(rows, {0, kp - k}, 0);  // a tile row is 64 K values
  auto y = at::empty({m, n}, q.options().dtype(at::kFloat));
  Int8Problem problem{rows.data_ptr<int8_t>(), m, kp, n, pack.data_ptr<int8_t>(), scales.data_ptr<float>(),
                      column_scales.data_ptr<float>(), has_bias ? bias_values.data_ptr<float>() : nullptr,
                      y.data_ptr<float>()};
  if (avx2) {
    int8_avx2(problem);
    return y;
  }
  at::parallel_for(0, padded(n, kQuad) / kQuad, 1, [&](int64_t quad0, int64_t quad1) {
    int8_columns(problem, quad0, quad1);
  });
  return y;
}

// ---- int8 with 7-bit activations on AVX2
//
// On AVX2 without VNNI the exact s8 x s8 kernel above spends five vector instructions per 32
// products (the sign moved onto the weight, its magnitude taken, the pair sums widened, added), and
// VPMADDWD issues once a cycle on an AMD Zen 3. With the activations unsigned and below 128
// (fbgemm's `reduce_range` without VNNI, per token here) VPMADDUBSW multiplies them as they are, its
// pair sums still short of int16's limit (2 x 127 x 127): three instructions per 32 products,
// 1.4-1.5x the exact kernel's speed on all-MiniLM-L6-v2's shapes. Each row is quantised here, as
// it is read: its range [min(row, 0), max(row, 0)] over 127 steps, its zero point where 0 falls, so
// the int32 sums hold (x/s + z) . w and z times the column's sum of weights comes off as they are
// stored: y = s (sum - z sum(w)) w_scale + b. With the weights within +-64 too (7-bit weights: the
// intermediate Linears' under kernels/int8.py's `seven_bit`) two pair sums fit one int16 and the
// paired kernel widens once per 64 products; the pack records whether its weights allow it.

std::mutex seven_lock;
std::unordered_map<const void*, Pack> seven_packs;

constexpr int64_t kPairedLimit = 64;  // 4 x 127 x 64 = 32512: two pair sums of 7-bit values fit an int16
constexpr int64_t kSevenTail = 64;    // after the sums: one byte saying whether the pack is paired

int64_t seven_pack_bytes(int64_t k, int64_t n) { return padded(n, kQuad) * (padded(k, kTileK) + 4) + kSevenTail; }

// (K, N) int8 -> int8_pack's bytes, then each column's sum of weights (int32, N padded to 64), then
// whether every weight lies within +-kPairedLimit (the paired kernel's sums cannot saturate)
at::Tensor seven_pack(const at::Tensor& w) {
  int64_t k = w.size(0), n = w.size(1), kp = padded(k, kTileK), np = padded(n, kQuad);
  auto data = PackMemory::zeros(seven_pack_bytes(k, n), at::kChar);
  int8_pack_into(w, data.data_ptr<int8_t>());
  int32_t* sums = reinterpret_cast<int32_t*>(data.data_ptr<int8_t>() + np * kp);
  auto values = w.accessor<int8_t, 2>();
  bool paired = true;
  for (int64_t j = 0; j < n; ++j) {
    int32_t sum = 0;
    for (int64_t i = 0; i < k; ++i) {
      sum += values[i][j];
      paired = paired && std::abs(static_cast<int32_t>(values[i][j])) <= kPairedLimit;
    }
    sums[j] = sum;
  }
  data.data_ptr<int8_t>()[np * kp + np * 4] = paired ? 1 : 0;
  return data;
}

// One row's unsigned values over `steps` (127: 7 bits; 255 with VNNI) in kp bytes (zero past k), its
// scale and zero point.
__attribute__((target("avx2,fma"))) void quantise_row_seven(const float* x, int64_t k, int64_t kp, uint8_t* q,
                                                             float* scale, int32_t* zero, int steps) {
  __m256 low = _mm256_setzero_ps(), high = _mm256_setzero_ps();  // the range holds 0
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    low = _mm256_min_ps(low, v);
    high = _mm256_max_ps(high, v);
  }
  alignas(32) float lows[8], highs[8];
  _mm256_store_ps(lows, low);
  _mm256_store_ps(highs, high);
  float lo = 0.0f, hi = 0.0f;
  for (int j = 0; j < 8; ++j) lo = std::min(lo, lows[j]), hi = std::max(hi, highs[j]);
  for (int64_t j = i; j < k; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
  float s = (hi - lo) / static_cast<float>(steps);
  if (!(s > 0.0f)) s = 1.0f;  // an all-zero row: every value 0, its zero point 0
  const float inverse = 1.0f / s;
  const int32_t z = std::min(steps, std::max(0, static_cast<int32_t>(std::nearbyint(-lo * inverse))));
  const __m256 scale8 = _mm256_set1_ps(inverse);
  const __m256i z8 = _mm256_set1_epi32(z), order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i top = _mm256_set1_epi8(static_cast<char>(steps));
  i = 0;
  for (; i + 32 <= k; i += 32) {  // 32 values: rounded (to nearest even, as nearbyint), offset, packed to bytes
    __m256i v0 = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), scale8)), z8);
    __m256i v1 = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), scale8)), z8);
    __m256i v2 = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 16), scale8)), z8);
    __m256i v3 = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 24), scale8)), z8);
    __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(v0, v1), _mm256_packs_epi32(v2, v3));  // lane-interleaved
    bytes = _mm256_min_epu8(_mm256_permutevar8x32_epi32(bytes, order), top);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), bytes);
  }
  for (; i < k; ++i) q[i] = static_cast<uint8_t>(std::min(steps, std::max(0, static_cast<int32_t>(std::nearbyint(x[i] * inverse)) + z)));
  for (; i < kp; ++i) q[i] = 0;
  *scale = s;
  *zero = z;
}

// (M, K) contiguous fp32 rows times a seven_pack of N columns (its scales, bias or undefined) -> (M, N),
// the rows quantised and the items run on `threads` (16 rows an item for the quantising).
at::Tensor seven_compute(Threads threads, const at::Tensor& input, const at::Tensor& pack, int64_t n,
                         const at::Tensor& column_scales, const at::Tensor& bias, bool gelu = false) {
  int64_t m = input.size(0), k = input.size(1), kp = padded(k, kTileK), np = padded(n, kQuad);
  auto y = at::empty({m, n}, input.options());
  if (m == 0) return y;
  auto rows = at::empty({m, kp}, input.options().dtype(at::kByte));
  auto scales = at::empty({m}, input.options());
  auto zeros = at::empty({m}, input.options().dtype(at::kInt));
  const float* a = input.data_ptr<float>();
  uint8_t* q = rows.data_ptr<uint8_t>();
  float* scale = scales.data_ptr<float>();
  int32_t* zero = zeros.data_ptr<int32_t>();
  constexpr int64_t kQuantiseRows = 16;
  const int steps = row_steps();
  run_items(threads, (m + kQuantiseRows - 1) / kQuantiseRows, [&](int64_t item) {
    for (int64_t r = item * kQuantiseRows; r < std::min(m, (item + 1) * kQuantiseRows); ++r)
      quantise_row_seven(a + r * k, k, kp, q + r * kp, scale + r, zero + r, steps);
  });
  const int8_t* packed = pack.data_ptr<int8_t>();
  Int8Problem problem{reinterpret_cast<const int8_t*>(q), m, kp, n, packed, scale, column_scales.data_ptr<float>(),
                      bias.defined() ? bias.data_ptr<float>() : nullptr, y.data_ptr<float>(), zero,
                      reinterpret_cast<const int32_t*>(packed + np * kp), packed[np * kp + np * 4] == 1, gelu};
  int8_avx2(problem, threads);
  return y;
}

// (M, K) fp32 rows x, the (K, N) int8 weight (any strides), its (N,) scales and bias -> (M, N) fp32:
// x quantised per row to 7 bits (above), times the weight. Where the AVX2 kernel cannot run, the
// same arithmetic in ATen (the same numbers, slower).
at::Tensor seven_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& weight_scale,
                        const std::optional<at::Tensor>& bias, bool gelu) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kChar && x.device().is_cpu(),
              "bertkit_int8_linear_seven takes fp32 CPU rows and int8 weights");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(0) && weight_scale.numel() == weight.size(1),
              "bertkit_int8_linear_seven: shapes do not match");
  bool has_bias = bias.has_value() && bias->defined();
  int64_t m = x.size(0), k = x.size(1), n = weight.size(1);
  auto column_scales = weight_scale.to(at::kFloat).contiguous();
  at::Tensor bias_values = has_bias ? bias->to(at::kFloat).contiguous() : at::Tensor();
  auto input = x.contiguous();
  if (!fma_usable() || m == 0 || n == 0 || k == 0) {
    auto lo = at::clamp_max(std::get<0>(input.min(1, true)), 0), hi = at::clamp_min(std::get<0>(input.max(1, true)), 0);
    const int steps = row_steps();
    auto s = (hi - lo) / static_cast<float>(steps);
    s = at::where(s > 0, s, at::ones_like(s));
    auto inverse = 1.0f / s;
    auto z = at::clamp(at::round(-lo * inverse), 0, steps);
    auto q = at::clamp(at::round(input * inverse) + z, 0, steps).to(at::kDouble);
    auto w = weight.to(at::kDouble);
    auto sums = at::matmul(q, w) - z.to(at::kDouble) * w.sum(0);
    auto y = (sums * s.to(at::kDouble) * column_scales.to(at::kDouble)).to(at::kFloat);
    if (has_bias) y = y + bias_values;
    return gelu ? at::gelu(y) : y;
  }
  return seven_compute(Threads::team, input, pack_for<int8_t>(seven_packs, seven_lock, weight, seven_pack), n,
                       column_scales, has_bias ? bias_values : at::Tensor(), gelu);
}

at::Tensor int8_linear_seven(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& weight_scale,
                             const std::optional<at::Tensor>& bias) {
  return seven_linear(x, weight, weight_scale, bias, false);
}

// The same, then the exact GELU of each output as its item ends (the feed-forward intermediate of the
// int8 graph: inductor's GELU loop ran on the calling thread alone between two ops)
at::Tensor int8_linear_seven_gelu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& weight_scale,
                                  const std::optional<at::Tensor>& bias) {
  return seven_linear(x, weight, weight_scale, bias, true);
}

// An eager model's (kernels/int8.py, Int8Linear on AVX2 without VNNI): the pack made by
// bertkit_seven_pack and held by the caller, the items on torch's threads (as bertkit_fma_linear_packed).
at::Tensor seven_pack_weight(const at::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == at::kChar && weight.dim() == 2 && weight.device().is_cpu(),
              "bertkit_seven_pack takes an int8 (K, N) CPU weight");
  return seven_pack(weight);
}

at::Tensor int8_linear_seven_packed(const at::Tensor& x, const at::Tensor& pack, int64_t n, const at::Tensor& weight_scale,
                                    const std::optional<at::Tensor>& bias, bool gelu) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu() && pack.scalar_type() == at::kChar,
              "bertkit_int8_linear_seven_packed takes fp32 CPU rows and a bertkit_seven_pack");
  TORCH_CHECK(fma_usable(), "bertkit_int8_linear_seven_packed needs a CPU with AVX2");
  auto input = x.contiguous();
  int64_t k = input.size(-1), m = input.numel() / std::max<int64_t>(k, 1);
  TORCH_CHECK(pack.numel() == seven_pack_bytes(k, n) && weight_scale.numel() == n,
              "bertkit_int8_linear_seven_packed: the pack is not of a (", k, ", ", n, ") weight");
  bool has_bias = bias.has_value() && bias->defined();
  auto sizes = input.sizes().vec();
  sizes.back() = n;
  return seven_compute(Threads::torch, input.view({m, k}), pack, n, weight_scale.to(at::kFloat).contiguous(),
                       has_bias ? bias->to(at::kFloat).contiguous() : at::Tensor(), gelu).view(sizes);
}

// ---- attention over a short input
//
// softmax(q k^T / sqrt(D) + mask) v for each sequence and head, where torch's CPU flash attention
// spends 65-70 µs per layer on one input of 40 tokens (its blocks, buffers and a GEMM call per
// block) for a few µs of arithmetic; this kernel 31-34 µs. Up to kShortKeys keys a head's scores fit
// in registers: K^T is gathered once per head (16 keys per vector), four query rows at a time take
// their scores, softmax and context rows. Longer inputs take torch's SDPA.

constexpr int64_t kShortKeys = 64;  // past this torch's flash attention was as fast or faster

// e^x for x <= 0 (a score minus its row's maximum), ~2 ulp; 0 below -87 (masked keys: -inf).
__attribute__((target("avx512f"))) inline __m512 exp_nonpositive(__m512 x) {
  const __mmask16 alive = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // x - n ln2, in two parts
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);  // Cephes' expf polynomial
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(alive, _mm512_scalef_ps(p, n));
}

struct HeadProblem {
  const float *q, *k, *v;    // the head's first row; rows `stride` floats apart
  int64_t q_stride, k_stride, v_stride, out_stride;
  int64_t t, d;              // tokens, head dimensions (a multiple of 16)
  const float* key_bias;     // (chunks * 16): 0 where a key may be attended, -inf elsewhere
  float scale;
  float* out;
};

// Scores, softmax and context for R query rows from i (the last row repeated past the end): R x C
// score vectors and R x 2 context sums (even and odd keys) are independent chains of FMAs.
template <int C, int R>
__attribute__((target("avx512f"))) void query_rows(const HeadProblem& p, const float* kt, int64_t i, float* probs) {
  const float* q[R];
  float* o[R];
  _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
    int64_t row = std::min<int64_t>(i + r, p.t - 1);
    q[r] = p.q + row * p.q_stride;
    o[r] = p.out + row * p.out_stride;
  }
  __m512 s[R][C];
  _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) {
    __m512 bias = _mm512_loadu_ps(p.key_bias + 16 * c);
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) s[r][c] = bias;
  }
  for (int64_t e = 0; e < p.d; ++e) {
    __m512 a[R];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) a[r] = _mm512_set1_ps(q[r][e] * p.scale);
    _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) {
      __m512 keys = _mm512_loadu_ps(kt + e * C * 16 + 16 * c);
      _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) s[r][c] = _mm512_fmadd_ps(a[r], keys, s[r][c]);
    }
  }
  _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
    __m512 m = s[r][0];
    _Pragma("GCC unroll 8") for (int c = 1; c < C; ++c) m = _mm512_max_ps(m, s[r][c]);
    float top = _mm512_reduce_max_ps(m);
    if (top == -INFINITY) top = 0.0f;  // no key to attend: zeros, as torch's safe softmax gives
    __m512 sum = _mm512_setzero_ps();
    _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) {
      s[r][c] = exp_nonpositive(_mm512_sub_ps(s[r][c], _mm512_set1_ps(top)));
      sum = _mm512_add_ps(sum, s[r][c]);
    }
    float total = _mm512_reduce_add_ps(sum);
    __m512 inverse = _mm512_set1_ps(total > 0.0f ? 1.0f / total : 0.0f);
    _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) _mm512_storeu_ps(probs + (r * C + c) * 16, _mm512_mul_ps(s[r][c], inverse));
  }
  for (int64_t e = 0; e < p.d; e += 16) {  // context: the probabilities times v, 16 dimensions at a time
    __m512 even[R], odd[R];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 1 < p.t; j += 2) {
      __m512 va = _mm512_loadu_ps(p.v + j * p.v_stride + e), vb = _mm512_loadu_ps(p.v + (j + 1) * p.v_stride + e);
      _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
        even[r] = _mm512_fmadd_ps(_mm512_set1_ps(probs[r * C * 16 + j]), va, even[r]);
        odd[r] = _mm512_fmadd_ps(_mm512_set1_ps(probs[r * C * 16 + j + 1]), vb, odd[r]);
      }
    }
    if (j < p.t) {
      __m512 va = _mm512_loadu_ps(p.v + j * p.v_stride + e);
      _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) even[r] = _mm512_fmadd_ps(_mm512_set1_ps(probs[r * C * 16 + j]), va, even[r]);
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) _mm512_storeu_ps(o[r] + e, _mm512_add_ps(even[r], odd[r]));
  }
}

template <int C>
__attribute__((target("avx512f"))) void attend_head(const HeadProblem& p) {
  constexpr int R = C <= 4 ? 4 : 2;  // R x C score vectors held in registers
  alignas(64) float kt[64 * C * 16];  // K^T: (d, C * 16), zero past the last key
  alignas(64) float probs[R * C * 16];
  std::vector<float> wide;
  float* keys = kt;
  if (p.d > 64) {
    wide.resize(p.d * C * 16);
    keys = wide.data();
  }
  // K^T: 16 keys' values of one dimension per gather, zero past the last key
  const __m512i offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32(static_cast<int>(p.k_stride)));
  for (int c = 0; c < C; ++c) {
    int64_t present = std::min<int64_t>(16, p.t - 16 * c);
    __mmask16 mask = present <= 0 ? 0 : static_cast<__mmask16>((1u << present) - 1);
    const float* first = p.k + 16 * c * p.k_stride;
    for (int64_t e = 0; e < p.d; ++e)
      _mm512_storeu_ps(keys + e * C * 16 + 16 * c,
                      _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mask, offsets, first + e, 4));
  }
  for (int64_t i = 0; i < p.t; i += R) query_rows<C, R>(p, keys, i, probs);
}

using HeadKernel = void (*)(const HeadProblem&);
template <int... Cs>
HeadKernel head_kernel(int64_t chunks, std::integer_sequence<int, Cs...>) {
  HeadKernel kernels[] = {&attend_head<Cs + 1>...};
  return kernels[chunks - 1];
}

// The same kernel on AVX2 (CPUs without AVX-512): 8 keys per vector, so up to 64 keys take 8
// chunks; R x C score vectors (attend_head8 picks R) and the context's sums (context_rows8) in the
// 16 AVX registers.
__attribute__((target("avx2,fma"))) inline float reduce_max8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

__attribute__((target("avx2,fma"))) inline float reduce_add8(__m256 v) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
}

// e^x for x <= 0 as exp_nonpositive, 2^n put in the exponent bits (n >= -126 above the cut-off).
__attribute__((target("avx2,fma"))) inline __m256 exp_nonpositive8(__m256 x) {
  const __m256 alive = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(exponent)), alive);
}

// The context of R query rows: their probabilities (row r at probs + r * stride) times v, G groups of 8
// dimensions from e0 at a time, S consecutive keys in separate sums: R x G x S independent chains of
// FMAs (eight or more hide the FMA's latency); rows r < `rows` stored at o[r]. Every index into the
// sums is a constant once unrolled: indexed by the run-time `rows`, GCC kept them in memory, storing
// each after its FMA (all-MiniLM-L6-v2's heads at 8-64 tokens ran 1.4-2.0x slower so, Zen 3).
template <int R, int G, int S>
__attribute__((target("avx2,fma"))) inline void context_block(const HeadProblem& p, const float* probs, int64_t stride,
                                                              float* const* o, int64_t rows, int64_t e0) {
  __m256 sum[S][R][G];
  _Pragma("GCC unroll 8") for (int s = 0; s < S; ++s)
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r)
      _Pragma("GCC unroll 8") for (int g = 0; g < G; ++g) sum[s][r][g] = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + S <= p.t; j += S) {
    _Pragma("GCC unroll 8") for (int s = 0; s < S; ++s) {
      const float* v = p.v + (j + s) * p.v_stride + e0;
      __m256 weight[R];
      _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) weight[r] = _mm256_broadcast_ss(probs + r * stride + j + s);
      _Pragma("GCC unroll 8") for (int g = 0; g < G; ++g) {
        const __m256 values = _mm256_loadu_ps(v + 8 * g);
        _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) sum[s][r][g] = _mm256_fmadd_ps(weight[r], values, sum[s][r][g]);
      }
    }
  }
  for (; j < p.t; ++j) {  // the last keys, fewer than S
    const float* v = p.v + j * p.v_stride + e0;
    _Pragma("GCC unroll 8") for (int g = 0; g < G; ++g) {
      const __m256 values = _mm256_loadu_ps(v + 8 * g);
      _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r)
        sum[0][r][g] = _mm256_fmadd_ps(_mm256_broadcast_ss(probs + r * stride + j), values, sum[0][r][g]);
    }
  }
  _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r)
    if (r < rows) _Pragma("GCC unroll 8") for (int g = 0; g < G; ++g) {
      __m256 total = sum[0][r][g];
      _Pragma("GCC unroll 8") for (int s = 1; s < S; ++s) total = _mm256_add_ps(total, sum[s][r][g]);
      _mm256_storeu_ps(o[r] + e0 + 8 * g, total);
    }
}

// The context of R rows over all the head's dimensions: four rows two groups at a time, fewer rows
// four groups (one row, two keys apart too); what is left of a head size past whole blocks of groups
// (48 dimensions at four groups) a group at a time.
template <int R>
__attribute__((target("avx2,fma"))) inline void context_rows8(const HeadProblem& p, const float* probs, int64_t stride,
                                                              float* const* o, int64_t rows) {
  constexpr int G = R >= 4 ? 2 : 4, S = R == 1 ? 2 : 1;
  int64_t e = 0;
  for (; e + 8 * G <= p.d; e += 8 * G) context_block<R, G, S>(p, probs, stride, o, rows, e);
  for (; e < p.d; e += 8) context_block<R, 1, 2>(p, probs, stride, o, rows, e);
}

// K^T of a head: kt[e * width + j] = k[j][e] for its t keys, zero for j in [t, width) (width and d
// multiples of 8): eight keys' eight dimensions at a time through an 8 x 8 transpose in registers
// (element by element it took a fifth of the head's time at 36 tokens).
__attribute__((target("avx2,fma"))) inline void transpose_keys(const HeadProblem& p, float* kt, int64_t width) {
  for (int64_t j = 0; j < width; j += 8)
    for (int64_t e = 0; e < p.d; e += 8) {
      __m256 r[8];
      _Pragma("GCC unroll 8") for (int i = 0; i < 8; ++i)
        r[i] = j + i < p.t ? _mm256_loadu_ps(p.k + (j + i) * p.k_stride + e) : _mm256_setzero_ps();
      const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
      const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
      const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
      const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
      const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)), u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
      const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)), u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
      const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0)), u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
      const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0)), u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
      float* out = kt + e * width + j;
      _mm256_store_ps(out, _mm256_permute2f128_ps(u0, u4, 0x20));
      _mm256_store_ps(out + width, _mm256_permute2f128_ps(u1, u5, 0x20));
      _mm256_store_ps(out + 2 * width, _mm256_permute2f128_ps(u2, u6, 0x20));
      _mm256_store_ps(out + 3 * width, _mm256_permute2f128_ps(u3, u7, 0x20));
      _mm256_store_ps(out + 4 * width, _mm256_permute2f128_ps(u0, u4, 0x31));
      _mm256_store_ps(out + 5 * width, _mm256_permute2f128_ps(u1, u5, 0x31));
      _mm256_store_ps(out + 6 * width, _mm256_permute2f128_ps(u2, u6, 0x31));
      _mm256_store_ps(out + 7 * width, _mm256_permute2f128_ps(u3, u7, 0x31));
    }
}

template <int C, int R>
__attribute__((target("avx2,fma"))) void query_rows8(const HeadProblem& p, const float* kt, int64_t i, float* probs) {
  const float* q[R];
  float* o[R];
  _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
    int64_t row = std::min<int64_t>(i + r, p.t - 1);
    q[r] = p.q + row * p.q_stride;
    o[r] = p.out + row * p.out_stride;
  }
  __m256 s[R][C];
  _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) {
    __m256 bias = _mm256_loadu_ps(p.key_bias + 8 * c);
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) s[r][c] = bias;
  }
  for (int64_t e = 0; e < p.d; ++e) {
    __m256 a[R];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) a[r] = _mm256_set1_ps(q[r][e] * p.scale);
    _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) {
      __m256 keys = _mm256_load_ps(kt + e * C * 8 + 8 * c);
      _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) s[r][c] = _mm256_fmadd_ps(a[r], keys, s[r][c]);
    }
  }
  _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
    __m256 m = s[r][0];
    _Pragma("GCC unroll 8") for (int c = 1; c < C; ++c) m = _mm256_max_ps(m, s[r][c]);
    float top = reduce_max8(m);
    if (top == -INFINITY) top = 0.0f;  // no key to attend: zeros, as torch's safe softmax gives
    __m256 sum = _mm256_setzero_ps();
    _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) {
      s[r][c] = exp_nonpositive8(_mm256_sub_ps(s[r][c], _mm256_set1_ps(top)));
      sum = _mm256_add_ps(sum, s[r][c]);
    }
    float total = reduce_add8(sum);
    __m256 inverse = _mm256_set1_ps(total > 0.0f ? 1.0f / total : 0.0f);
    _Pragma("GCC unroll 8") for (int c = 0; c < C; ++c) _mm256_store_ps(probs + (r * C + c) * 8, _mm256_mul_ps(s[r][c], inverse));
  }
  context_rows8<R>(p, probs, C * 8, o, std::min<int64_t>(R, p.t - i));
}

template <int C>
__attribute__((target("avx2,fma"))) void attend_head8(const HeadProblem& p) {
  // R x C score vectors: 8-12 chains of FMAs where they fit the 16 registers (beyond 12, two rows
  // spilling a few measured faster than one row's 7-8 chains)
  constexpr int R = C <= 2 ? 4 : C <= 4 ? 3 : 2;
  std::vector<float> wide;
  alignas(32) float kt_local[64 * C * 8];  // K^T: (d, C * 8), zero past the last key
  alignas(32) float probs[R * C * 8];
  float* kt = kt_local;
  if (p.d > 64) {  // a wider head: K^T on the heap, 32-byte aligned
    wide.resize(p.d * C * 8 + 8);
    kt = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(wide.data()) + 31) & ~uintptr_t(31));
  }
  transpose_keys(p, kt, C * 8);
  for (int64_t i = 0; i < p.t; i += R) query_rows8<C, R>(p, kt, i, probs);
}

template <int... Cs>
HeadKernel head_kernel8(int64_t chunks, std::integer_sequence<int, Cs...>) {
  HeadKernel kernels[] = {&attend_head8<Cs + 1>...};
  return kernels[chunks - 1];
}

// Longer sequences on AVX2 (up to kLongKeys keys; torch's CPU flash attention took ~5x the
// arithmetic's time on batches of 16-128 tokens, AMD EPYC Zen 3): the scores no longer fit in
// registers, so a head's K^T (d x keys) and four query rows' scores live in a per-thread buffer
// (L1 / L2). For each block of 16 keys, four rows' sums (8 registers) over the head's dimensions;
// then each row's softmax in place; then the context as the short kernel makes it.
constexpr int64_t kLongKeys = 512, kLongRows = 4, kKeyBlock = 16;

__attribute__((target("avx2,fma"))) void attend_head8_long(const HeadProblem& p) {
  const int64_t lp = padded(p.t, kKeyBlock), d = p.d;
  thread_local std::vector<float> buffer;
  const size_t need = static_cast<size_t>(d * lp + kLongRows * lp + kLongRows * d + 8);
  if (buffer.size() < need) buffer.resize(need);
  float* kt = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buffer.data()) + 31) & ~uintptr_t(31));
  float* probs = kt + d * lp;          // (kLongRows, lp); lp a multiple of 16 keeps it 32-byte aligned
  float* scaled = probs + kLongRows * lp;  // (kLongRows, d): the query rows times the scale
  transpose_keys(p, kt, lp);
  for (int64_t i = 0; i < p.t; i += kLongRows) {
    const int64_t rows = std::min(kLongRows, p.t - i);
    for (int64_t r = 0; r < kLongRows; ++r) {
      const float* q = p.q + std::min(i + r, p.t - 1) * p.q_stride;
      for (int64_t e = 0; e < d; ++e) scaled[r * d + e] = q[e] * p.scale;
    }
    for (int64_t c = 0; c < lp; c += kKeyBlock) {  // scores: 4 rows x 16 keys in 8 registers
      __m256 s00 = _mm256_setzero_ps(), s01 = s00, s10 = s00, s11 = s00, s20 = s00, s21 = s00, s30 = s00, s31 = s00;
      const float* column = kt + c;
      _Pragma("GCC unroll 4") for (int64_t e = 0; e < d; ++e, column += lp) {
        const __m256 k0 = _mm256_load_ps(column), k1 = _mm256_load_ps(column + 8);
        __m256 a = _mm256_broadcast_ss(scaled + e);
        s00 = _mm256_fmadd_ps(a, k0, s00); s01 = _mm256_fmadd_ps(a, k1, s01);
        a = _mm256_broadcast_ss(scaled + d + e);
        s10 = _mm256_fmadd_ps(a, k0, s10); s11 = _mm256_fmadd_ps(a, k1, s11);
        a = _mm256_broadcast_ss(scaled + 2 * d + e);
        s20 = _mm256_fmadd_ps(a, k0, s20); s21 = _mm256_fmadd_ps(a, k1, s21);
        a = _mm256_broadcast_ss(scaled + 3 * d + e);
        s30 = _mm256_fmadd_ps(a, k0, s30); s31 = _mm256_fmadd_ps(a, k1, s31);
      }
      _mm256_store_ps(probs + c, s00); _mm256_store_ps(probs + c + 8, s01);
      _mm256_store_ps(probs + lp + c, s10); _mm256_store_ps(probs + lp + c + 8, s11);
      _mm256_store_ps(probs + 2 * lp + c, s20); _mm256_store_ps(probs + 2 * lp + c + 8, s21);
      _mm256_store_ps(probs + 3 * lp + c, s30); _mm256_store_ps(probs + 3 * lp + c + 8, s31);
    }
    for (int64_t r = 0; r < rows; ++r) {  // softmax over the row's keys (none past the last)
      float* row = probs + r * lp;
      for (int64_t j = p.t; j < lp; ++j) row[j] = -INFINITY;
      __m256 m = _mm256_set1_ps(-INFINITY);
      for (int64_t j = 0; j < lp; j += 8) m = _mm256_max_ps(m, _mm256_load_ps(row + j));
      const __m256 top = _mm256_set1_ps(reduce_max8(m));
      __m256 sum = _mm256_setzero_ps();
      for (int64_t j = 0; j < lp; j += 8) {
        const __m256 e = exp_nonpositive8(_mm256_sub_ps(_mm256_load_ps(row + j), top));
        _mm256_store_ps(row + j, e);
        sum = _mm256_add_ps(sum, e);
      }
      const __m256 inverse = _mm256_set1_ps(1.0f / reduce_add8(sum));  // the top key gives e^0 = 1
      for (int64_t j = 0; j < lp; j += 8) _mm256_store_ps(row + j, _mm256_mul_ps(_mm256_load_ps(row + j), inverse));
    }
    float* out[kLongRows];
    for (int64_t r = 0; r < kLongRows; ++r) out[r] = p.out + std::min(i + r, p.t - 1) * p.out_stride;
    context_rows8<kLongRows>(p, probs, lp, out, rows);
  }
}

bool avx2_attention_usable() {
  static const bool usable = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return usable;
}

bool short_attention_usable() { return avx512_usable() || avx2_attention_usable(); }

// Where the keys of a query lie: each run of one nonzero value in a row of `segments` is a sequence
// attending only to itself (inputs packed one after another), 0 marks padding (its rows come out
// zero); a bool mask is one sequence per row, its padding False.
struct Segment {
  int64_t row, start, length;
};

std::vector<Segment> segments_of(const std::optional<at::Tensor>& segments, int64_t b, int64_t t,
                                 std::vector<Segment>& padding) {
  std::vector<Segment> found;
  if (!segments.has_value() || !segments->defined()) {
    for (int64_t s = 0; s < b; ++s) found.push_back({s, 0, t});
    return found;
  }
  TORCH_CHECK(segments->numel() == b * t, "bertkit_attention: a (B, T) mask or segment ids");
  auto ids = segments->to(at::kLong).contiguous();
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t s = 0; s < b; ++s)
    for (int64_t j = 0; j < t;) {
      int64_t end = j + 1;
      while (end < t && id[s * t + end] == id[s * t + j]) ++end;
      (id[s * t + j] != 0 ? found : padding).push_back({s, j, end - j});
      j = end;
    }
  return found;
}

// The key bias of a sequence of `length` keys: 0 for its keys, -inf past them (up to its last chunk).
const float* key_bias(int64_t length) {
  static const std::vector<float> bias = [] {
    std::vector<float> values(2 * kShortKeys, -INFINITY);
    std::fill(values.begin(), values.begin() + kShortKeys, 0.0f);
    return values;
  }();
  return bias.data() + kShortKeys - length;
}

// (B, T, H) query, key, value (rows of any stride, the last dimension contiguous) and (B, T) segment
// ids or a bool mask (`segments_of`; none: one sequence per row) -> (B, T, H) context, `heads` heads.
// A sequence of up to kShortKeys tokens runs this file's kernel (AVX-512, else AVX2; on AVX2 up to
// kLongKeys the long one), a longer one (or a CPU with neither, or a head size not a multiple of the
// vector width) torch's attention on its rows alone.
at::Tensor attention_on(Threads threads, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const std::optional<at::Tensor>& mask, int64_t heads) {
  TORCH_CHECK(heads > 0 && q.dim() == 3 && q.sizes() == k.sizes() && q.sizes() == v.sizes() && q.size(2) % heads == 0,
              "bertkit_attention: (B, T, H) query, key and value of one shape");
  int64_t b = q.size(0), t = q.size(1), h = q.size(2), d = h / heads;
  std::vector<Segment> padding;
  std::vector<Segment> segments = segments_of(mask, b, t, padding);
  const bool wide = avx512_usable();  // 16 keys per vector; else AVX2's 8
  bool kernel_fits = short_attention_usable() && q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
                     v.scalar_type() == at::kFloat && q.device().is_cpu() && d % (wide ? 16 : 8) == 0 &&
                     q.stride(2) == 1 && k.stride(2) == 1 && v.stride(2) == 1;
  auto out = at::empty({b, t, h}, q.options());
  for (const Segment& g : padding)  // padding rows: zeros
    std::memset(static_cast<char*>(out.data_ptr()) + (g.row * t + g.start) * h * out.element_size(), 0,
                out.element_size() * g.length * h);
  std::vector<Segment> short_ones;
  for (const Segment& g : segments) {
    if (kernel_fits && (g.length <= kShortKeys || (!wide && g.length <= kLongKeys))) {
      short_ones.push_back(g);
      continue;
    }
    // torch's attention on this sequence's (1, A, L, D) views, nothing masked
    auto split = [&](const at::Tensor& x) {
      return x[g.row].narrow(0, g.start, g.length).view({1, g.length, heads, d}).transpose(1, 2);
    };
    out[g.row].narrow(0, g.start, g.length).copy_(
        at::scaled_dot_product_attention(split(q), split(k), split(v)).transpose(1, 2).reshape({g.length, h}));
  }
  if (short_ones.empty()) return out;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const float *qd = q.data_ptr<float>(), *kd = k.data_ptr<float>(), *vd = v.data_ptr<float>();
  float* od = out.data_ptr<float>();
  auto kernels = std::make_integer_sequence<int, kShortKeys / 16>{};
  auto kernels8 = std::make_integer_sequence<int, kShortKeys / 8>{};
  auto one_head = [&](int64_t item) {  // item: a sequence's head
    const Segment& g = short_ones[item / heads];
    int64_t a = item % heads;
    HeadProblem p{qd + g.row * q.stride(0) + g.start * q.stride(1) + a * d,
                  kd + g.row * k.stride(0) + g.start * k.stride(1) + a * d,
                  vd + g.row * v.stride(0) + g.start * v.stride(1) + a * d, q.stride(1), k.stride(1), v.stride(1), h,
                  g.length, d, key_bias(std::min(g.length, kShortKeys)), scale, od + (g.row * t + g.start) * h + a * d};
    if (wide) head_kernel((g.length + 15) / 16, kernels)(p);
    else if (g.length <= kShortKeys) head_kernel8((g.length + 7) / 8, kernels8)(p);
    else attend_head8_long(p);
  };
  const int64_t items = static_cast<int64_t>(short_ones.size()) * heads;
  if (!wide || team_graphs()) {  // these graphs: every op of them on the Team (their loops run alone: compiled.py)
    run_items(threads, items, one_head);
    return out;
  }
  at::parallel_for(0, items, 1, [&](int64_t first, int64_t last) {
    for (int64_t item = first; item < last; ++item) one_head(item);
  });
  return out;
}

// ---- residual + LayerNorm
//
// LayerNorm(y + residual) over each row of a graph's output projections, its rows on the ops' threads.
// Inductor's loop for it recomputed the row's 1 / sqrt(variance + eps) for every 8 values (the division
// and square root scalar, kept in the loop by errno's branch): 14 µs per all-MiniLM-L6-v2 LayerNorm of
// 36 rows on the calling thread alone, 2 x 6 of them per request (AMD EPYC Zen 3).

constexpr int64_t kNormRows = 4;  // rows per item

// One row: x = y + residual into out, its mean, then the variance about the mean (a second pass: E[x^2] -
// mean^2 cancels where the mean is large), then (x - mean) * rstd * weight + bias.
__attribute__((target("avx2,fma"))) void add_norm_row(const float* y, const float* residual, const float* weight,
                                                       const float* bias, float eps, int64_t n, float* out) {
  __m256 sum0 = _mm256_setzero_ps(), sum1 = sum0;
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) {
    const __m256 a = _mm256_add_ps(_mm256_loadu_ps(y + c), _mm256_loadu_ps(residual + c));
    const __m256 b = _mm256_add_ps(_mm256_loadu_ps(y + c + 8), _mm256_loadu_ps(residual + c + 8));
    _mm256_storeu_ps(out + c, a);
    _mm256_storeu_ps(out + c + 8, b);
    sum0 = _mm256_add_ps(sum0, a);
    sum1 = _mm256_add_ps(sum1, b);
  }
  float tail = 0.0f;
  for (; c < n; ++c) tail += (out[c] = y[c] + residual[c]);
  const float mean = (reduce_add8(_mm256_add_ps(sum0, sum1)) + tail) / static_cast<float>(n);
  const __m256 center = _mm256_set1_ps(mean);
  __m256 square0 = _mm256_setzero_ps(), square1 = square0;
  for (c = 0; c + 16 <= n; c += 16) {
    const __m256 a = _mm256_sub_ps(_mm256_loadu_ps(out + c), center), b = _mm256_sub_ps(_mm256_loadu_ps(out + c + 8), center);
    square0 = _mm256_fmadd_ps(a, a, square0);
    square1 = _mm256_fmadd_ps(b, b, square1);
  }
  float squares = 0.0f;
  for (; c < n; ++c) squares += (out[c] - mean) * (out[c] - mean);
  const float rstd = 1.0f / std::sqrt((reduce_add8(_mm256_add_ps(square0, square1)) + squares) / static_cast<float>(n) + eps);
  const __m256 scale = _mm256_set1_ps(rstd);
  for (c = 0; c + 8 <= n; c += 8) {
    const __m256 a = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(out + c), center), scale);
    _mm256_storeu_ps(out + c, _mm256_fmadd_ps(a, _mm256_loadu_ps(weight + c), _mm256_loadu_ps(bias + c)));
  }
  for (; c < n; ++c) out[c] = (out[c] - mean) * rstd * weight[c] + bias[c];
}

at::Tensor add_norm(const at::Tensor& y, const at::Tensor& residual, const at::Tensor& weight, const at::Tensor& bias,
                    double eps) {
  TORCH_CHECK(y.scalar_type() == at::kFloat && residual.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat &&
              bias.scalar_type() == at::kFloat && y.device().is_cpu() && residual.device().is_cpu(),
              "bertkit_add_norm takes fp32 CPU tensors");
  const int64_t n = y.size(-1), m = y.numel() / std::max<int64_t>(n, 1);
  TORCH_CHECK(residual.numel() == y.numel() && residual.size(-1) == n && weight.numel() == n && bias.numel() == n,
              "bertkit_add_norm: y and residual of one shape, a weight and bias per column");
  if (!fma_usable()) return at::layer_norm(y + residual.reshape(y.sizes()), {n}, weight, bias, eps);
  auto a = y.contiguous(), r = residual.contiguous(), w = weight.contiguous(), b = bias.contiguous();
  auto out = at::empty(y.sizes(), y.options());
  const float *ya = a.data_ptr<float>(), *ra = r.data_ptr<float>(), *wa = w.data_ptr<float>(), *ba = b.data_ptr<float>();
  float* o = out.data_ptr<float>();
  run_items(Threads::team, (m + kNormRows - 1) / kNormRows, [&](int64_t item) {
    for (int64_t row = item * kNormRows; row < std::min(m, (item + 1) * kNormRows); ++row)
      add_norm_row(ya + row * n, ra + row * n, wa, ba, static_cast<float>(eps), n, o + row * n);
  });
  return out;
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& mask,
                     int64_t heads) {
  return attention_on(Threads::team, q, k, v, mask, heads);
}

at::Tensor attention_eager(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::optional<at::Tensor>& mask, int64_t heads) {
  return attention_on(Threads::torch, q, k, v, mask, heads);
}

void set_pack_pages(bool huge) { PackMemory::set_huge(huge); }

void set_team_spin(int64_t milliseconds) {
  TORCH_CHECK(milliseconds >= 0, "bertkit_set_team_spin: a spin of ", milliseconds, " ms");
  Team::set_spin(milliseconds * 1000);
}

void set_team_steer(bool steer) { Team::set_steer(steer); }

// A job of two items whose caller's item waits (up to 50 ms) for a worker to take the other ->
// [the caller's CPU, the CPU the worker ran its item on (-1: none came), microseconds from the job's
// start until it did]: where a worker woken after a rest runs (a test, and the A/B in docs/speed.md).
std::vector<int64_t> team_wake_probe() {
  const auto started = std::chrono::steady_clock::now();
  const auto caller = std::this_thread::get_id();
  const int64_t caller_cpu = sched_getcpu();
  std::atomic<int64_t> cpu{-1}, waited{-1};
  run_items(Threads::team, 2, [&](int64_t) {
    if (std::this_thread::get_id() != caller) {
      const auto now = std::chrono::steady_clock::now();
      waited.store(std::chrono::duration_cast<std::chrono::microseconds>(now - started).count());
      cpu.store(sched_getcpu());
      return;
    }
    while (cpu.load() < 0 && std::chrono::steady_clock::now() - started < std::chrono::milliseconds(50)) _mm_pause();
  });
  return {caller_cpu, cpu.load(), waited.load()};
}

bool amx_int8() { return amx_usable(); }
bool avx2_int8() { return avx2_int8_usable(); }
bool vnni_int8() { return vnni_int8_usable(); }
bool bf16_graph() { return bf16_usable(); }
int64_t int8_row_steps() { return row_steps(); }
}  // namespace

TORCH_LIBRARY(bertkit, m) {
  m.def("bertkit_mkl_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("bertkit_fma_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("bertkit_fma_linear_gelu(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("bertkit_fma_usable() -> bool", &fma_usable);  // whether bertkit_fma_linear runs its own kernel here
  m.def("bertkit_int8_linear(Tensor q, Tensor row_scale, Tensor weight, Tensor weight_scale, Tensor? bias) -> Tensor");
  m.def("bertkit_amx_int8() -> bool", &amx_int8);  // whether bertkit_int8_linear runs on AMX here
  m.def("bertkit_avx2_int8() -> bool", &avx2_int8);  // whether it runs its AVX2 kernel here (no VNNI, no AMX)
  m.def("bertkit_vnni_int8() -> bool", &vnni_int8);  // whether bertkit_int8_linear_seven sums with VNNI here
  m.def("bertkit_int8_row_steps() -> int", &int8_row_steps);  // the steps it quantises a row to (127 or 255)
  m.def("bertkit_team_graphs() -> bool", &team_graphs);  // whether the graphs' GEMMs are the Team's kernels here
  m.def("bertkit_bf16_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("bertkit_bf16_linear_gelu(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("bertkit_bf16_usable() -> bool", &bf16_graph);  // whether bertkit_bf16_linear runs its own kernel here
  m.def("bertkit_int8_linear_seven(Tensor x, Tensor weight, Tensor weight_scale, Tensor? bias) -> Tensor");
  m.def("bertkit_int8_linear_seven_gelu(Tensor x, Tensor weight, Tensor weight_scale, Tensor? bias) -> Tensor");
  m.def("bertkit_seven_pack(Tensor weight) -> Tensor");
  m.def("bertkit_int8_linear_seven_packed(Tensor x, Tensor pack, int n, Tensor weight_scale, Tensor? bias, bool gelu=False) -> Tensor");
  m.def("bertkit_attention(Tensor q, Tensor k, Tensor v, Tensor? mask, int heads) -> Tensor");
  m.def("bertkit_add_norm(Tensor y, Tensor residual, Tensor weight, Tensor bias, float eps) -> Tensor");
  // the same two ops on torch's OpenMP threads, for eager models (run_items)
  m.def("bertkit_fma_pack(Tensor weight) -> Tensor");
  m.def("bertkit_fma_linear_packed(Tensor x, Tensor pack, int n, Tensor? bias, bool gelu=False) -> Tensor");
  m.def("bertkit_attention_eager(Tensor q, Tensor k, Tensor v, Tensor? mask, int heads) -> Tensor");
  m.def("bertkit_short_attention() -> bool", &short_attention_usable);  // whether bertkit_attention runs its own kernel here
  m.def("bertkit_set_team_spin(int milliseconds) -> ()", &set_team_spin);  // the graph ops' workers' spin after a call
  m.def("bertkit_set_pack_pages(bool huge) -> ()", &set_pack_pages);  // packs made from now on: 2 MB pages or 4 KB
  m.def("bertkit_set_team_steer(bool steer) -> ()", &set_team_steer);  // sleeping workers woken off the caller's CPU
  m.def("bertkit_team_wake_probe() -> int[]", &team_wake_probe);  // where and when a worker takes a job's item
}
TORCH_LIBRARY_IMPL(bertkit, CPU, m) {
  m.impl("bertkit_mkl_linear", &mkl_linear);
  m.impl("bertkit_fma_linear", &fma_linear);
  m.impl("bertkit_fma_linear_gelu", &fma_linear_gelu);
  m.impl("bertkit_bf16_linear", &bf16_linear);
  m.impl("bertkit_bf16_linear_gelu", &bf16_linear_gelu);
  m.impl("bertkit_int8_linear", &int8_linear);
  m.impl("bertkit_int8_linear_seven", &int8_linear_seven);
  m.impl("bertkit_int8_linear_seven_gelu", &int8_linear_seven_gelu);
  m.impl("bertkit_seven_pack", &seven_pack_weight);
  m.impl("bertkit_int8_linear_seven_packed", &int8_linear_seven_packed);
  m.impl("bertkit_attention", &attention);
  m.impl("bertkit_add_norm", &add_norm);
  m.impl("bertkit_fma_pack", &fma_pack_weight);
  m.impl("bertkit_fma_linear_packed", &fma_linear_packed);
  m.impl("bertkit_attention_eager", &attention_eager);
}

// The C functions AOTInductor calls (aot_inductor.custom_ops_to_c_shims): handles in, one handle out.
namespace {
const at::Tensor& of(AtenTensorHandle handle) { return *torch::aot_inductor::tensor_handle_to_tensor_pointer(handle); }

std::optional<at::Tensor> of(AtenTensorHandle* handle) {  // an optional argument: null where None
  return handle != nullptr ? std::optional<at::Tensor>(of(*handle)) : std::nullopt;
}

void give(at::Tensor result, AtenTensorHandle* ret0) { *ret0 = torch::aot_inductor::new_tensor_handle(std::move(result)); }
}  // namespace

#define BERTKIT_SHIM extern "C" __attribute__((visibility("default"))) AOTITorchError

BERTKIT_SHIM SHIM_MKL(AtenTensorHandle x, AtenTensorHandle weight, AtenTensorHandle* bias, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ give(mkl_linear(of(x), of(weight), of(bias)), ret0); });
}

BERTKIT_SHIM SHIM_FMA(AtenTensorHandle x, AtenTensorHandle weight, AtenTensorHandle* bias, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ give(fma_linear(of(x), of(weight), of(bias)), ret0); });
}

BERTKIT_SHIM SHIM_FMA_GELU(AtenTensorHandle x, AtenTensorHandle weight, AtenTensorHandle* bias, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ give(fma_linear_gelu(of(x), of(weight), of(bias)), ret0); });
}

BERTKIT_SHIM SHIM_BF16_LINEAR(AtenTensorHandle x, AtenTensorHandle weight, AtenTensorHandle* bias, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ give(bf16_linear(of(x), of(weight), of(bias)), ret0); });
}

BERTKIT_SHIM SHIM_BF16_GELU(AtenTensorHandle x, AtenTensorHandle weight, AtenTensorHandle* bias, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ give(bf16_linear_gelu(of(x), of(weight), of(bias)), ret0); });
}

BERTKIT_SHIM SHIM_INT8(AtenTensorHandle q, AtenTensorHandle row_scale, AtenTensorHandle weight,
                       AtenTensorHandle weight_scale, AtenTensorHandle* bias, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    give(int8_linear(of(q), of(row_scale), of(weight), of(weight_scale), of(bias)), ret0);
  });
}

BERTKIT_SHIM SHIM_SEVEN(AtenTensorHandle x, AtenTensorHandle weight, AtenTensorHandle weight_scale,
                        AtenTensorHandle* bias, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    give(seven_linear(of(x), of(weight), of(weight_scale), of(bias), false), ret0);
  });
}

BERTKIT_SHIM SHIM_SEVEN_GELU(AtenTensorHandle x, AtenTensorHandle weight, AtenTensorHandle weight_scale,
                             AtenTensorHandle* bias, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    give(seven_linear(of(x), of(weight), of(weight_scale), of(bias), true), ret0);
  });
}

BERTKIT_SHIM SHIM_ATTENTION(AtenTensorHandle q, AtenTensorHandle k, AtenTensorHandle v, AtenTensorHandle* mask,
                            int64_t heads, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ give(attention(of(q), of(k), of(v), of(mask), heads), ret0); });
}

BERTKIT_SHIM SHIM_ADD_NORM(AtenTensorHandle y, AtenTensorHandle residual, AtenTensorHandle weight, AtenTensorHandle bias,
                           double eps, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ give(add_norm(of(y), of(residual), of(weight), of(bias), eps), ret0); });
}

#undef BERTKIT_SHIM
