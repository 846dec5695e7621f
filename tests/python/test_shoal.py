"""The Python package, as a PyTorch user drives it (run by ctest through pytest)."""

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch

import shoal

QUICK = {"data": {"train_examples": 6000, "test_examples": 2000}, "training": {"epochs": 1},
         "transport": {"startup_timeout_s": 60}}


class SmallNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(784, 32)
        self.bn = torch.nn.BatchNorm1d(32)
        self.fc2 = torch.nn.Linear(32, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x.flatten(1)))))


def separable(n, features, dtype=np.float32):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, features)).astype(dtype)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    cut = n * 4 // 5
    return (x[:cut], y[:cut]), (x[cut:], y[cut:])


def free_port():
    # Below the kernel's ephemeral range, as shoal's launcher picks its
    # tasks' ports: a port the kernel handed out here (bind to port 0) may
    # go next to another test's UCX listener or gRPC server before this
    # test's server binds it, and the test's client would then reach that
    # one (it happened: a ps that talked until the other test ended).
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
        lowest_ephemeral = int(ports.read().split()[0])
    candidates = list(range(10000, lowest_ephemeral))
    random.shuffle(candidates)
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # no room below the range
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torch_and_shoal_share_one_libtorch():
    # shoal's extension resolves libtorch's symbols from the library torch loaded.
    maps = open(f"/proc/{os.getpid()}/maps").read()
    libs = {line.split()[-1] for line in maps.splitlines() if "libtorch_cpu.so" in line}
    assert len(libs) == 1, libs
    assert torch.ones(2).add(1).sum().item() == 4


def test_a_pytorch_module_trains_in_process():
    report = shoal.train(SmallNet(), QUICK)
    assert report["test_accuracy"] > 0.7
    assert report["global_step"] > 0
    assert "examples_per_second" in report


def test_numpy_data_trains_in_process_and_as_processes():
    train, test = separable(4000, 20)
    config = {"model": {"layers": [20, 16, 2]}, "cluster": {"ps": 1},
              "training": {"epochs": 5, "optimizer": {"kind": "adam", "learning_rate": 0.01}}}
    for processes in (False, True):
        report = shoal.train(config=config, data={"train": train, "test": test}, processes=processes)
        assert report["test_accuracy"] > 0.9, processes


def test_the_trained_module_scores_the_reports_accuracy_in_plain_pytorch(tmp_path):
    train, test = separable(5000, 784)
    net = SmallNet()
    before = net.fc1.weight.detach().clone()
    config = {**QUICK, "training": {"epochs": 5}, "hooks": {"run_dir": str(tmp_path)}}
    report = shoal.train(net, config, data={"train": train, "test": test})
    assert not torch.equal(net.fc1.weight, before), "the module still holds its initial values"
    net.eval()
    images, labels = torch.from_numpy(test[0]), torch.from_numpy(test[1])
    with torch.no_grad():
        plain = (net(images).argmax(1) == labels).double().mean().item()
        served = (torch.jit.load(report["model_file"])(images).argmax(1) == labels).double().mean().item()
    assert plain > 0.7  # chance is 0.5: 2 of 784 features carry the label
    assert abs(plain - report["test_accuracy"]) <= 0.001, (plain, report["test_accuracy"])
    assert abs(served - report["test_accuracy"]) <= 0.001, (served, report["test_accuracy"])
    # The BatchNorm statistics came back too.
    assert net.bn.num_batches_tracked.item() > 0
    assert os.path.dirname(report["run_dir"]) == str(tmp_path)
    assert json.load(open(os.path.join(report["run_dir"], "report.json")))["global_step"] == report["global_step"]


def test_the_module_comes_back_from_a_job_of_processes(tmp_path):
    train, test = separable(3000, 784)
    net = SmallNet()
    before = net.fc2.weight.detach().clone()
    report = shoal.train(net, {**QUICK, "hooks": {"run_dir": str(tmp_path)}}, data=(*train, *test), processes=True)
    assert not torch.equal(net.fc2.weight, before)
    net.eval()
    with torch.no_grad():
        plain = (net(torch.from_numpy(test[0])).argmax(1) == torch.from_numpy(test[1])).double().mean().item()
    assert abs(plain - report["test_accuracy"]) <= 0.001, (plain, report["test_accuracy"])


def test_a_module_that_cannot_be_scripted_is_traced_and_says_so(capfd):
    class Unscriptable(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(784, 10)

        def forward(self, x, **options):  # TorchScript does not take **kwargs
            return self.fc(x.flatten(1))

    net = Unscriptable()
    before = net.fc.weight.detach().clone()
    report = shoal.train(net, QUICK)
    assert report["test_accuracy"] > 0.7
    assert not torch.equal(net.fc.weight, before)
    err = capfd.readouterr().err
    assert "shoal: traced Unscriptable with torch.jit.trace" in err, err
    assert "kwargs" in err or "variable number of arguments" in err, err


def test_a_module_defined_where_python_cannot_read_its_source_is_traced(capfd):
    namespace = {"torch": torch}
    exec(textwrap.dedent("""
        class FromExec(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(784, 10)

            def forward(self, x):
                return self.fc(x.flatten(1))
    """), namespace)
    report = shoal.train(namespace["FromExec"](), QUICK)
    assert report["test_accuracy"] > 0.7
    assert "shoal: traced FromExec" in capfd.readouterr().err


def test_a_module_neither_scripted_nor_traced_is_refused_with_both_reasons():
    class Neither(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(784, 10)

        def forward(self, x):
            score = lambda t: t.sum().item()  # noqa: E731 (TorchScript has no lambdas; a trace no float output)
            return score(self.fc(x.flatten(1)))

    with pytest.raises(shoal.Error) as error:
        shoal.train(Neither(), QUICK)
    message = str(error.value)
    assert "Neither can be neither scripted nor traced" in message, message
    assert "torch.jit.script: " in message and "torch.jit.trace on a batch" in message, message


def test_bad_config_and_data_raise_shoals_message():
    with pytest.raises(shoal.Error) as error:
        shoal.train(config={"cluster": {"wrkers": 3}})
    assert "unknown key 'cluster.wrkers'" in str(error.value)
    assert error.value.code == "INVALID_ARGUMENT"

    train, test = separable(500, 30)
    with pytest.raises(shoal.Error) as error:  # 30 features into a network that takes 20
        shoal.train(config={"model": {"layers": [20, 2]}}, data={"train": train, "test": test})
    assert "[2, 30]" in str(error.value)

    train64, test64 = separable(500, 20, dtype=np.float64)
    with pytest.raises(shoal.Error) as error:
        shoal.train(config={"model": {"layers": [20, 2]}}, data=(*train64, *test64))
    assert "float64" in str(error.value)


def test_client_drives_a_server_by_hand_without_holding_the_gil():
    server = shoal.Server()  # on a port the system picks
    address = server.address
    assert re.fullmatch(r"127\.0\.0\.1:[1-9][0-9]*", address), address
    model = torch.nn.Linear(3, 2)
    client = shoal.Client({"ps": [address]}, model.named_parameters())
    client.create(dict(model.named_parameters()), optimizer={"kind": "sgd", "learning_rate": 0.5})
    weight, bias = client.read()
    assert torch.equal(weight, model.weight.detach()) and torch.equal(bias, model.bias.detach())

    step = client.apply({"weight": torch.ones(2, 3), "bias": torch.ones(2)})
    assert step == 1
    weight, bias = client.read(["weight", "bias"])
    assert torch.allclose(weight, model.weight.detach() - 0.5)
    assert torch.allclose(bias, model.bias.detach() - 0.5)

    target = torch.nn.Linear(3, 2)
    client.pull(target.named_parameters())  # straight into a model's parameters
    assert torch.equal(target.weight.detach(), weight) and torch.equal(target.bias.detach(), bias)
    with pytest.raises(shoal.Error) as error:
        client.pull({"weight": torch.zeros(3, 2)})
    assert "'weight'" in str(error.value) and "[3, 2]" in str(error.value)

    # A push and the next pull in one round trip.
    step = client.apply_and_pull({"weight": torch.ones(2, 3), "bias": torch.ones(2)}, target.named_parameters())
    assert step == 2
    weight, bias = client.read()
    assert torch.allclose(weight, model.weight.detach() - 1.0)
    assert torch.equal(target.weight.detach(), weight) and torch.equal(target.bias.detach(), bias)
    with pytest.raises(shoal.Error) as error:  # a destination of another shape: named, nothing applied
        client.apply_and_pull({"weight": torch.ones(2, 3)}, {"weight": torch.zeros(3, 2)})
    assert "'weight'" in str(error.value) and "[3, 2]" in str(error.value)
    assert torch.equal(client.read(["weight"])[0], weight)
    client.assign({"weight": model.weight.detach() - 0.5, "bias": model.bias.detach() - 0.5})
    weight, bias = client.read()

    with pytest.raises(shoal.Error) as error:  # the wrong dtype: named, nothing applied
        client.apply({"weight": torch.ones(2, 3, dtype=torch.float64)})
    assert "float64" in str(error.value)
    assert torch.allclose(client.read(["weight"])[0], model.weight.detach() - 0.5)
    with pytest.raises(shoal.Error):
        client.apply({"weight": torch.ones(4)})

    # While one thread waits in shoal, others run Python.
    ticks = []
    waiter = threading.Thread(target=lambda: server.wait(1.0))
    waiter.start()
    while waiter.is_alive():
        ticks.append(1)
        time.sleep(0.01)
    assert len(ticks) > 5  # a held GIL would allow one or two

    client.shutdown_servers()
    assert server.wait(10.0)


def test_client_pulls_and_pushes_embedding_rows_by_id():
    servers = [shoal.Server(), shoal.Server()]
    addresses = [server.address for server in servers]
    client = shoal.Client({"ps": addresses}, {})  # a table needs no dense variable
    client.create_table("emb", rows=100, dim=4, optimizer={"kind": "sgd", "learning_rate": 1.0})
    client.create_table("emb", rows=100, dim=4, optimizer={"kind": "sgd", "learning_rate": 1.0})  # the same: kept
    rows = client.pull_rows("emb", torch.tensor([3, 3, 8]))  # ids on both ps tasks, one repeated
    assert rows.shape == (3, 4) and rows.dtype == torch.float32
    assert torch.equal(rows[0], rows[1]) and not torch.equal(rows[0], rows[2])
    assert rows.abs().max() <= 0.05  # made on the ps from (seed, id)

    # Repeated ids' gradient rows are summed: row 3 moves by 2 x the learning rate.
    client.push_rows("emb", torch.tensor([3, 3]), torch.ones(2, 4))
    after = client.pull_rows("emb", torch.tensor([3, 8]))
    assert torch.allclose(after[0], rows[0] - 2.0) and torch.equal(after[1], rows[2])

    # Bad input names what is wrong and changes nothing.
    for call, words in [
        (lambda: client.pull_rows("emb", torch.tensor([100])), ["emb", "100"]),
        (lambda: client.push_rows("emb", torch.tensor([5]), torch.ones(2, 4)), ["emb"]),
        (lambda: client.push_rows("emb", torch.tensor([-1]), torch.ones(1, 4)), ["emb", "-1"]),
        (lambda: client.push_rows("emb", torch.tensor([3.0]), torch.ones(1, 4)), ["emb", "int64"]),
        (lambda: client.push_rows("emb", torch.tensor([3]), torch.ones(1, 4, dtype=torch.float64)), ["float64"]),
        (lambda: client.pull_rows("nope", torch.tensor([1])), ["nope"]),
        (lambda: client.create_table("emb", rows=100, dim=5), ["emb"]),
        (lambda: client.create_table("other", rows=10, dim=4, optimizer={"kind": "adam"}), ["adam"]),
        (lambda: client.create_table("other", rows=10, dim=4, optimizer={"knid": "sgd"}), ["knid"]),
    ]:
        with pytest.raises(shoal.Error) as error:
            call()
        for word in words:
            assert word in str(error.value), (words, str(error.value))
    assert torch.equal(client.pull_rows("emb", torch.tensor([3, 8])), after)

    # A dynamic table takes any int64 id and makes its row on the first push.
    client.create_table("dyn", dim=2, optimizer={"kind": "adagrad", "learning_rate": 0.1})
    big = torch.tensor([2**40 + 7])
    first = client.pull_rows("dyn", big)
    client.push_rows("dyn", big, torch.ones(1, 2))
    assert (client.pull_rows("dyn", big) < first).all()
    # ... up to max_rows over all ps tasks (each its share): a full one admits no new id.
    client.create_table("capped", dim=2, max_rows=2, optimizer={"kind": "sgd", "learning_rate": 1.0})
    ids = torch.tensor([0, 2, 1, 3])  # 0 and 2 on ps 0, 1 and 3 on ps 1: one row each
    initial = client.pull_rows("capped", ids)
    client.push_rows("capped", ids, torch.ones(4, 2))
    moved = (client.pull_rows("capped", ids) != initial).all(dim=1).tolist()
    assert moved[0] != moved[1] and moved[2] != moved[3], moved  # one row made on each ps
    # With evict_when_full the row no push touched for longest makes room instead.
    client.create_table("lru", dim=2, max_rows=2, evict_when_full=True, optimizer={"kind": "sgd", "learning_rate": 1.0})
    ids = torch.tensor([0, 1, 2])
    initial = client.pull_rows("lru", ids)
    for push in ([0], [1], [2]):  # 0 and 2 share ps 0's one row: 2 takes 0's
        client.push_rows("lru", torch.tensor(push), torch.ones(1, 2))
    assert torch.equal(client.pull_rows("lru", ids), initial - torch.tensor([[0.0], [1.0], [1.0]]))
    assert client.table_stats("lru") == {"rows_held": 2, "ids_refused": 0, "rows_evicted": 1}
    # eviction="lfu": the row pushes touched least often goes (0, pushed twice
    # but not lately, stays; lru would drop it).
    client.create_table("lfu", dim=2, max_rows=4, evict_when_full=True, eviction="lfu",
                        optimizer={"kind": "sgd", "learning_rate": 1.0})
    initial = client.pull_rows("lfu", torch.tensor([0, 2, 4]))
    for push in ([0], [0], [2], [4]):  # all on ps 0, whose share is two rows
        client.push_rows("lfu", torch.tensor(push), torch.ones(1, 2))
    assert torch.equal(client.pull_rows("lfu", torch.tensor([0, 2, 4])), initial - torch.tensor([[2.0], [0.0], [1.0]]))
    with pytest.raises(shoal.Error, match="eviction 'mru' is not lru or lfu"):
        client.create_table("bad", dim=2, max_rows=2, evict_when_full=True, eviction="mru")
    with pytest.raises(shoal.Error, match="eviction 'lfu' chooses what a full table evicts: set evict_when_full"):
        client.create_table("bad", dim=2, max_rows=2, eviction="lfu")
    assert client.table_stats("capped") == {"rows_held": 2, "ids_refused": 2, "rows_evicted": 0}
    client.shutdown_servers()
    del servers


def test_embedding_layers_pull_by_id_and_push_their_gradients_on_backward():
    servers = [shoal.Server(), shoal.Server()]
    addresses = [server.address for server in servers]
    client = shoal.Client({"ps": addresses}, {})
    client.create_table("emb", rows=100, dim=4, optimizer={"kind": "sgd", "learning_rate": 1.0})
    every = torch.arange(100)
    start = client.pull_rows("emb", every)

    # shoal.Embedding: a row per id, shaped like the ids; backward pushes each
    # distinct id's gradient, summed over its uses (id 3 is used twice here).
    embedding = shoal.Embedding(client, "emb")
    ids = torch.tensor([[3, 8], [3, 51]], dtype=torch.int32)
    out = embedding(ids)
    assert out.shape == (2, 2, 4) and torch.equal(out[0, 0], start[3]) and torch.equal(out[1, 1], start[51])
    out.sum().backward()
    moved = start - client.pull_rows("emb", every)
    expected = torch.zeros(100, 4)
    expected[[3, 8, 51]] = torch.tensor([[2.0], [1.0], [1.0]])
    assert torch.allclose(moved, expected), moved[[3, 8, 51]]

    # shoal.EmbeddingBag pools as torch's embedding_bag does over the same rows,
    # for ids [batch, bag] and for ids with offsets; the gradient follows the pooling.
    before = client.pull_rows("emb", every)
    for mode in ("sum", "mean"):
        bag = shoal.EmbeddingBag(client, "emb", mode=mode)
        with torch.no_grad():  # evaluation: nothing is pushed
            pooled = bag(torch.tensor([[1, 2, 2], [7, 1, 9]]))
            flat = bag(torch.tensor([1, 2, 2, 7, 1]), torch.tensor([0, 3]))
        reference = torch.nn.functional.embedding_bag(torch.tensor([[1, 2, 2], [7, 1, 9]]), before, mode=mode)
        assert torch.allclose(pooled, reference)
        assert torch.allclose(flat, torch.nn.functional.embedding_bag(
            torch.tensor([1, 2, 2, 7, 1]), before, torch.tensor([0, 3]), mode=mode))
    assert torch.equal(client.pull_rows("emb", every), before)
    mean = shoal.EmbeddingBag(client, "emb", mode="mean")
    mean(torch.tensor([1, 2, 2, 7, 1]), torch.tensor([0, 3])).sum().backward()  # bags {1, 2, 2} and {7, 1}
    moved = before - client.pull_rows("emb", every)
    expected = torch.zeros(100, 4)
    expected[[1, 2, 7]] = torch.tensor([[1 / 3 + 1 / 2], [2 / 3], [1 / 2]])
    assert torch.allclose(moved, expected), moved[[1, 2, 7]]

    # Padding (-1, outside the table) is neither pulled nor pushed: its row is
    # zeros, and a mean leaves it out. Weights per id scale a sum.
    before = client.pull_rows("emb", every)
    padded = shoal.Embedding(client, "emb", padding_idx=-1)
    out = padded(torch.tensor([[4, -1]]))
    assert torch.equal(out[0, 0], before[4]) and torch.equal(out[0, 1], torch.zeros(4))
    out.sum().backward()
    bags = torch.tensor([[1, 2, -1], [7, -1, -1]])
    padded_mean = shoal.EmbeddingBag(client, "emb", mode="mean", padding_idx=-1)
    pooled = padded_mean(bags)
    assert torch.allclose(pooled, torch.stack([(before[1] + before[2]) / 2, before[7]]))
    pooled.sum().backward()
    moved = before - client.pull_rows("emb", every)
    expected = torch.zeros(100, 4)
    expected[[1, 2, 4, 7]] = torch.tensor([[0.5], [0.5], [1.0], [1.0]])
    assert torch.allclose(moved, expected), moved[[1, 2, 4, 7]]
    weights = torch.tensor([[0.5, 2.0, 1.0], [3.0, 1.0, 1.0]])
    with torch.no_grad():
        weighted = shoal.EmbeddingBag(client, "emb", padding_idx=-1)(bags, per_sample_weights=weights)
    after = client.pull_rows("emb", every)
    assert torch.allclose(weighted, torch.stack([0.5 * after[1] + 2.0 * after[2], 3.0 * after[7]]))

    # shoal.train scripts its model: a table layer is named, not half-scripted.
    with pytest.raises(shoal.Error) as error:
        shoal.train(torch.nn.Sequential(embedding, torch.nn.Flatten()))
    assert "'0' is a shoal.Embedding" in str(error.value), str(error.value)

    # An empty batch has the table's width; bad input is named and changes nothing.
    assert embedding(torch.zeros(0, 2, dtype=torch.int64)).shape == (0, 2, 4)
    after = client.pull_rows("emb", every)
    for call, error, words in [
        (lambda: embedding(torch.tensor([1.0])), TypeError, ["emb", "integer"]),
        (lambda: embedding(torch.tensor([100])), shoal.Error, ["emb", "100"]),
        (lambda: shoal.Embedding(client, "nope")(torch.tensor([1])), shoal.Error, ["nope"]),
        (lambda: shoal.EmbeddingBag(client, "emb", mode="max"), ValueError, ["max"]),
        (lambda: mean(torch.tensor([1, 2])), ValueError, ["offsets"]),
        (lambda: mean(torch.tensor([[1, 2]]), torch.tensor([0])), ValueError, ["offsets"]),
    ]:
        with pytest.raises(error) as raised:
            call()
        for word in words:
            assert word in str(raised.value), (words, str(raised.value))
    assert torch.equal(client.pull_rows("emb", every), after)
    client.shutdown_servers()
    del servers


def test_client_saves_and_restores_variables_slots_and_tables(tmp_path):
    servers = [shoal.Server(checkpoint_dir=tmp_path), shoal.Server(checkpoint_dir=tmp_path)]
    addresses = [server.address for server in servers]
    client = shoal.Client({"ps": addresses}, {"w": [4], "b": [2]})
    assert client.restore(tmp_path) is None  # nothing saved yet
    client.create({"w": torch.zeros(4), "b": torch.zeros(2)},
                  optimizer={"kind": "momentum", "learning_rate": 1.0, "momentum": 0.5})
    client.create_table("emb", rows=10, dim=2, optimizer={"kind": "adagrad", "learning_rate": 0.5})
    ones = {"w": torch.ones(4), "b": torch.ones(2)}
    ids = torch.arange(10)
    client.apply(ones)
    client.push_rows("emb", torch.tensor([1, 2, 7]), torch.ones(3, 2))
    saved_rows = client.pull_rows("emb", ids)
    path = client.save(tmp_path)  # at the global step, 1
    assert path.endswith("ckpt-1"), path

    # Training goes on, then the checkpoint comes back: values, the momentum
    # buffer (the next apply moves by 1.5 again) and the table's rows.
    client.apply(ones)
    client.push_rows("emb", ids, torch.ones(10, 2))
    assert client.restore(tmp_path) == 1
    assert torch.equal(client.read(["w"])[0], torch.full((4,), -1.0))
    assert torch.equal(client.pull_rows("emb", ids), saved_rows)
    assert client.apply(ones) == 2  # the global step came back too
    assert torch.equal(client.read(["w"])[0], torch.full((4,), -2.5))  # -1, then -(1 + 0.5)
    client.shutdown_servers()
    del servers

    # Onto another number of ps tasks: one, holding what two held.
    server = shoal.Server(checkpoint_dir=tmp_path)
    address = server.address
    other = shoal.Client({"ps": [address]}, {"w": [4], "b": [2]})
    other.create({"w": torch.zeros(4), "b": torch.zeros(2)},
                 optimizer={"kind": "momentum", "learning_rate": 1.0, "momentum": 0.5})
    other.create_table("emb", rows=10, dim=2, optimizer={"kind": "adagrad", "learning_rate": 0.5})
    assert other.restore(tmp_path) == 1
    assert torch.equal(other.pull_rows("emb", ids), saved_rows)
    assert torch.equal(other.read(["b"])[0], torch.full((2,), -1.0))

    # A variable the checkpoint lacks, or a variable not yet made: named, and nothing changes.
    before = other.read(["w"])[0]
    for variables, words in [({"w": [4], "v": [3]}, ["'v'"]), ({"w": [5]}, ["w", "shape"])]:
        with pytest.raises(shoal.Error) as error:
            shoal.Client({"ps": [address]}, variables).restore(tmp_path)
        for word in words:
            assert word in str(error.value), (words, str(error.value))
    assert torch.equal(other.read(["w"])[0], before)
    # A server without a checkpoint directory refuses to write one.
    bare = shoal.Server()
    bare_address = bare.address
    bare_client = shoal.Client({"ps": [bare_address]}, {"w": [4]})
    bare_client.create({"w": torch.zeros(4)})
    with pytest.raises(shoal.Error) as error:
        bare_client.save(tmp_path / "elsewhere")
    assert "checkpoint directory" in str(error.value), str(error.value)
    other.shutdown_servers()
    bare_client.shutdown_servers()
    del server, bare


def test_client_reaches_a_shoal_server_process_over_grpc(tmp_path):
    address, worker = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"ps": [address], "worker": [worker]}))
    ps = subprocess.Popen([os.environ["SHOAL_BINARY"], "server", "--cluster", str(cluster), "--task", "ps:0"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        client = shoal.Client(str(cluster), {"w": [4]})
        client.create({"w": torch.zeros(4)}, optimizer={"kind": "momentum", "learning_rate": 1.0, "momentum": 0.5})
        client.apply({"w": torch.ones(4)})
        client.apply({"w": torch.ones(4)})
        assert torch.allclose(client.read()[0], torch.full((4,), -2.5))  # -1, then -(1 + 0.5)
        with pytest.raises(shoal.Error) as error:
            client.apply({"w": torch.ones(4, dtype=torch.float64)})
        assert "float64" in str(error.value)
        with pytest.raises(shoal.Error) as error:
            shoal.Client(str(cluster), {"w": [4]}, rpc_timeout_s=5).read(["missing"])
        assert "missing" in str(error.value)
        client.shutdown_servers()
        assert ps.wait(timeout=30) == 0
    finally:
        ps.kill()
        # Shown when the test fails: how the server ended and what it said.
        print(f"ps exit status {ps.wait()}; its stderr:\n{ps.stderr.read()}")


def test_ctrl_c_stops_the_job_cleanly():
    script = textwrap.dedent("""
        import json, sys
        import torch
        import shoal
        net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
        before = net[1].weight.detach().clone()
        try:
            # Far more than the test waits for, on any machine: the job ends by the signal.
            shoal.train(net, {"training": {"epochs": 100000}}, progress=True)
            print("finished")
        except KeyboardInterrupt as stop:
            stop.report["module_trained"] = not torch.equal(net[1].weight, before)
            print(json.dumps(stop.report))
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=os.environ.copy(), text=True)
    # Off a terminal the progress line comes every 5 s of training: the
    # first one says the job is training.
    try:
        deadline = time.monotonic() + 120
        for line in child.stderr:
            if line.startswith("step ") or time.monotonic() > deadline:
                break
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["global_step"] > 0
    assert report["stop_reason"].startswith("stopped by signal 2"), (report["stop_reason"], err)
    assert report["test_accuracy"] > 0.5  # the chief evaluated as at a normal end
    assert report["module_trained"]  # and the module holds what was trained so far


EXAMPLES = os.path.join(os.environ.get("SHOAL_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                        "examples", "python")


def run_example(name, *args):
    result = subprocess.run([sys.executable, os.path.join(EXAMPLES, name), *args], capture_output=True, text=True,
                            timeout=600, env=os.environ.copy())
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_cnn_example_trains_its_own_cnn_asynchronously():
    out = run_example("train_cnn.py", "--max_steps", "300")
    accuracy = float(out.split("test accuracy ")[1].rstrip("%\n"))
    assert accuracy > 65, out


def test_the_embedding_example_learns_from_its_table_on_the_ps():
    out = run_example("embedding_loop.py", "--steps", "300")
    found = re.search(r"test AUC ([0-9.]+) \(the planted model's ([0-9.]+)\)", out)
    reached, planted = float(found[1]), float(found[2])
    assert reached > planted - 0.05, out


def test_the_client_example_trains_through_the_parameter_server():
    out = run_example("client_loop.py", "--steps", "300")
    losses = [float(line.split("loss ")[1]) for line in out.splitlines() if line.startswith("step ")]
    assert losses[-1] < losses[0] * 0.6, out


def test_the_client_example_resumes_from_its_checkpoint(tmp_path):
    first = run_example("client_loop.py", "--steps", "150", "--checkpoint_dir", str(tmp_path))
    assert "no checkpoint yet" in first and sorted(os.listdir(tmp_path)) == ["ckpt-100", "ckpt-150"], first
    second = run_example("client_loop.py", "--steps", "300", "--checkpoint_dir", str(tmp_path))
    assert "resumed at step 150" in second, second
    steps = [int(line.split(":")[0].split()[1]) for line in second.splitlines() if line.startswith("step ")]
    assert steps == [200, 299], second  # only the steps left
    first_loss, resumed_loss = (float(out.split("loss ")[1].split()[0]) for out in (first, second))
    assert resumed_loss < first_loss * 0.8, (first, second)  # the trained weights came back
    assert "ckpt-300" in os.listdir(tmp_path)


def test_the_train_and_use_example_scores_the_module_and_its_file_as_the_report(tmp_path):
    out = run_example("train_and_use.py", "--epochs", "1", "--run_dir", str(tmp_path))
    figures = [float(x) for x in re.findall(r"([0-9.]+)%", out)]
    assert len(figures) == 3, out
    reported, plain, served = figures
    assert reported > 75, out
    assert abs(plain - reported) <= 0.1 and abs(served - reported) <= 0.1, out
