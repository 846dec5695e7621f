"""shoal from Python: parameter-server training of PyTorch models.

    import shoal
    report = shoal.train(MyNet(), {"training": {"mode": "async", "epochs": 2}})
    print(report["test_accuracy"])

train() runs a whole job (every task in this process, or as processes);
Client talks to a running cluster's parameter servers by variable name;
Server runs a parameter server in this process; Embedding and EmbeddingBag
are PyTorch layers over a Client's tables on the ps tasks. Every failure is a
shoal.Error carrying shoal's message (and its status code in .code).
"""

import json
import os
import sys
import tempfile
import warnings

import torch  # first: shoal's extension uses the libtorch this torch loaded

from shoal._shoal import Error  # noqa: F401  (re-exported)
from shoal import _shoal

__all__ = ["train", "Client", "Server", "Embedding", "EmbeddingBag", "Error"]
Error.__module__ = "shoal"


def _job_from(config):
    if config is None:
        return _shoal.Job()
    if isinstance(config, dict):
        # JSON is YAML: shoal's strict parser checks every key.
        return _shoal.Job.from_yaml(json.dumps(config))
    if isinstance(config, (str, os.PathLike)):
        return _shoal.Job.from_file(os.fspath(config))
    raise TypeError(f"config must be a dict or a YAML file's path, not {type(config).__name__}")


def _as_tensor(value, what):
    if isinstance(value, torch.Tensor):
        return value
    try:
        import numpy
    except ImportError:  # numpy comes with torch; without it, only tensors
        numpy = None
    if numpy is not None and isinstance(value, numpy.ndarray):
        with warnings.catch_warnings():  # a read-only array (np.frombuffer's) is fine: shoal never writes to it
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return torch.from_numpy(value)  # shares the array's memory
    raise TypeError(f"data: {what} must be a torch tensor or a numpy array, not {type(value).__name__}")


def _set_data(job, data):
    """data: None (the config's), a folder of IDX files, {"train": (x, y), "test": (x, y)} or (x, y, x_test, y_test)."""
    if data is None:
        return
    if isinstance(data, (str, os.PathLike)):
        job.set("data.dir", json.dumps(os.fspath(data)))
        return
    if isinstance(data, dict):
        unknown = set(data) - {"train", "test"}
        if unknown or len(data) != 2:
            raise ValueError(f"data: a dict needs exactly the keys 'train' and 'test', got {sorted(data)}")
        parts = (*data["train"], *data["test"])
    else:
        parts = tuple(data)
    if len(parts) != 4:
        raise ValueError("data: give training features and labels and test features and labels")
    names = ("training features", "training labels", "test features", "test labels")
    job.set_data(*(_as_tensor(p, n) for p, n in zip(parts, names)))


def _first_line(error):
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _script(model, folder, job):
    """The path of `model` as a TorchScript file: a path as it is, a module scripted (or, when it
    cannot be, traced on a batch of the job's training data) and saved."""
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module or a TorchScript file's path, not {type(model).__name__}")
    for name, layer in model.named_modules():
        if isinstance(layer, Embedding):
            raise Error(f"model: its layer '{name or type(model).__name__}' is a shoal.{type(layer).__name__}, "
                        "which a Python loop of your own drives through shoal.Client; shoal.train trains tables "
                        "with model.kind click (the tables from its config, a TorchScript dense part)")
    if isinstance(model, torch.jit.ScriptModule):
        scripted = model
    else:
        try:
            scripted = torch.jit.script(model)
        except Exception as script_error:  # TorchScript raises several kinds; its reason is what matters
            # Source Python cannot read (stdin, exec, some notebooks) or a feature
            # TorchScript lacks: trace it on a batch of the data it will train on.
            why = _first_line(script_error)
            try:
                batch = job.training_features(2)
                with torch.no_grad():
                    scripted = torch.jit.trace(model, batch, check_trace=False)
            except Exception as trace_error:
                raise Error(f"model: {type(model).__name__} can be neither scripted nor traced, and shoal trains "
                            f"TorchScript in C++. torch.jit.script: {why}. torch.jit.trace on a batch of the "
                            f"training data: {_first_line(trace_error)}") from trace_error
            print(f"shoal: traced {type(model).__name__} with torch.jit.trace on 2 training examples, since "
                  f"torch.jit.script could not compile it ({why}); the trace keeps the path that batch took "
                  f"through any data-dependent branch, and the module's {'training' if model.training else 'eval'} "
                  f"mode for dropout and BatchNorm", file=sys.stderr)
    path = os.path.join(folder, "model.pt")
    scripted.save(path)
    return path


def train(model=None, config=None, data=None, *, processes=None, progress=None):
    """Trains `model` as `config` says, on `data`, and returns the report as a dict.

    model: a torch.nn.Module (scripted by shoal with torch.jit.script), a
        TorchScript file's path, or None for the config's model.
    config: a dict with the keys of shoal's YAML (configs/*.yaml), a YAML
        file's path, or None for the defaults (the main job).
    data: None for the config's data; a folder of IDX files;
        {"train": (x, y), "test": (x, y)} or (x, y, x_test, y_test) of
        numpy arrays or torch tensors (features float32 or uint8, labels
        int64 classes or float32 targets).
    processes: run every task as its own process over gRPC (default: the
        config's cluster.processes).
    progress: show a progress bar (default: when stderr is a terminal).

    When it returns, a torch.nn.Module `model` holds the trained values (the
    ps's at the end; a population's fittest member's), as after Keras' fit,
    and report["model_file"] names the run folder's TorchScript copy
    (hooks.run_dir). A module that torch.jit.script cannot compile is traced
    on two training examples instead, with a line saying so.

    Ctrl-C stops the job after its step in progress: the chief evaluates and
    saves as at the end, the module gets the values trained so far, then
    KeyboardInterrupt is raised with the report in its `report` attribute.
    """
    job = _job_from(config)
    if processes is not None:
        job.set("cluster.processes", "true" if processes else "false")
    _set_data(job, data)
    if progress is None:
        progress = sys.stderr.isatty()
    with tempfile.TemporaryDirectory(prefix="shoal-model-") as folder:
        if model is not None:
            path = _script(model, folder, job)
            job.set("model.path", json.dumps(path))
            job.set("model.kind", "torchscript")
        report_json, interrupted, trained = job.train(progress=progress)
    report = json.loads(report_json)
    if isinstance(model, torch.nn.Module):
        _load_trained(model, trained, report)
    if interrupted:
        stop = KeyboardInterrupt(f"shoal: the job stopped cleanly at global step {report.get('global_step')}")
        stop.report = report
        raise stop
    return report


def _load_trained(module, trained, report):
    """Writes the job's trained values into `module`'s parameters and buffers, by name: all of
    them, or (when some name or shape does not match) none, with an error naming it."""
    if report.get("network_test_accuracies"):
        return  # a gated ensemble: several networks and a master, not this module (report["model_file"] has them)
    pairs = list(module.named_parameters()) + list(module.named_buffers())
    for name, tensor in pairs:
        if name not in trained:
            raise Error(f"the trained model has no variable '{name}', which {type(module).__name__} has")
        if tuple(trained[name].shape) != tuple(tensor.shape):
            raise Error(f"trained variable '{name}' is {list(trained[name].shape)}, "
                        f"{type(module).__name__}'s is {list(tensor.shape)}")
    with torch.no_grad():
        for name, tensor in pairs:
            tensor.copy_(trained[name])


class Client:
    """A parameter-server client: reads, assigns and applies gradients by variable name.

        client = shoal.Client({"ps": ["127.0.0.1:2222"]}, model.named_parameters())
        client.create(dict(model.named_parameters()), optimizer={"kind": "sgd", "learning_rate": 0.1})
        client.pull(model.named_parameters())       # the ps's values into the model
        values = client.read(names)                 # or as new torch tensors
        client.apply(dict(zip(names, gradients)))   # the ps's optimizer applies them

    `variables` lists every variable the job's clients use, in one order
    (name -> tensor or shape, or (name, tensor) pairs such as
    named_parameters()): each is placed on a ps task round robin in that
    order, so every client given the same list finds it on the same task.
    Tensors are sent from their own memory; read() returns tensors that own
    what was received. No call holds the GIL while it waits.
    """

    def __init__(self, cluster, variables, *, token="", rpc_timeout_s=60.0):
        if isinstance(cluster, (str, os.PathLike)) and os.path.exists(cluster):
            with open(cluster) as f:
                cluster = json.load(f)
        if isinstance(variables, dict):
            variables = variables.items()
        shapes = []
        for name, value in variables:
            shape = value.shape if isinstance(value, torch.Tensor) else value
            shapes.append((name, [int(d) for d in shape]))
        self.names = [name for name, _ in shapes]
        self._client = _shoal.ClusterClient(json.dumps(cluster), shapes, token, rpc_timeout_s)

    @staticmethod
    def _split(named):
        if isinstance(named, dict):
            named = named.items()
        names, tensors = [], []
        for name, tensor in named:
            names.append(name)
            tensors.append(tensor.detach() if isinstance(tensor, torch.Tensor) else tensor)  # shares the memory
        return names, tensors

    def create(self, values, optimizer=None):
        """Creates the variables {name: initial value}, trained on the ps by `optimizer`
        (the keys of training.optimizer; default plain SGD, learning rate 0.01).
        Variables that exist already keep their values."""
        names, tensors = self._split(values)
        self._client.create(names, tensors, json.dumps(optimizer or {"kind": "sgd", "learning_rate": 0.01}))

    def wait_for(self, names=None, timeout_s=60.0):
        """Waits until every named variable (default: all) exists."""
        self._client.wait_for(list(names or self.names), timeout_s)

    def read(self, names=None):
        """The current values of the named variables (default: all), as a list of tensors."""
        return self._client.read(list(names or self.names))

    def pull(self, destinations):
        """Reads variables straight into tensors, one copy each: {name: tensor}, or
        (name, tensor) pairs such as a model's named_parameters() (a pull)."""
        names, tensors = self._split(destinations)
        self._client.read_into(names, tensors)

    def assign(self, values):
        """Sets variables to values: {name: tensor}."""
        self._client.assign(*self._split(values))

    def apply(self, gradients, global_step_increment=1):
        """Applies {name: gradient} with each variable's optimizer; returns the new global step."""
        names, tensors = self._split(gradients)
        return self._client.apply(names, tensors, global_step_increment)

    def apply_and_pull(self, gradients, destinations, global_step_increment=1):
        """apply(gradients), then pull(destinations) of the values right after it, in
        one round trip to each ps: {name: gradient} and {name: tensor} (or pairs) with
        the same names in the same order. Returns the new global step."""
        names, tensors = self._split(gradients)
        destination_names, destination_tensors = self._split(destinations)
        if destination_names != names:
            raise ValueError(f"apply_and_pull: the destinations name {destination_names}, the gradients {names}")
        return self._client.apply_and_read_into(names, tensors, destination_tensors, global_step_increment)

    def create_table(self, name, *, rows=0, dim=16, optimizer=None, seed=1, init_scale=0.05, min_count=0,
                     steps_to_live=0, max_rows=0, evict_when_full=False, eviction="lru"):
        """Creates an embedding table split by row over every ps task (row id mod the ps
        count), each row made on its ps from (seed, id): nothing ships the table.

        rows=0 makes a dynamic table keyed by any int64 id, whose rows are made once an
        id was pushed min_count times and dropped after steps_to_live pushes of their
        shard without one; it holds at most max_rows rows (0: as many as fit in what
        the ps tasks' variables and other tables leave of their memory), and once full
        admits no new id, or with evict_when_full drops the rows no push touched for
        longest to make room (eviction="lfu": the rows pushes touched least often, the
        oldest among equals, which keeps more of a stable Zipf stream's ids).
        `optimizer` is a sparse one,
        updating only pushed rows: sgd, adagrad (the default, learning rate 0.05),
        lazy_adam or ftrl (l1, l2, learning_rate_power). A table that exists with the
        same definition is left alone; one with another (shape, seed, init_scale,
        optimizer kind, admission or eviction rules) is refused, naming what differs."""
        optimizer = optimizer or {"kind": "adagrad", "learning_rate": 0.05}
        self._client.create_table(name, rows, dim, seed, init_scale, json.dumps(optimizer), min_count, steps_to_live,
                                  max_rows, evict_when_full, eviction)

    def pull_rows(self, table, ids):
        """The rows of `ids` (int64, one dimension, repeats allowed) as a float32 tensor
        [len(ids), dim]; each distinct id is pulled once, from its ps task."""
        return self._client.pull_rows(table, ids)

    def push_rows(self, table, ids, gradients):
        """Pushes gradient rows (float32 [len(ids), dim]) to the table's optimizer; the
        rows of repeated ids are summed here, so one row per id goes on the wire."""
        self._client.push_rows(table, ids, gradients.detach() if isinstance(gradients, torch.Tensor) else gradients)

    def _pull_distinct_rows(self, table, ids):
        """pull_rows for ids known to be distinct (the layers'): not looked over again."""
        return self._client.pull_rows(table, ids, distinct=True)

    def _push_distinct_rows(self, table, ids, gradients):
        """push_rows for ids known to be distinct; a push whose ids repeat is refused."""
        self._client.push_rows(table, ids, gradients, distinct=True)

    def table_stats(self, table):
        """How full a table is, over all its ps tasks: {"rows_held", "ids_refused" (new ids
        a full dynamic table turned away), "rows_evicted" (dropped to make room)}."""
        rows_held, ids_refused, rows_evicted = self._client.table_stats(table)
        return {"rows_held": rows_held, "ids_refused": ids_refused, "rows_evicted": rows_evicted}

    def save(self, directory, step=None, keep=5):
        """Saves this client's variables (values and optimizer slots) and the ps tasks'
        tables as the checkpoint directory/ckpt-<step> (step: default the global step),
        keeping the newest `keep` (0: all); returns its path. Each ps writes its own
        shard there, so its checkpoint_dir must be this directory, on a file system
        this process reads."""
        return self._client.save(os.fspath(directory), -1 if step is None else step, keep)

    def restore(self, directory):
        """Puts the newest checkpoint under directory back: the tables, then this
        client's variables with their slots, then the global step, onto any number of
        ps tasks. The variables and tables must exist (create, create_table). Returns
        the checkpoint's step, or None if the directory holds none; a checkpoint that
        lacks a variable or holds another shape raises shoal.Error, changing nothing."""
        step = self._client.restore(os.fspath(directory))
        return None if step < 0 else step

    def add_to_counter(self, name, delta=1):
        return self._client.add_to_counter(name, delta)

    def shutdown_servers(self):
        """Asks every ps task to shut down."""
        self._client.shutdown_servers()


class Embedding(torch.nn.Module):
    """A table on the ps tasks as a PyTorch layer, as nn.Embedding is a local one:

        emb = shoal.Embedding(client, "emb")     # made by client.create_table("emb", ...)
        loss = loss_fn(dense(emb(ids).flatten(1)), labels)
        loss.backward()                          # also pushes the rows' gradients

    forward(ids) pulls each distinct id of the batch once and returns its row
    for every id: float32 [*ids.shape, dim]. While autograd records, backward
    pushes the gradient of each distinct id's row (summed over its uses) to
    the table's sparse optimizer on the ps, so the table trains without an
    optimizer step here; every backward through a forward pushes once. Under
    torch.no_grad() (evaluation) nothing is pushed. An id equal to padding_idx
    (say -1, for bags padded to one width) is neither pulled nor pushed: its
    row is zeros.
    """

    def __init__(self, client, table, padding_idx=None):
        super().__init__()
        self.client, self.table, self.padding_idx = client, table, padding_idx

    def extra_repr(self):
        return f"table={self.table!r}" + ("" if self.padding_idx is None else f", padding_idx={self.padding_idx}")

    def _pull(self, ids):
        """The rows of ids' distinct values [n, dim] (with padding_idx, a row of zeros
        after them), and where each id's row is in them."""
        if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex():
            raise TypeError(f"shoal.{type(self).__name__} '{self.table}': ids must be an integer tensor, "
                            f"not {ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__}")
        flat = ids.reshape(-1).to(torch.int64)
        # Each distinct id once (in one pass, in order of first appearance),
        # so the client need not look for repeats again.
        if self.padding_idx is None:
            distinct, where = _shoal.unique_ids(flat)
        else:
            real = flat != self.padding_idx
            distinct, where_real = _shoal.unique_ids(flat[real])
            where = torch.full_like(flat, len(distinct))  # padding: the zero row after the pulled ones
            where[real] = where_real
        rows = self.client._pull_distinct_rows(self.table, distinct)
        if torch.is_grad_enabled():
            rows.requires_grad_()
            rows.register_hook(
                lambda gradient: self.client._push_distinct_rows(self.table, distinct, gradient.contiguous()))
        if self.padding_idx is not None:
            rows = torch.cat([rows, rows.new_zeros(1, rows.shape[1])])
        return rows, where

    def forward(self, ids):
        rows, where = self._pull(ids)
        return rows[where].view(*ids.shape, rows.shape[1])


class EmbeddingBag(Embedding):
    """A table on the ps tasks pooled per bag, as nn.EmbeddingBag: mode "sum" or "mean".

        bag = shoal.EmbeddingBag(client, "emb", mode="mean")
        pooled = bag(ids)              # ids [batch, bag]: one bag a row -> [batch, dim]
        pooled = bag(ids, offsets)     # ids [n], bag b from offsets[b] to the next -> [len(offsets), dim]

    Rows are pulled once per distinct id and their gradients pushed on
    backward, as with shoal.Embedding. Ids equal to padding_idx are left out
    of their bags (a mean counts the others); per_sample_weights (mode "sum",
    shaped as ids) scales each id's row, as in nn.EmbeddingBag.
    """

    def __init__(self, client, table, mode="sum", padding_idx=None):
        super().__init__(client, table, padding_idx)
        if mode not in ("sum", "mean"):
            raise ValueError(f"shoal.EmbeddingBag '{table}': mode '{mode}' is not sum or mean")
        self.mode = mode

    def extra_repr(self):
        return f"{super().extra_repr()}, mode={self.mode!r}"

    def forward(self, ids, offsets=None, per_sample_weights=None):
        if isinstance(ids, torch.Tensor) and (ids.dim() == 2) == (offsets is not None):
            raise ValueError(f"shoal.EmbeddingBag '{self.table}': give ids [batch, bag], or ids [n] with offsets "
                             f"(got ids of {ids.dim()} dimensions{' and offsets' if offsets is not None else ''})")
        rows, where = self._pull(ids)
        padding = None if self.padding_idx is None else len(rows) - 1
        if offsets is None:
            return torch.nn.functional.embedding_bag(where.view(ids.shape), rows, mode=self.mode,
                                                     per_sample_weights=per_sample_weights, padding_idx=padding)
        return torch.nn.functional.embedding_bag(where, rows, offsets.to(torch.int64), mode=self.mode,
                                                 per_sample_weights=per_sample_weights, padding_idx=padding)


class Server:
    """A parameter server (a ps task) in this process, over gRPC, until closed.

    It listens on `address`; by default, or with port 0, on a port the system
    picks, which `server.address` names. Without a token it serves only a
    loopback address. With a checkpoint_dir it
    writes and reads the checkpoints Client.save and Client.restore ask for there
    (the same folder the client names); without one it refuses them.
    """

    def __init__(self, address="127.0.0.1:0", *, token="", checkpoint_dir=None):
        self._server = _shoal.VariableServer(address, token, os.fspath(checkpoint_dir) if checkpoint_dir else "")
        self.address = self._server.address()  # port 0: the one the system picked

    def wait(self, timeout_s):
        """Waits until a client shuts the server down, at most timeout_s; returns whether one did."""
        return self._server.wait(timeout_s)

    def close(self):
        self._server = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
