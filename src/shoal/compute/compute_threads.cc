#include "shoal/compute/compute_threads.h"

#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shoal {
namespace {

std::atomic<int> chosen_threads{0};  // libtorch intra-op threads

// OpenBLAS's own API, looked up at run time: libtorch links the generic
// libblas.so.3, which the system may point at any BLAS.
using SetThreadsFn = void (*)(int);
using GetThreadsFn = int (*)();
using GetConfigFn = char* (*)();

template <typename Fn>
Fn Lookup(void* handle, const char* symbol) {
  return reinterpret_cast<Fn>(dlsym(handle, symbol));
}

constexpr double kOptimisedGflops = 20;  // Netlib's reference BLAS: about 5 on one core here

double ProbeGflops() {
  // One thread, so the figure compares with a single-core reference BLAS.
  const int before = at::get_num_threads();
  at::set_num_threads(1);
  constexpr int64_t n = 256;
  torch::NoGradGuard no_grad;
  const torch::Tensor a = torch::rand({n, n}), b = torch::rand({n, n});
  torch::Tensor c = torch::mm(a, b);  // warm-up
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    c = torch::mm(a, b);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  at::set_num_threads(before);
  return 2.0 * n * n * n / best / 1e9;
}

BlasInfo Identify() {
  BlasInfo info;
  void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
  Dl_info where{};
  void* library = nullptr;
  if (sgemm != nullptr && dladdr(sgemm, &where) != 0 && where.dli_fname != nullptr) {
    info.library = where.dli_fname;
    // The library that provides sgemm_ (with its dependencies), not some
    // other BLAS that happens to be loaded too (LAPACK may pull in OpenBLAS
    // while BLAS itself is the reference one).
    library = dlopen(where.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  }
  if (library != nullptr) {
    if (auto get_config = Lookup<GetConfigFn>(library, "openblas_get_config")) {
      info.name = get_config();
      info.optimised = true;
    } else if (dlsym(library, "mkl_get_max_threads") != nullptr) {
      info.name = "MKL";
      info.optimised = true;
    } else if (dlsym(library, "bli_info_get_version_str") != nullptr) {
      info.name = "BLIS";
      info.optimised = true;
    }
    dlclose(library);
  }
  if (info.library.empty()) info.library = "libtorch's own";
  if (!info.optimised) {
    info.probe_gflops = ProbeGflops();
    info.optimised = info.probe_gflops >= kOptimisedGflops;
    info.name = absl::StrCat("unknown (", info.library, ")");
  }
  return info;
}

void* OpenBlasSymbol(const char* symbol) {
  const BlasInfo& blas = IdentifyBlas();
  if (blas.name.rfind("OpenBLAS", 0) != 0) return nullptr;
  return dlsym(RTLD_DEFAULT, symbol);
}

}  // namespace

int UsableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

ComputeThreads ChooseComputeThreads(int configured, const char* env_openblas_threads, bool training_task,
                                    int training_tasks_on_host, int cores) {
  if (configured > 0) return {configured, "cluster.threads_per_task"};
  int from_env = 0;
  if (env_openblas_threads != nullptr && absl::SimpleAtoi(env_openblas_threads, &from_env) && from_env > 0) {
    return {from_env, "OPENBLAS_NUM_THREADS"};
  }
  if (!training_task) return {1, "a ps task"};
  const int tasks = std::max(1, training_tasks_on_host);
  return {std::max(1, cores / tasks), absl::StrCat(cores, " cores shared by ", tasks, " training tasks on this host")};
}

int IntraOpThreadsBeside(int blas_threads) {
  // OpenBLAS built on pthreads keeps a pool of its own beside libtorch's
  // OpenMP pool; both spin while they wait, so with more than one thread each
  // they take the cores from each other. Measured on 2 cores, one worker and
  // one ps as processes: 2 BLAS + 2 intra-op threads 7,400 examples/s, 2 + 1
  // 21,200, 1 + 1 19,700 (in-process: 33,900, 50,100, 38,600). The matrix
  // products, where the time goes, keep their threads.
  using GetParallelFn = int (*)();
  auto parallel = reinterpret_cast<GetParallelFn>(OpenBlasSymbol("openblas_get_parallel"));
  constexpr int kPthreads = 1;
  return parallel != nullptr && parallel() == kPthreads ? 1 : blas_threads;
}

void SetComputeThreads(int threads) {
  threads = std::max(1, threads);
  if (auto set = reinterpret_cast<SetThreadsFn>(OpenBlasSymbol("openblas_set_num_threads"))) set(threads);
  const int intra_op = IntraOpThreadsBeside(threads);
  chosen_threads.store(intra_op);
  at::set_num_threads(intra_op);
}

void UseComputeThreadsInThisThread() {
  const int threads = chosen_threads.load();
  if (threads > 0 && at::get_num_threads() != threads) at::set_num_threads(threads);
}

int OpenBlasThreads() {
  auto get = reinterpret_cast<GetThreadsFn>(OpenBlasSymbol("openblas_get_num_threads"));
  return get ? get() : 0;
}

const BlasInfo& IdentifyBlas() {
  static const BlasInfo* const info = new BlasInfo(Identify());
  return *info;
}

std::string SlowBlasWarning(const BlasInfo& blas) {
  if (blas.optimised) return "";
  return absl::StrFormat(
      "shoal: warning: matrix products run at %.1f GFLOP/s on one core (BLAS: %s), which looks like Netlib's "
      "reference BLAS, about 15x slower than an optimised one; install OpenBLAS "
      "(apt-get install libopenblas0-pthread, as scripts/bootstrap.sh does) or select it with "
      "update-alternatives --config libblas.so.3-x86_64-linux-gnu",
      blas.probe_gflops, blas.library);
}

void WarnOnceIfBlasIsSlow() {
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string warning = SlowBlasWarning(IdentifyBlas());
    if (!warning.empty()) std::fprintf(stderr, "%s\n", warning.c_str());
  });
}

}  // namespace shoal
