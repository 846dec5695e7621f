// shoal._shoal: the public C++ API (include/shoal/shoal.h) for Python. The
// Python part (shoal/__init__.py) gives it its shape: shoal.train,
// shoal.Client, shoal.Server.
//
// Tensors cross as torch tensors through torch's own casters: no copies.
// No call holds the GIL while it waits on the network or on training, and a
// job in training stops cleanly on Ctrl-C.
#include <signal.h>
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "shoal/embedding.h"
#include "shoal/shoal.h"

namespace py = pybind11;

namespace {

// Runs `job` on a thread of its own while this (the caller's) thread, every
// 50 ms, gives Python's signal handlers a turn: a KeyboardInterrupt there
// stops the job after its step in progress, as Ctrl-C stops `shoal train`.
// Returns the report's JSON, whether the job was interrupted, and the
// trained tensors by name.
py::tuple TrainJob(const shoal::Job& job, bool progress) {
  std::atomic<int> stop{0};
  shoal::RunOptions options;
  options.progress = progress;
  options.stop = &stop;
  std::optional<shoal::Report> report;
  std::exception_ptr error;
  bool interrupted = false;
  {
    py::gil_scoped_release release;
    std::mutex mu;
    std::condition_variable done_cv;
    bool done = false;
    std::thread runner([&] {
      try {
        report = job.Train(options);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      done_cv.notify_all();
    });
    std::unique_lock<std::mutex> lock(mu);
    while (!done_cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return done; })) {
      lock.unlock();
      {
        py::gil_scoped_acquire acquire;
        if (PyErr_CheckSignals() != 0) {
          PyErr_Clear();  // raised again once the job has stopped
          interrupted = true;
          stop.store(SIGINT);
        }
      }
      lock.lock();
    }
    lock.unlock();
    runner.join();
  }
  // A Ctrl-C that came as the job ended, after the last turn above, is the
  // caller's too: it gets the report, not a bare KeyboardInterrupt.
  if (PyErr_CheckSignals() != 0) {
    PyErr_Clear();
    interrupted = true;
  }
  if (error) std::rethrow_exception(error);
  py::dict trained;
  for (const auto& [name, value] : report->variables) trained[py::str(name)] = value;
  return py::make_tuple(report->json, interrupted, trained);
}

// `distinct`: the caller found the ids' distinct values already (UniqueIds).
shoal::ClusterClient::RowIds RowIds(bool distinct) {
  return distinct ? shoal::ClusterClient::RowIds::kDistinct : shoal::ClusterClient::RowIds::kAny;
}

}  // namespace

PYBIND11_MODULE(_shoal, m) {
  m.doc() = "shoal's C++ API; use the shoal package, not this module";

  static py::exception<shoal::Error> error_type(m, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const shoal::Error& e) {
      py::object instance = py::reinterpret_borrow<py::object>(error_type.ptr())(e.what());
      instance.attr("code") = e.code();
      PyErr_SetObject(error_type.ptr(), instance.ptr());
    }
  });

  m.def("unique_ids", &shoal::UniqueIds, py::arg("ids"), py::call_guard<py::gil_scoped_release>());

  py::class_<shoal::Job>(m, "Job")
      .def(py::init<>())
      .def_static("from_yaml", &shoal::Job::FromYaml)
      .def_static("from_file", &shoal::Job::FromFile)
      .def("set", &shoal::Job::Set, py::return_value_policy::reference_internal)
      .def("set_data", &shoal::Job::SetData, py::return_value_policy::reference_internal)
      .def("to_yaml", &shoal::Job::ToYaml)
      .def("training_features", &shoal::Job::TrainingFeatures, py::arg("n"),
           py::call_guard<py::gil_scoped_release>())
      .def("train", &TrainJob, py::arg("progress") = false);

  py::class_<shoal::ClusterClient>(m, "ClusterClient")
      .def(py::init([](const std::string& cluster_json, const std::vector<std::pair<std::string, std::vector<int64_t>>>&
                                                            variables,
                       const std::string& token, double rpc_timeout_s) {
             std::vector<shoal::VariableShape> shapes;
             for (const auto& [name, shape] : variables) shapes.push_back(shoal::VariableShape{name, shape});
             shoal::ClusterClientOptions options;
             options.token = token;
             options.rpc_timeout_s = rpc_timeout_s;
             return std::make_unique<shoal::ClusterClient>(cluster_json, shapes, options);
           }),
           py::arg("cluster_json"), py::arg("variables"), py::arg("token") = "", py::arg("rpc_timeout_s") = 60.0)
      .def("create", &shoal::ClusterClient::Create, py::call_guard<py::gil_scoped_release>())
      .def("wait_for", &shoal::ClusterClient::WaitFor, py::call_guard<py::gil_scoped_release>())
      .def("read", &shoal::ClusterClient::Read, py::call_guard<py::gil_scoped_release>())
      .def("read_into", &shoal::ClusterClient::ReadInto, py::call_guard<py::gil_scoped_release>())
      .def("assign", &shoal::ClusterClient::Assign, py::call_guard<py::gil_scoped_release>())
      .def("apply", &shoal::ClusterClient::Apply, py::call_guard<py::gil_scoped_release>())
      .def("apply_and_read_into", &shoal::ClusterClient::ApplyAndReadInto, py::call_guard<py::gil_scoped_release>())
      .def(
          "create_table",
          [](shoal::ClusterClient& client, const std::string& name, int64_t rows, int64_t dim, uint64_t seed,
             double init_scale, const std::string& optimizer_yaml, int64_t min_count, int64_t steps_to_live,
             int64_t max_rows, bool evict_when_full, const std::string& eviction) {
            shoal::TableOptions options;
            options.rows = rows;
            options.dim = dim;
            options.seed = seed;
            options.init_scale = init_scale;
            options.optimizer_yaml = optimizer_yaml;
            options.min_count = min_count;
            options.steps_to_live = steps_to_live;
            options.max_rows = max_rows;
            options.evict_when_full = evict_when_full;
            options.eviction = eviction;
            client.CreateTable(name, options);
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "pull_rows",
          [](shoal::ClusterClient& client, const std::string& table, const torch::Tensor& ids, bool distinct) {
            return client.PullRows(table, ids, RowIds(distinct));
          },
          py::arg("table"), py::arg("ids"), py::arg("distinct") = false, py::call_guard<py::gil_scoped_release>())
      .def(
          "push_rows",
          [](shoal::ClusterClient& client, const std::string& table, const torch::Tensor& ids,
             const torch::Tensor& gradients, bool distinct) {
            client.PushRows(table, ids, gradients, RowIds(distinct));
          },
          py::arg("table"), py::arg("ids"), py::arg("gradients"), py::arg("distinct") = false,
          py::call_guard<py::gil_scoped_release>())
      .def(
          "table_stats",
          [](shoal::ClusterClient& client, const std::string& table) {
            const shoal::ClusterClient::TableStats stats = client.GetTableStats(table);
            return std::make_tuple(stats.rows_held, stats.ids_refused, stats.rows_evicted);
          },
          py::call_guard<py::gil_scoped_release>())
      .def("save", &shoal::ClusterClient::Save, py::call_guard<py::gil_scoped_release>())
      .def("restore", &shoal::ClusterClient::Restore, py::call_guard<py::gil_scoped_release>())
      .def("add_to_counter", &shoal::ClusterClient::AddToCounter, py::call_guard<py::gil_scoped_release>())
      .def("shutdown_servers", &shoal::ClusterClient::ShutdownServers, py::call_guard<py::gil_scoped_release>());

  py::class_<shoal::VariableServer>(m, "VariableServer")
      .def(py::init<const std::string&, const std::string&, const std::string&>(), py::arg("address"),
           py::arg("token") = "", py::arg("checkpoint_dir") = "", py::call_guard<py::gil_scoped_release>())
      .def("wait", &shoal::VariableServer::Wait, py::call_guard<py::gil_scoped_release>())
      .def("address", &shoal::VariableServer::address);
}
