// How many threads a task computes with, and which BLAS its matrix products
// run on.
//
// libtorch and OpenBLAS each keep a thread pool sized for the whole machine.
// Several workers in one process, or several processes on one host, then
// oversubscribe the cores (measured on 2 cores: 21k examples/s for the main
// job with the default pools, 71k with one BLAS thread per worker). So every
// entry point of shoal sets the threads itself: through OpenBLAS's API,
// because the library reads OPENBLAS_NUM_THREADS only when it loads, and
// through libtorch's intra-op setting, which OpenMP keeps per thread, so
// each thread that computes calls `UseComputeThreadsInThisThread()`.
//
// Thread safety: the functions may be called from any thread.
#ifndef SHOAL_COMPUTE_COMPUTE_THREADS_H_
#define SHOAL_COMPUTE_COMPUTE_THREADS_H_

#include <string>

namespace shoal {

// The cores this process may run on (its affinity mask), at least 1.
int UsableCores();

struct ComputeThreads {
  int threads = 1;
  std::string source;  // why: "cluster.threads_per_task", "OPENBLAS_NUM_THREADS", or how it was derived
};

// The threads for one task. `configured` (cluster.threads_per_task, 0 =
// unset) wins, then `env_openblas_threads` (the value of
// OPENBLAS_NUM_THREADS, null or empty if unset); otherwise a training task
// gets an equal share of `cores` among the `training_tasks_on_host`
// (at least 1), and a ps task, whose optimizer work is elementwise, 1.
ComputeThreads ChooseComputeThreads(int configured, const char* env_openblas_threads, bool training_task,
                                    int training_tasks_on_host, int cores);

// Sets the BLAS's threads (through OpenBLAS's API when the BLAS is OpenBLAS)
// and libtorch's intra-op threads, for this thread and for every thread that
// later calls UseComputeThreadsInThisThread(). libtorch gets as many, except
// beside OpenBLAS's own pthread pool, where it gets 1: two spinning pools on
// the same cores slow a step by up to 3x (IntraOpThreadsBeside).
void SetComputeThreads(int threads);

// libtorch's intra-op threads to go with `blas_threads` BLAS threads.
int IntraOpThreadsBeside(int blas_threads);

// Applies the count set by SetComputeThreads to the calling thread (OpenMP's
// thread count is per thread); a no-op before any SetComputeThreads.
void UseComputeThreadsInThisThread();

// The threads OpenBLAS will use for one call now; 0 if the BLAS is not OpenBLAS.
int OpenBlasThreads();

struct BlasInfo {
  std::string name;      // "OpenBLAS 0.3.21 DYNAMIC_ARCH ...", "MKL", or "unknown (<library path>)"
  std::string library;   // the file libtorch's sgemm_ comes from
  bool optimised = false;
  double probe_gflops = 0;  // measured only when the BLAS is not one shoal knows to be optimised
};

// Which BLAS libtorch's matrix products run on. Identifies OpenBLAS, MKL and
// BLIS by their API; anything else gets a few-millisecond single-thread
// GEMM probe and counts as optimised when it runs at 20 GFLOP/s or more.
// Computed once per process.
const BlasInfo& IdentifyBlas();

// The one-line warning to print when the BLAS is slow, with how to fix it;
// empty when it is fine.
std::string SlowBlasWarning(const BlasInfo& blas);

// Once per process: prints SlowBlasWarning to stderr if there is one.
void WarnOnceIfBlasIsSlow();

}  // namespace shoal

#endif  // SHOAL_COMPUTE_COMPUTE_THREADS_H_
